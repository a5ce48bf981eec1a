"""Rows in buckets (stash/storage/formats.py, "rows in buckets"; SECURITY.md,
"What a replicated store shows"): a sealed log row's or summary's size shows
its text's length to within one bucket of 32 bytes, and nothing finer; rows
of the layouts before (every plaintext of one size) still open; and a row
cut to a smaller bucket, moved, or edited anywhere in its padding is refused
as damage. Real files, both ciphers, read raw as a thief holding the file
(and, for a SQLCipher one, its key) reads them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stash.core.errors import Damaged
from stash.crypto import aead
from stash.service.access import Vault
from stash.storage import formats
from stash.storage.memfile.rows import WRITER_BYTES, RowCodec
from tests.support.api import CHEAP_KDF
from tests.support.files.raw import raw_memory_file, restore_log_triggers

B = formats.BUCKET_BYTES
DATE = "2026-01-01 "
# Memory texts whose padded plaintexts (2 + 11 + len + 4 bytes) land on either
# side of bucket edges, the shortest and the longest allowed among them.
EDGE = B - 2 - len(DATE) - WRITER_BYTES  # the longest text of the first bucket: 15 bytes
LENGTHS = [1, EDGE, EDGE + 1, EDGE + B, EDGE + B + 1, 100, 101, 200, 279, 280]


def padded(text: str) -> int:
    return formats.bucket(2 + len((DATE + text).encode()) + WRITER_BYTES, formats.MEMORY_PLAINTEXT_BYTES)


def texts(marker: str) -> list[str]:
    return [(f"{marker} " + "w" * 280)[:n] if n > len(marker) else "x" * n for n in LENGTHS]


def settle(memory, summary: str) -> int:
    """Write every due summary as ``summary`` (cut to the size each nap allows); how many."""
    n = 0
    nap = memory.nap()["nap"]
    while nap is not None:
        n += 1
        nap = memory.nap(nap["block"], summary[: nap["limit"]] if "limit" in nap else summary)["nap"]
    return n


def store(tmp_path: Path, cipher: str, texts_: list[str], summary: str = "s") -> tuple[Vault, str, bytes, Path]:
    vault = Vault(tmp_path / "data", kdf=CHEAP_KDF, file_cipher=cipher)
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        master = bytes(s.master)
        for t in texts_:
            s.open_memory().note(t)
        settle(s.open_memory(), summary)
    return vault, ident.token, master, vault.data_dir / "users" / ident.user_id


def sealed_lengths(folder: Path, master: bytes, cipher: str) -> tuple[list[int], dict[tuple[int, int], int]]:
    with raw_memory_file(folder, master, cipher) as conn:
        log = [r[0] for r in conn.execute("SELECT length(sealed) FROM log ORDER BY id")]
        sums = {(r[0], r[1]): r[2] for r in conn.execute("SELECT size, idx, length(sealed) FROM summaries")}
    return log, sums


def test_each_row_seals_to_its_texts_bucket_and_nothing_finer(tmp_path: Path, file_cipher: str) -> None:
    marker = os.urandom(4).hex()
    ts = texts(marker)
    _, _, master, folder = store(tmp_path, file_cipher, ts)
    log, sums = sealed_lengths(folder, master, file_cipher)
    allowed = {n + aead.OVERHEAD for n in formats.ROW_BUCKETS}
    assert set(log) <= allowed
    assert log == [padded(t) + aead.OVERHEAD for t in ts]
    # Two texts within one bucket seal to one size (1 and 15 bytes, 101 and
    # 100), the next byte past a bucket's edge to the next one.
    assert log[0] == log[1] and log[5] == log[6] and log[8] == log[9] == formats.MEMORY_PLAINTEXT_BYTES + 40
    assert log[2] == log[1] + B and log[4] == log[3] + B
    assert sums and set(sums.values()) <= {n + aead.OVERHEAD for n in formats.SUMMARY_BUCKETS}
    assert set(sums.values()) == {formats.SUMMARY_BUCKETS[0] + aead.OVERHEAD}  # "s": the smallest bucket


def test_summaries_seal_to_their_bucket(tmp_path: Path, file_cipher: str) -> None:
    lengths = {}
    for k, n in enumerate((1, 26, 27, 150, 200)):
        _, _, master, folder = store(tmp_path / str(k), file_cipher, ["a", "b"], "y" * n)
        _, sums = sealed_lengths(folder, master, file_cipher)
        (lengths[n],) = set(sums.values())
    first = formats.SUMMARY_BUCKETS[0] + aead.OVERHEAD
    # 2 + 26 + 4 bytes fill the first bucket; one byte more is the next.
    assert lengths[1] == lengths[26] == first and lengths[27] == first + B
    assert lengths[150] == formats.SUMMARY_VERSION_BYTES + formats.bucket(156, 288) + aead.OVERHEAD
    assert lengths[200] == lengths[150] + 2 * B


def wake(m):
    return m.wake()


def recall(m):
    return m.recall("w")


def zoom(block: str):
    def run(m):
        return m.zoom(block)

    run.__name__ = f"zoom {block}"
    return run


def refused(vault: Vault, token: str, *ops) -> None:
    for op in ops:
        with pytest.raises(Damaged), vault.session(token, "read") as s:
            pytest.fail(f"{op.__name__} served altered data: {op(s.open_memory())!r}")


def edit_log(folder: Path, master: bytes, cipher: str, edit) -> None:
    with raw_memory_file(folder, master, cipher) as conn:
        conn.execute("DROP TRIGGER IF EXISTS log_no_update")
        edit(conn)
        restore_log_triggers(conn)


def test_a_row_cut_to_a_smaller_bucket_is_damage(tmp_path: Path, file_cipher: str) -> None:
    vault, token, master, folder = store(tmp_path, file_cipher, ["x" * 100, "y" * 100, "z", "q"])

    def cut(conn) -> None:
        (sealed,) = conn.execute("SELECT sealed FROM log WHERE id = 1").fetchone()
        # A smaller bucket's length, nonce and tag kept: the padding is gone.
        short = sealed[: aead.NONCE_BYTES] + sealed[aead.NONCE_BYTES : -aead.TAG_BYTES - B] + sealed[-aead.TAG_BYTES :]
        assert len(short) + B == len(sealed) and len(short) - aead.OVERHEAD in formats.ROW_BUCKETS
        conn.execute("UPDATE log SET sealed = ? WHERE id = 1", (short,))

    edit_log(folder, master, file_cipher, cut)
    refused(vault, token, wake, recall, zoom("0-1"))


def test_a_row_moved_to_a_row_of_its_bucket_is_damage(tmp_path: Path, file_cipher: str) -> None:
    vault, token, master, folder = store(tmp_path, file_cipher, ["x" * 100, "y" * 100, "z", "q"])

    def swap(conn) -> None:
        a = conn.execute("SELECT sealed FROM log WHERE id = 0").fetchone()[0]
        b = conn.execute("SELECT sealed FROM log WHERE id = 1").fetchone()[0]
        assert len(a) == len(b)  # one bucket: the size does not tell them apart
        conn.execute("UPDATE log SET sealed = ? WHERE id = 0", (b,))
        conn.execute("UPDATE log SET sealed = ? WHERE id = 1", (a,))

    edit_log(folder, master, file_cipher, swap)
    refused(vault, token, wake, recall, zoom("0-1"))


@pytest.mark.parametrize("edit", ["flip padding", "cut a bucket", "swap"])
def test_a_summary_edited_cut_or_swapped_is_damage(tmp_path: Path, file_cipher: str, edit: str) -> None:
    vault, token, master, folder = store(tmp_path, file_cipher, ["a", "b", "c", "d"], "z" * 60)
    with raw_memory_file(folder, master, file_cipher) as conn:
        got = dict(((r[0], r[1]), r[2]) for r in conn.execute("SELECT size, idx, sealed FROM summaries"))
        one = got[(2, 0)]
        assert len(one) - aead.OVERHEAD in formats.SUMMARY_BUCKETS and len(one) - aead.OVERHEAD > 2 * B
        if edit == "flip padding":
            new = bytearray(one)
            new[-aead.TAG_BYTES - 10] ^= 1  # inside the text's zeros, before the writer
            conn.execute("UPDATE summaries SET sealed = ? WHERE size = 2 AND idx = 0", (bytes(new),))
        elif edit == "cut a bucket":
            short = one[: -aead.TAG_BYTES - B] + one[-aead.TAG_BYTES :]
            conn.execute("UPDATE summaries SET sealed = ? WHERE size = 2 AND idx = 0", (short,))
        else:
            other = got[(2, 1)]
            assert len(other) == len(one)
            conn.execute("UPDATE summaries SET sealed = ? WHERE size = 2 AND idx = 0", (other,))
            conn.execute("UPDATE summaries SET sealed = ? WHERE size = 2 AND idx = 1", (one,))
    refused(vault, token, zoom("0-3"))


def _old_memory_plain(self: RowCodec, date: str, text: str) -> bytes:
    """A memory's plaintext as 0.3.0 and 0.4.0 wrote it: always 312 bytes."""
    return aead.pad(
        f"{date} {text}".encode(), formats.MEMORY_PLAINTEXT_BYTES - WRITER_BYTES
    ) + self.file.writer.to_bytes(WRITER_BYTES, "big")


def _old_summary_plain(self: RowCodec, version: int, text: str, writer: int) -> bytes:
    """A summary's plaintext as 0.2.0 to 0.4.0 wrote it: the version in all
    8 bytes of its field, the text padded to 288 bytes."""
    return (
        version.to_bytes(formats.SUMMARY_VERSION_BYTES, "big")
        + aead.pad(text.encode(), formats.SUMMARY_PLAINTEXT_BYTES - WRITER_BYTES)
        + writer.to_bytes(WRITER_BYTES, "big")
    )


def test_rows_and_summaries_of_one_size_still_open_beside_bucketed_ones(
    monkeypatch, capsys, tmp_path: Path, file_cipher: str
) -> None:
    from tests.support.ops.verify import line_of, run

    old = ["older memory " + "o" * 20, "older memory two"]
    monkeypatch.setattr(RowCodec, "memory_plain", _old_memory_plain)
    monkeypatch.setattr(RowCodec, "summary_plain", _old_summary_plain)
    vault, token, master, folder = store(tmp_path, file_cipher, old, "older summary")
    log, sums = sealed_lengths(folder, master, file_cipher)
    assert set(log) == {formats.MEMORY_PLAINTEXT_BYTES + aead.OVERHEAD}
    assert set(sums.values()) == {formats.SUMMARY_VERSION_BYTES + formats.SUMMARY_PLAINTEXT_BYTES + aead.OVERHEAD}
    monkeypatch.undo()
    with vault.session(token, "full") as s:
        s.open_memory().note("newer memory")
        s.open_memory().note("newer memory two")
        settle(s.open_memory(), "newer summary")
        assert [t for _, _, t in s.open_memory().mf.memories(0, 4)] == [*old, "newer memory", "newer memory two"]
        first, second = s.open_memory().zoom("0-3")["lines"]
        assert first.endswith("older summary") and second.endswith("newer summary")
        mf = s.open_memory().mf
        versions = {}
        for size, idx, sealed in mf.conn.execute("SELECT size, idx, sealed FROM summaries"):
            versions[(size, idx)] = mf.tree.open_summary(size, idx, sealed, None)[0]
        assert 0 < versions[(2, 0)] < versions[(2, 1)]  # the old field and the new one read alike
    log, _ = sealed_lengths(folder, master, file_cipher)
    assert log[2] < log[0] and log[2] - aead.OVERHEAD in formats.ROW_BUCKETS
    code, text = run(capsys, vault.data_dir, token)
    assert code == 0, text
    memory = line_of(text, folder.name).split("; memory file: ", 1)[1].split(" (the memory file's")[0].split(", ")
    assert {"rows 312 B", "rows in buckets"} <= set(memory) and "rows 320 B" not in memory


def test_a_release_that_knows_one_size_refuses_a_bucketed_summary_rather_than_serve_it() -> None:
    """Up to 0.4.0 a summary whose plaintext is not 296 bytes is read as
    unversioned (all of it the padded text): the mark in a bucketed one's
    version field is then an impossible length, refused as damage."""
    codec = RowCodec.__new__(RowCodec)
    for n in range(0, 283):
        plain = codec.summary_plain(7, "t" * n, 3)
        assert len(plain) in formats.SUMMARY_BUCKETS
        assert codec.writer_of(plain) == 3
        if len(plain) != formats.SUMMARY_VERSION_BYTES + formats.SUMMARY_PLAINTEXT_BYTES:
            with pytest.raises(aead.Unsealable):
                aead.unpad(plain)
    assert formats.BUCKETED_MARK == 0xFFFF
