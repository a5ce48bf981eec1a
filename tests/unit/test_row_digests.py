"""The tree of row digests (memory-file format mark 5, docs/DESIGN.md
"Whole-state authentication"; stash/storage/memfile/bound.py): kept write by
write, it is always the tree of the rows the file holds — through notes,
naps, forgets (which cut whole levels), erasures, a new key epoch and
compaction, across leaf and middle boundaries (a small fanout makes them
many) — and a row of a second history of the same file put in its place is
refused where it is read. A file of the previous format gets its tree in one
step; a write rolled back after naming its rows leaves the tree as it was.
Real files, edited with sqlite3 as someone holding the data folder would."""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from stash.core.errors import Damaged
from stash.crypto.epochs import KeyChain
from stash.storage.formats import MEMORY_FILE, current_mark
from stash.storage.memfile import MemoryFile, bound, row_tree
from stash.storage.memfile.erasure_record import RECORD_MARK
from stash.storage.sqlite.transactions import write_transaction
from tests.support.files.raw import restore_log_triggers

USER = "00112233aabbccdd"
AT = "2026-12-01T00:00:00Z"


@pytest.fixture
def small_fanout(monkeypatch) -> int:
    """Leaves of 3 slots and middles of 3 leaves: a few dozen rows cross both."""
    for module in (bound, row_tree):
        monkeypatch.setattr(module, "FANOUT", 3)
    return 3


def settle(mf: MemoryFile, T: int, word: str) -> None:
    """Every block due up to ``T``, left to right, smallest first."""
    size = 2
    while size <= T:
        for idx in range(T // size):
            mf.put_summary(idx * size, (idx + 1) * size, f"{word} {idx * size}-{(idx + 1) * size - 1}")
        size *= 2


def test_the_tree_kept_write_by_write_is_the_tree_of_the_rows(tmp_path: Path, small_fanout: int):
    rng = random.Random(40)
    master = os.urandom(32)
    mf = MemoryFile(tmp_path / "memory.db", USER, master, "none", create=True)
    try:
        for step in range(40):
            T = mf.count()
            op = rng.choice(("note", "note", "nap", "forget", "erase"))
            if op == "note" or T < 4:
                mf.append([("2026-11-30", f"memory {T + k}") for k in range(rng.randint(1, 9))])
            elif op == "nap":
                settle(mf, mf.count(), f"step {step}")
            elif op == "forget":
                size = rng.choice([s for s in (2, 4, 8, 16) if s <= T])
                lo = rng.randrange(T // size) * size
                mf.drop_summaries_from(lo, lo + size)
            else:
                mf.erase(rng.sample(range(T), rng.randint(1, 3)), AT)
            mf.check_row_digests()  # the whole tree recomputed from the rows, node for node
        settle(mf, mf.count(), "last")
        mf.check_row_digests()
        assert mf.conn.execute("SELECT COUNT(*) FROM row_digests").fetchone()[0] > 20  # many leaves and middles
        # A new key epoch re-seals the newest key chunk; compact re-seals summaries.
        chain = KeyChain(USER, (master, os.urandom(32)))
        mf.close()
        mf = MemoryFile(tmp_path / "memory.db", USER, chain, "none")
        assert mf.file_epoch() == 1
        mf.check_row_digests()
        mf.rebucket_summaries(1000)
        mf.check_row_digests()
        T = mf.count()
        assert len(mf.memories(0, T)) == T and mf.summary(0, 2) is not None
    finally:
        mf.close()


def diverged(tmp_path: Path, master: bytes) -> tuple[Path, Path]:
    """One file of 30 memories, copied; then 20 more memories, every summary
    and two erasures in each copy, different in each."""
    live, other = tmp_path / "live" / "memory.db", tmp_path / "other" / "memory.db"
    live.parent.mkdir()
    other.parent.mkdir()
    mf = MemoryFile(live, USER, master, "none", create=True)
    mf.append([("2026-11-30", f"shared {i}") for i in range(30)])
    mf.close()
    shutil.copy2(live, other)
    for path, word in ((live, "ours"), (other, "theirs")):
        mf = MemoryFile(path, USER, master, "none")
        mf.append([("2026-12-01", f"{word} {i}") for i in range(30, 50)])
        settle(mf, 50, word)
        mf.erase([33, 34], AT)
        mf.close()
    return live, other


@pytest.mark.parametrize(
    "table, where",
    [
        ("memory_keys", "chunk = 0"),
        ("summaries", "size = 2 AND idx = 15"),
        ("summaries", "size = 2 AND idx = 3"),  # a shared block, summarised in each history
        ("summaries", "size = 32 AND idx = 0"),
        ("erased", "id = 33"),
    ],
)
def test_a_row_of_a_second_history_of_the_same_file_is_refused(tmp_path: Path, table: str, where: str):
    master = os.urandom(32)
    live, other = diverged(tmp_path, master)
    conn = sqlite3.connect(other)
    (theirs,) = conn.execute(f"SELECT sealed FROM {table} WHERE {where}").fetchone()
    conn.close()
    if table == "memory_keys":  # the chunk with the log rows it opens, as a 16 KiB chunk of pages carries them
        conn = sqlite3.connect(other)
        rows = conn.execute("SELECT id, sealed FROM log WHERE id >= 30 AND id < 40").fetchall()
        conn.close()
    else:
        rows = []
    conn = sqlite3.connect(live, isolation_level=None)
    conn.execute("DROP TRIGGER log_no_update")
    conn.execute(f"UPDATE {table} SET sealed = ? WHERE {where}", (theirs,))
    conn.executemany("UPDATE log SET sealed = ? WHERE id = ?", [(s, i) for i, s in rows])
    restore_log_triggers(conn)
    conn.close()
    mf = MemoryFile(live, USER, master, "none")  # the open checks nothing of these rows: their reads do
    try:
        with pytest.raises(Damaged, match="not the one this memory file's authenticated state holds"):
            if table == "memory_keys":
                mf.memories(30, 32)
            elif table == "erased":
                mf.memories(33, 34)
            else:
                size, idx = (int(part.split(" = ")[1]) for part in where.split(" AND "))
                mf.summary(idx * size, (idx + 1) * size)
        with pytest.raises(Damaged):
            mf.check_row_digests()
    finally:
        mf.close()


def as_mark_4(path: Path, master: bytes) -> None:
    """Write the file as the previous layout did: mark 4, no tree."""
    mf = MemoryFile(path, USER, master, "none")
    try:
        with write_transaction(mf.conn):
            mf.conn.execute("DROP TABLE row_digests")
            mf.put_meta("format", RECORD_MARK)
            mf.state.write()
    finally:
        mf.close()


def test_a_file_of_the_previous_format_gets_its_tree_in_one_step(tmp_path: Path):
    master = os.urandom(32)
    live, _ = diverged(tmp_path, master)
    as_mark_4(live, master)
    mf = MemoryFile(live, USER, master, "none")
    try:
        assert mf.format_mark() == RECORD_MARK
        before = [mf.memories(0, 50), mf.summary(0, 32)]
        assert mf.authenticate_format() and mf.format_mark() == current_mark(MEMORY_FILE) == bound.BOUND_MARK
        mf.check_row_digests()
        assert [mf.memories(0, 50), mf.summary(0, 32)] == before
        assert not mf.authenticate_format()  # once
    finally:
        mf.close()


def test_a_write_rolled_back_after_naming_its_rows_leaves_the_tree_as_it_was(tmp_path: Path):
    master = os.urandom(32)
    mf = MemoryFile(tmp_path / "memory.db", USER, master, "none", create=True)
    try:
        mf.append([("2026-11-30", f"memory {i}") for i in range(10)])
        settle(mf, 8, "first")  # block 8-9 is due
        with pytest.raises(RuntimeError), write_transaction(mf.conn):
            sealed = mf.codec.seal_summary(2, 4, mf.next_version(), "never kept")
            mf.conn.execute("INSERT INTO summaries(size, idx, sealed) VALUES (2, 4, ?)", (sealed,))
            mf.digests.bind(row_tree.summary_slot(2, 4), sealed)
            raise RuntimeError("the write fails before it ends")
        mf.append([("2026-11-30", "memory 10")])  # the next write moves the tree: not to the row rolled back
        mf.check_row_digests()
        assert mf.summary(8, 10) is None
        assert mf.put_summary(8, 10, "kept") and mf.summary(8, 10) == "kept"
        mf.check_row_digests()
    finally:
        mf.close()
