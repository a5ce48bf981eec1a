"""The erasure record (format mark 4, docs/DESIGN.md "Formats"): an open no
longer hashes every erased row and receipt, yet every edit of them that the
old digest refused is still refused — at the open (a count, the record, the
mark), at the first read of the memory concerned, or by the full check that
``stash verify --token`` and the receipts listing make. A mark-3 file (as
this release's previous layout wrote it, with erasures) moves to mark 4 in
one step and keeps its erasures. Real plain files, edited with sqlite3 as
someone holding the data folder would."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from stash.core.errors import Damaged
from stash.storage.formats import MEMORY_FILE, current_mark
from stash.storage.memfile import MemoryFile
from stash.storage.memfile.erasure_record import RECORD_META
from stash.storage.sqlite.transactions import write_transaction

USER = "00112233aabbccdd"
AT = "2026-12-01T00:00:00Z"


def made(path: Path, master: bytes, n: int = 40) -> MemoryFile:
    mf = MemoryFile(path, USER, master, "none", create=True)
    mf.append([("2026-11-30", f"memory {i}") for i in range(n)])
    return mf


def edit(path: Path, *statements: tuple[str, tuple]) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    for sql, args in statements:
        conn.execute(sql, args)
    conn.close()


def opened(path: Path, master: bytes) -> MemoryFile:
    return MemoryFile(path, USER, master, "none")


def read_all(path: Path, master: bytes) -> list[tuple[int, str, str]]:
    mf = opened(path, master)
    try:
        mf.receipts()
        return mf.memories(0, mf.count())
    finally:
        mf.close()


def as_mark_3(mf: MemoryFile) -> None:
    """Write the file as the previous layout did: mark 3, no record, the
    state digest over every erasure row."""
    with write_transaction(mf.conn):
        mf.put_meta("format", "3")
        mf.conn.execute("DELETE FROM meta WHERE name = ?", (RECORD_META,))
        mf.state.write()


def test_a_mark_3_file_with_erasures_moves_to_the_record_and_keeps_them(tmp_path: Path):
    path, master = tmp_path / "memory.db", os.urandom(32)
    mf = made(path, master)
    mf.erase([3, 4, 5, 20], AT)
    as_mark_3(mf)
    mf.close()
    mf = opened(path, master)
    assert mf.format_mark() == "3" and mf.erased_ids == {3, 4, 5, 20}
    assert mf.authenticate_format() and mf.format_mark() == current_mark(MEMORY_FILE)  # mark 4, then 5
    mf.close()
    mf = opened(path, master)
    try:
        assert mf.erased_ids == {3, 4, 5, 20}
        assert [i for i, _, text in mf.memories(0, mf.count()) if text == "[erased]"] == [3, 4, 5, 20]
        mf.check_erasure_record()
        mf.erase([6], AT)  # the runs join: 3-7 and 20-21
        assert (
            mf.conn.execute("SELECT value FROM meta WHERE name = ?", (RECORD_META,))
            .fetchone()[0]
            .endswith(" 3-7,20-21")
        )
    finally:
        mf.close()
    assert len(read_all(path, master)) == 40


def test_the_mark_3_layout_still_refuses_an_erased_row_deleted(tmp_path: Path):
    path, master = tmp_path / "memory.db", os.urandom(32)
    mf = made(path, master)
    mf.erase([3], AT)
    as_mark_3(mf)
    mf.close()
    edit(path, ("DELETE FROM erased WHERE id = 3", ()))
    with pytest.raises(Damaged):
        opened(path, master)


@pytest.mark.parametrize(
    "attack",
    [
        "delete erased",
        "delete receipt",
        "add erased",
        "record deleted",
        "record edited",
        "mark set back",
        "key back, row deleted",
    ],
)
def test_edits_of_the_erasures_are_refused_at_the_open(tmp_path: Path, attack: str):
    path, master = tmp_path / "memory.db", os.urandom(32)
    mf = made(path, master)
    old_chunk = mf.conn.execute("SELECT sealed FROM memory_keys WHERE chunk = 0").fetchone()[0]
    mf.erase([3, 9], AT)
    mf.erase([12], AT)
    (row9,) = mf.conn.execute("SELECT sealed FROM erased WHERE id = 9").fetchone()
    record = mf.conn.execute("SELECT value FROM meta WHERE name = ?", (RECORD_META,)).fetchone()[0]
    mf.close()
    edits: dict[str, list[tuple[str, tuple]]] = {
        "delete erased": [("DELETE FROM erased WHERE id = 9", ())],
        "delete receipt": [("DELETE FROM erasures WHERE id = (SELECT MAX(id) FROM erasures)", ())],
        "add erased": [("INSERT INTO erased(id, sealed) VALUES (20, ?)", (row9,))],
        "record deleted": [("DELETE FROM meta WHERE name = ?", (RECORD_META,))],
        "record edited": [("UPDATE meta SET value = ? WHERE name = ?", (record.replace("9-10", "10-11"), RECORD_META))],
        "mark set back": [("UPDATE meta SET value = '3' WHERE name = 'format'", ())],
        # The key chunk from before the erasure put back, and the erasure's row gone.
        "key back, row deleted": [
            ("UPDATE memory_keys SET sealed = ? WHERE chunk = 0", (old_chunk,)),
            ("DELETE FROM erased WHERE id = 3", ()),
        ],
    }
    edit(path, *edits[attack])
    with pytest.raises(Damaged):
        read_all(path, master)
    with pytest.raises(Damaged):
        opened(path, master).close()


def two_histories(tmp_path: Path) -> tuple[Path, Path, bytes]:
    """One file, copied (same keys), then each copy erases on its own: a
    second history of the same user, whose rows are validly sealed."""
    path, master = tmp_path / "memory.db", os.urandom(32)
    made(path, master).close()
    other = tmp_path / "other.db"
    shutil.copy(path, other)
    return path, other, master


def test_an_erased_row_swapped_for_another_historys_is_refused_where_it_is_read(tmp_path: Path):
    path, other, master = two_histories(tmp_path)
    mf = opened(path, master)
    mf.erase([3], AT)
    mf.close()
    theirs = opened(other, master)
    theirs.erase([7], AT)
    chunk = theirs.conn.execute("SELECT sealed FROM memory_keys WHERE chunk = 0").fetchone()[0]
    (row7,) = theirs.conn.execute("SELECT sealed FROM erased WHERE id = 7").fetchone()
    theirs.close()
    # The same count, another id: #3's row gone, #7's from the other history, and its key chunk.
    edit(
        path,
        ("DELETE FROM erased WHERE id = 3", ()),
        ("INSERT INTO erased(id, sealed) VALUES (7, ?)", (row7,)),
        ("UPDATE memory_keys SET sealed = ? WHERE chunk = 0", (chunk,)),
    )
    mf = opened(path, master)
    try:
        with pytest.raises(Damaged):
            mf.memories(3, 4)  # erased, as the record says, and its row is gone
        with pytest.raises(Damaged):
            mf.memories(7, 8)  # its key shredded, and the record does not name it
        with pytest.raises(Damaged):
            list(mf.scan(mf.count()))
        with pytest.raises(Damaged):
            mf.check_erasure_record()
    finally:
        mf.close()


def test_an_erased_row_of_the_same_id_from_another_history_is_found_by_the_full_check(tmp_path: Path):
    path, other, master = two_histories(tmp_path)
    mf = opened(path, master)
    mf.erase([3], "2026-12-01T00:00:00Z")
    mf.close()
    theirs = opened(other, master)
    theirs.erase([3], "2026-12-05T00:00:00Z")  # the same memory erased there: a row as valid, other bytes
    (row3,) = theirs.conn.execute("SELECT sealed FROM erased WHERE id = 3").fetchone()
    theirs.close()
    edit(path, ("UPDATE erased SET sealed = ? WHERE id = 3", (row3,)))
    mf = opened(path, master)  # the counts agree: the open cannot tell
    try:
        with pytest.raises(Damaged):
            mf.check_erasure_record()  # stash verify --token
        with pytest.raises(Damaged):
            mf.receipts()  # GET /erasures
    finally:
        mf.close()


def test_runs_make_the_same_erased_runs_as_the_ids():
    import random

    from stash.core.blocks import Erased
    from stash.storage.memfile.erasure_record import Record, parse, runs_of

    rng = random.Random(26)
    for _ in range(200):
        ids = {rng.randrange(300) for _ in range(rng.randrange(120))}
        runs = runs_of(ids)
        record = parse(Record(len(ids), 0, bytes(32), runs).text())
        assert record is not None and record.ids() == ids
        assert [i for i in range(310) if record.holds(i)] == sorted(ids)
        a, b = Erased.from_runs(record.runs), Erased(ids)
        assert (a.starts, a.ends) == (b.starts, b.ends)


def test_an_erasure_by_a_handle_opened_before_another_workers_keeps_both(tmp_path: Path):
    path, master = tmp_path / "memory.db", os.urandom(32)
    made(path, master).close()
    a, b = opened(path, master), opened(path, master)  # two workers of one server
    try:
        b.erase([5], AT)
        a.erase([9], AT)  # a still holds the record from before b's erasure
    finally:
        a.close()
        b.close()
    mf = opened(path, master)
    try:
        assert mf.erased_ids == {5, 9}
        mf.check_erasure_record()
    finally:
        mf.close()


def test_verify_without_a_token_counts_a_plain_files_erasures_against_its_record(tmp_path: Path, capsys):
    from tests.support.ops.verify import Store, line_of, run

    store = Store(tmp_path / "data", "none")
    with store.vault.session(store.token, "owner") as s:
        s.open_memory().mf.erase([1, 2], AT)
    code, text = run(capsys, store.data)
    assert code == 0, text
    edit(store.folder / "memory.db", ("DELETE FROM erased WHERE id = 2", ()))
    code, text = run(capsys, store.data)
    assert code == 1 and "holds 1 erased rows and 1 erasure receipts but its erasure record counts 2 and 1" in line_of(
        text, store.user_id
    ), text


def test_a_handle_opened_before_another_workers_erasure_reads_it_as_erased(tmp_path: Path):
    """A worker's handle holds the record authenticated at its open; another
    worker then erases #7. Reading #7 (its key now shredded) must refresh the
    record from the file and render it erased, not call the store damaged
    (found by the chaos test: a nap's source read a memory erased meanwhile)."""
    path, master = tmp_path / "memory.db", os.urandom(32)
    made(path, master).close()
    a, b = opened(path, master), opened(path, master)  # two workers of one server
    try:
        b.erase([7], AT)
        rows = a.memories(0, 10)
        assert rows[7][2] == "[erased]" and rows[6][2] == "memory 6"
        assert 7 in a.erased_ids
        seen = [line for batch in a.scan(10) for line in batch]
        assert seen[7] == f"#7 {rows[7][1]} [erased]", seen[7]
    finally:
        a.close()
        b.close()
