"""``stash compact`` (stash/service/ops/compact.py): a store whose summaries were
padded to one size, as every release before "rows in buckets" wrote them,
has them re-sealed to their buckets and its memory file rewritten smaller;
each summary keeps its text, writer and state version (so a copy from
before a forget is still refused after it), the log's rows keep their
bytes, and a kill -9 at any instant of a real ``stash compact`` process
leaves a store that opens, verifies, and is finished by running it again.
Real files, both ciphers."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stash.core.errors import Damaged, RolledBack
from stash.crypto import aead
from stash.service.access import Vault
from stash.storage import formats
from stash.storage.disk_errors import DB_ERRORS
from stash.storage.memfile import short_rows
from tests.support.files.raw import file_key, open_raw, raw_memory_file
from tests.support.installed import OUTSIDE
from tests.support.ops.compact import ONE_SIZE, old_store, summaries
from tests.support.ops.verify import line_of, run

REPO = Path(__file__).resolve().parents[2]


def folder_of(vault: Vault, token: str) -> Path:
    with vault.session(token, "read") as s:
        return s.files.folder


def compact(capsys, monkeypatch, data: Path, token: str) -> tuple[int, str]:
    from stash.cli.operate import compact_main

    monkeypatch.setenv("STASH_TOKEN", token)
    code = compact_main(["--data", str(data)])
    return code, capsys.readouterr().out


def test_compact_moves_summaries_to_their_buckets_and_keeps_what_they_say(
    capsys, monkeypatch, tmp_path: Path, file_cipher: str
) -> None:
    data = tmp_path / "data"
    vault, token = old_store(monkeypatch, data, file_cipher, 300)
    folder = folder_of(vault, token)
    before = summaries(vault, token)
    assert {v[3] for v in before.values()} <= ONE_SIZE
    with vault.session(token, "read") as s:
        wake = s.open_memory().wake()
        zoom = s.open_memory().zoom("0-255")
        key = bytes(s.master)
    with raw_memory_file(folder, key, file_cipher) as conn:
        log = conn.execute("SELECT id, sealed FROM log ORDER BY id").fetchall()
    size = (folder / "memory.db").stat().st_size
    (folder / "recall.db").write_bytes(b"a cache of pieces of before")
    code, out = compact(capsys, monkeypatch, data, token)
    assert code == 0, out
    assert f"compacted  {len(before)} summaries re-sealed, {len(log)} rows stored short" in out
    assert not (folder / "recall.db").exists()  # rebuilt, compressed, by the next recall
    after = summaries(vault, token)
    assert after.keys() == before.keys()
    for block, (version, writer, text, length) in after.items():
        assert (version, writer, text) == before[block][:3], block
        assert length - aead.OVERHEAD in formats.SUMMARY_BUCKETS and length < before[block][3]
    with vault.session(token, "read") as s:
        # The same answers; the state version moved on, as the tree of row
        # digests holds the summaries' new bytes (the log head did not).
        now = s.open_memory().wake()
        assert now["head"]["state"] > wake["head"]["state"] and now["head"]["count"] == wake["head"]["count"]
        assert {**now, "head": None} == {**wake, "head": None} and s.open_memory().zoom("0-255") == zoom
    with raw_memory_file(folder, key, file_cipher) as conn:
        stored = conn.execute("SELECT id, sealed FROM log ORDER BY id").fetchall()
    assert [i for i, _ in stored] == [i for i, _ in log]
    assert all(short_rows.is_short(row) and len(row) < len(old) for (_, row), (_, old) in zip(stored, log))
    with vault.session(token, "read") as s:  # each rebuilt, from its memory's key, to the very bytes it was
        assert list(s.open_memory().mf.chain_rows(stored)) == [row for _, row in log]
    assert (folder / "memory.db").stat().st_size < size * 0.5
    code, text = run(capsys, data, token)
    assert code == 0 and "rows stored short" in line_of(text, folder.name), text
    # Again: nothing is left to move, and the file verifies.
    code, out = compact(capsys, monkeypatch, data, token)
    assert code == 0 and "compacted  0 summaries re-sealed, 0 rows stored short" in out, out


def test_a_compacted_summary_keeps_its_version_so_an_older_copy_is_still_refused(
    capsys, monkeypatch, tmp_path: Path, file_cipher: str
) -> None:
    data = tmp_path / "data"
    vault, token = old_store(monkeypatch, data, file_cipher, 8)
    code, out = compact(capsys, monkeypatch, data, token)
    assert code == 0, out
    folder = folder_of(vault, token)
    with vault.session(token, "read") as s:
        key = bytes(s.master)
    with raw_memory_file(folder, key, file_cipher) as conn:
        (kept,) = conn.execute("SELECT sealed FROM summaries WHERE size = 2 AND idx = 0").fetchone()
    with vault.session(token, "full") as s:
        s.open_memory().forget("0-1")
        nap = s.open_memory().nap()["nap"]
        while nap is not None:
            nap = s.open_memory().nap(nap["block"], f"again {nap['block']}")["nap"]
    with raw_memory_file(folder, key, file_cipher) as conn:  # the compacted copy from before the forget, put back
        conn.execute("UPDATE summaries SET sealed = ? WHERE size = 2 AND idx = 0", (kept,))
    # Refused: the tree of row digests holds the summary written after the
    # forget (store.damaged), and under it the version kept says older.
    with pytest.raises((RolledBack, Damaged)), vault.session(token, "read") as s:
        s.open_memory().zoom("0-3")


@pytest.mark.slow
def test_kill_9_at_any_instant_of_compact_leaves_a_store_that_opens_and_a_rerun_finishes(
    capsys, monkeypatch, tmp_path: Path
) -> None:
    """The first kill lands once a reader of its own has seen the summaries
    half moved (on a new store again, should it find them all moved), the
    others at random instants of the re-seal or the rewrite; each leaves a
    store that verifies, and a last run finishes it."""
    rng = random.Random(27)
    mixed = 0  # kills that stopped it with summaries of both layouts in the file
    for trial in range(4):
        if trial == 0 or (trial < 2 and not mixed):
            data = tmp_path / f"data{trial}"
            vault, token = old_store(monkeypatch, data, "sqlcipher", 16_384, napped=False)
            folder = folder_of(vault, token)
            with vault.session(token, "read") as s:
                key = bytes(s.master)
            want = summaries(vault, token)
            env = {**os.environ, "STASH_TOKEN": token}
        elif not mixed:
            break
        proc = subprocess.Popen(
            [sys.executable, "-m", "stash", "compact", "--data", str(data)],
            cwd=OUTSIDE,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if mixed:
            time.sleep(rng.uniform(0.3, 1.5))
        else:
            # Looked at while the compact is stopped, so the half-moved state seen is the one killed, and
            # it runs only a few ms between looks: no slice passes unseen, however loaded the machine is.
            while proc.poll() is None:
                proc.send_signal(signal.SIGSTOP)
                if 0 < _layouts(folder, key)[0] < len(want):
                    break
                proc.send_signal(signal.SIGCONT)
                time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        now = summaries(vault, token)
        assert {b: v[:3] for b, v in now.items()} == {b: v[:3] for b, v in want.items()}, trial
        assert all(v[3] in ONE_SIZE or v[3] - aead.OVERHEAD in formats.SUMMARY_BUCKETS for v in now.values())
        mixed += 0 < sum(v[3] in ONE_SIZE for v in now.values()) < len(now)
        code, text = run(capsys, data, token)
        assert code == 0, text
    assert mixed, "no kill landed while the summaries moved"
    code, out = compact(capsys, monkeypatch, data, token)
    assert code == 0, out
    assert {v[3] for v in summaries(vault, token).values()}.isdisjoint(ONE_SIZE)


def _layouts(folder: Path, master: bytes) -> tuple[int, int]:
    """How many summaries the file holds padded to one size, and in all, read
    by a connection of its own beside a running ``stash compact``."""
    conn = open_raw(folder / "memory.db", file_key(master))
    sizes = ",".join(str(n) for n in sorted(ONE_SIZE))
    try:
        old, total = conn.execute(f"SELECT total(length(sealed) IN ({sizes})), count(*) FROM summaries").fetchone()
        return int(old), total
    except DB_ERRORS:  # busy while it commits a slice
        return -1, -1
    finally:
        conn.close()
