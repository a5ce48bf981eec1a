"""Old log rows stored short (stash/storage/memfile/short_rows.py): the codec
against libsodium itself, every bucket of both one-size layouts, every
release's fixture compacted with its history intact (pins and heads from
before still hold), and the attacks on the new pieces done to the files
on disk: a byte of a short row changed, two rows swapped, a tail changed,
cut or deleted, the full row put back. Real files, both ciphers."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stash.core.errors import Damaged, StashError
from stash.crypto import aead
from stash.service.access import Vault
from stash.storage import formats
from stash.storage.disk_errors import DB_ERRORS
from stash.storage.formats import PAGE_BYTES
from stash.storage.memfile import short_rows
from tests.fixtures import make_release1, make_release2
from tests.support.files.raw import file_key, open_raw, raw_memory_file
from tests.support.installed import OUTSIDE
from tests.support.ops.compact import old_store
from tests.support.ops.verify import line_of, run

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


def one_size_row(key: bytes, text: bytes, full: int, writer: int = 7) -> tuple[bytes, bytes]:
    plain = aead.pad(text, full - short_rows.LAST_BYTES) + writer.to_bytes(short_rows.LAST_BYTES, "big")
    return aead.seal(key, plain, b"stash/v1|u|log|3"), plain


# ------------------------------------------------------------------ the codec


def test_the_key_stream_is_what_the_cipher_adds_to_zeros() -> None:
    key = os.urandom(aead.KEY_BYTES)
    sealed = aead.seal(key, bytes(300), b"any associated data")
    nonce = sealed[: aead.NONCE_BYTES]
    assert aead.keystream(key, nonce, 300) == sealed[aead.NONCE_BYTES : aead.NONCE_BYTES + 300]
    assert aead.keystream(key, nonce, 17) == sealed[aead.NONCE_BYTES : aead.NONCE_BYTES + 17]
    assert aead.keystream(os.urandom(aead.KEY_BYTES), nonce, 300) != sealed[aead.NONCE_BYTES :][:300]


@pytest.mark.parametrize("full", sorted(short_rows.CODES.values()))
def test_every_text_length_shortens_to_its_bucket_and_rebuilds_to_the_same_bytes(full: int) -> None:
    key = os.urandom(aead.KEY_BYTES)
    lengths = set()
    for n in range(0, full - 2 - short_rows.LAST_BYTES + 1):
        sealed, plain = one_size_row(key, bytes([65 + n % 26]) * n, full)
        short = short_rows.shorten(sealed, plain)
        padded = -(-(2 + n + short_rows.LAST_BYTES) // formats.BUCKET_BYTES) * formats.BUCKET_BYTES
        if padded >= full:  # the text reaches the last bucket: nothing to leave out
            assert short is None, n
            continue
        assert short is not None and len(short) == padded + 41 and short_rows.is_short(short), n
        assert not short_rows.is_short(sealed)
        assert short_rows.expand(short, key=key) == sealed
        assert short_rows.expand(short, tail=short_rows.tail_of(short, key)) == sealed
        assert aead.open_sealed(key, short_rows.expand(short, key=key), b"stash/v1|u|log|3") == plain
        lengths.add(len(short))
    # No short row has the length of a full one, of any layout.
    full_lengths = {n + aead.OVERHEAD for n in formats.ROW_BUCKETS} | short_rows.FULL_SEALED
    assert lengths and lengths.isdisjoint(full_lengths)


def test_a_row_whose_padding_is_not_zeros_stays_whole() -> None:
    key = os.urandom(aead.KEY_BYTES)
    sealed, plain = one_size_row(key, b"2026-01-02 text", 312)
    odd = plain[:100] + b"\x01" + plain[101:]
    assert short_rows.shorten(aead.seal(key, odd, b"x"), odd) is None
    assert short_rows.shorten(sealed[:-1], plain) is None  # not a one-size row's length


def test_a_short_row_changed_anywhere_does_not_open() -> None:
    """Every byte flipped in turn: the rebuilt value never authenticates
    (or the layout is refused outright), so it is never served."""
    key = os.urandom(aead.KEY_BYTES)
    aad = b"stash/v1|u|log|3"
    sealed, plain = one_size_row(key, b"2026-01-02 a memory of some length", 312)
    short = short_rows.shorten(sealed, plain)
    assert short is not None
    tail = short_rows.tail_of(short, key)
    for k in range(len(short)):
        bad = short[:k] + bytes([short[k] ^ 0x10]) + short[k + 1 :]
        for how in ({"key": key}, {"tail": tail}):
            try:
                rebuilt = short_rows.expand(bad, **how)
            except Damaged:
                continue
            with pytest.raises(aead.Unsealable):
                aead.open_sealed(key, rebuilt, aad)
    for k in range(len(tail)):
        bad_tail = tail[:k] + bytes([tail[k] ^ 1]) + tail[k + 1 :]
        with pytest.raises(aead.Unsealable):
            aead.open_sealed(key, short_rows.expand(short, tail=bad_tail), aad)
    with pytest.raises(Damaged):
        short_rows.expand(short, tail=tail[:-1])
    with pytest.raises(Damaged):
        short_rows.expand(short)  # neither key nor tail


# ------------------------------------------------------------------ stores


def compact(capsys, monkeypatch, data: Path, token: str) -> str:
    from stash.cli.operate import compact_main

    monkeypatch.setenv("STASH_TOKEN", token)
    code = compact_main(["--data", str(data)])
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def stored_rows(folder: Path, master: bytes, cipher: str, page: int = PAGE_BYTES) -> list[tuple[int, bytes]]:
    with raw_memory_file(folder, master, cipher, page) as conn:
        return conn.execute("SELECT id, sealed FROM log ORDER BY id").fetchall()


def put_rows(folder: Path, master: bytes, cipher: str, rows: dict[int, bytes]) -> None:
    """Rows written over with the server stopped, as an attacker holding the
    file and its key would (the guard triggers dropped and put back)."""
    with raw_memory_file(folder, master, cipher) as conn:
        conn.execute("DROP TRIGGER IF EXISTS log_no_update")
        for i, row in rows.items():
            conn.execute("UPDATE log SET sealed = ? WHERE id = ?", (row, i))


@pytest.mark.parametrize("release", ["release1", "release2"])
def test_every_release_compacts_with_its_history_and_its_pins_intact(
    capsys, monkeypatch, tmp_path: Path, release: str
) -> None:
    maker = make_release1 if release == "release1" else make_release2
    data = tmp_path / release
    shutil.copytree(FIXTURES / release, data)
    owner = maker.token_of("owner") if hasattr(maker, "token_of") else None
    if owner is None:
        from stash.crypto import tokens

        body = f"stash1_{maker.USER_ID}_{tokens._b62(int.from_bytes(maker.secret_of('owner'), 'big'), 43)}"
        owner = body + tokens._checksum(body)
    vault = Vault(data)
    with vault.session(owner, "read") as s:
        T = s.open_memory().mf.count()
        before = s.open_memory().mf.memories(0, T)
        pin = s.open_memory().mf.pinned_head(current=True)
        master = bytes(s.master)
        folder = s.files.folder
        cipher, page = s.cipher, s.page_bytes
    full = stored_rows(folder, master, cipher, page)
    assert {len(r) for _, r in full} <= short_rows.FULL_SEALED
    out = compact(capsys, monkeypatch, data, owner)
    now = stored_rows(folder, master, cipher, page)
    short = {i for i, r in now if short_rows.is_short(r)}
    assert f"{len(short)} rows stored short" in out, out
    for i, row in now:  # whole only where it must be: its key erased, or its text in the last bucket
        if i not in short:
            _, date, text = before[i]
            last = len(row) - aead.OVERHEAD
            assert text == "[erased]" or formats.bucket(2 + len(f"{date} {text}".encode()) + 4, last) == last, i
    assert sum(map(len, (r for _, r in now))) < 0.7 * sum(map(len, (r for _, r in full)))
    code, text = run(capsys, data, owner)
    assert code == 0 and "rows stored short" in line_of(text, maker.USER_ID), text
    with vault.session(owner, "full", pin=pin) as s:  # a pin taken before still holds
        assert s.open_memory().mf.memories(0, T) == before
        assert s.open_memory().mf.recompute_head()[0] == s.open_memory().mf.head
        s.open_memory().erase([0, T - 1])
        s.open_memory().note("written after the compaction")
    with vault.session(owner, "read", pin=pin) as s:
        got = s.open_memory().mf.memories(0, T + 1)
        assert [m[2] for m in got[1 : T - 1]] == [m[2] for m in before[1 : T - 1]]
        assert got[0][2] == got[T - 1][2] == "[erased]" and got[T][2] == "written after the compaction"
    code, text = run(capsys, data, owner)
    assert code == 0, text


@pytest.fixture
def compacted(capsys, monkeypatch, tmp_path: Path, file_cipher: str):
    data = tmp_path / "data"
    vault, token = old_store(monkeypatch, data, file_cipher, 300)
    with vault.session(token, "read") as s:
        full = dict(s.open_memory().mf.conn.execute("SELECT id, sealed FROM log"))
        pin = s.open_memory().mf.pinned_head(current=True)
        master, folder = bytes(s.master), s.files.folder
    compact(capsys, monkeypatch, data, token)
    return data, vault, token, full, pin, master, folder, file_cipher


def refused_everywhere(capsys, data: Path, vault: Vault, token: str, i: int) -> None:
    """Memory #i is not served, and stash verify fails the store."""
    with pytest.raises(StashError) as e, vault.session(token, "read") as s:
        s.open_memory().mf.memory(i)
    assert e.value.code.startswith("store.")
    code, text = run(capsys, data, token)
    assert code != 0, text


def test_a_short_row_edited_on_disk_is_refused(capsys, compacted) -> None:
    data, vault, token, _, _, master, folder, cipher = compacted
    rows = dict(stored_rows(folder, master, cipher))
    for k in (0, 1 + aead.NONCE_BYTES, len(rows[5]) - 20, len(rows[5]) - 1):  # code, text, last bytes, tag
        row = rows[5]
        put_rows(folder, master, cipher, {5: row[:k] + bytes([row[k] ^ 4]) + row[k + 1 :]})
        refused_everywhere(capsys, data, vault, token, 5)
    put_rows(folder, master, cipher, {5: rows[5]})
    code, text = run(capsys, data, token)
    assert code == 0, text


def test_two_short_rows_swapped_or_one_moved_are_refused(capsys, compacted) -> None:
    data, vault, token, _, _, master, folder, cipher = compacted
    rows = dict(stored_rows(folder, master, cipher))
    same = [i for i in rows if i != 10 and len(rows[i]) == len(rows[10])]
    put_rows(folder, master, cipher, {10: rows[same[0]], same[0]: rows[10]})
    refused_everywhere(capsys, data, vault, token, 10)
    put_rows(folder, master, cipher, {10: rows[10], same[0]: rows[same[0]]})
    code, text = run(capsys, data, token)
    assert code == 0, text


def test_the_full_row_put_back_is_the_same_row(capsys, compacted) -> None:
    """The two forms are one sealed value: a row of the copy from before the
    compaction, put back, opens to the same memory and the chain agrees."""
    data, vault, token, full, pin, master, folder, cipher = compacted
    put_rows(folder, master, cipher, {7: full[7], 299: full[299]})
    with vault.session(token, "read", pin=pin) as s:
        assert s.open_memory().mf.memory(7)[2] == "memory 7 " + "w" * 7
        assert s.open_memory().mf.recompute_head()[0].digest == pin.digest
    code, text = run(capsys, data, token)
    assert code == 0, text


def test_an_erased_short_rows_tail_changed_cut_or_deleted_fails_verify(capsys, compacted) -> None:
    data, vault, token, _, _, master, folder, cipher = compacted
    with vault.session(token, "owner") as s:
        s.open_memory().erase([20, 299])
    with raw_memory_file(folder, master, cipher) as conn:
        tails = dict(conn.execute("SELECT id, tail FROM log_tails"))
    assert set(tails) == {20, 299}
    code, text = run(capsys, data, token)
    assert code == 0, text
    for bad in (tails[20][:-1], bytes([tails[20][0] ^ 1]) + tails[20][1:], None):
        with raw_memory_file(folder, master, cipher) as conn:
            if bad is None:
                conn.execute("DELETE FROM log_tails WHERE id = 20")
            else:
                conn.execute("UPDATE log_tails SET tail = ? WHERE id = 20", (bad,))
        code, text = run(capsys, data, token)
        assert code != 0, text
        with vault.session(token, "read") as s:  # what it does not need is still served
            assert s.open_memory().mf.memory(20)[2] == "[erased]" and s.open_memory().mf.memory(21)[2].startswith(
                "memory 21"
            )
            try:  # the whole chain, as verify walks it, does not come out at the recorded head
                walked = s.open_memory().mf.recompute_head()[0]
            except Damaged:
                walked = None
            assert walked != s.open_memory().mf.head
    with raw_memory_file(folder, master, cipher) as conn:
        conn.execute("INSERT OR REPLACE INTO log_tails(id, tail) VALUES (20, ?)", (tails[20],))
    code, text = run(capsys, data, token)
    assert code == 0, text
    # The newest memory erased: every open checks the last row, from its tail.
    with vault.session(token, "read") as s:
        assert s.open_memory().mf.memory(299)[2] == "[erased]"


def test_kill_9_while_rows_are_stored_short_leaves_a_store_that_verifies(capsys, monkeypatch, tmp_path: Path) -> None:
    """The kill lands once a reader of its own has seen the rows half moved;
    the store opens and verifies with rows of both forms, and a rerun ends
    with every row short."""
    data = tmp_path / "data"
    vault, token = old_store(monkeypatch, data, "sqlcipher", 8_192, napped=False)
    with vault.session(token, "read") as s:
        master, folder = bytes(s.master), s.files.folder
        want = s.open_memory().mf.memories(0, 8_192)
        pin = s.open_memory().mf.pinned_head(current=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "stash", "compact", "--data", str(data)],
        cwd=OUTSIDE,
        env={**os.environ, "STASH_TOKEN": token},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # The reader looks while the compact is stopped, so the state it sees cannot move on before the kill,
    # and the compact runs only a few ms between looks: it cannot cross a whole slice unseen, however
    # loaded the machine is.
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        proc.send_signal(signal.SIGSTOP)
        if 0 < _short_count(folder, master) < 8_192:
            break
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    moved = _short_count(folder, master)
    assert 0 < moved < 8_192, moved
    with vault.session(token, "read", pin=pin) as s:
        assert s.open_memory().mf.memories(0, 8_192) == want
    code, text = run(capsys, data, token)
    assert code == 0, text
    compact(capsys, monkeypatch, data, token)
    assert _short_count(folder, master) == 8_192
    with vault.session(token, "read", pin=pin) as s:
        assert s.open_memory().mf.memories(0, 8_192) == want


def _short_count(folder: Path, master: bytes) -> int:
    conn = open_raw(folder / "memory.db", file_key(master))
    try:
        mod = formats.SHORT_ROW_OVERHEAD % formats.BUCKET_BYTES
        return int(
            conn.execute(f"SELECT total(length(sealed) % {formats.BUCKET_BYTES} = {mod}) FROM log").fetchone()[0]
        )
    except DB_ERRORS:  # busy for an instant while it commits a slice
        return -1
    finally:
        conn.close()
