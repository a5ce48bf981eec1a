"""The erasure record (memory-file format mark 4, formats.py "erasure
record"): one meta row that stands for the ``erased`` and ``erasures`` tables
inside the state digest, so that opening a file costs the same whatever it
has erased.

Before mark 4 the state digest hashed every erased row and every receipt at
each open and each write (1.4 s per open after a 100,000-memory undo). The
record holds instead: how many rows each table has, a digest of every row of
both as stored, and the erased ids as runs ``[start, end)``. The state MAC
covers the record, so what it says is authenticated; each open checks the
two counts against the tables (SQLite counts a table's cells without
reading a row into Python), and the erased ids a request needs come from the
record's runs, not the table. What the record keeps of the old guarantees:

* the erased set is the authenticated one (a key chunk put back does not
  bring a memory back; an erased row deleted, added or swapped for another
  id's changes a count, or leaves an erased memory without its row, or a
  zeroed key without an erased id — each damage, Log.memories);
* each row still opens only at its own id (its seal binds it);
* the digest of the rows as stored — what catches a row put back from a
  second history of the same user with the same id and count — is
  recomputed in full by ``stash verify --token`` and by each listing of
  the receipts (:meth:`Erasure.receipts`), and at every erasure, which
  rewrites the record (work done by SQLite, a few ms per 100,000 rows).
"""

from __future__ import annotations

import hashlib
import sqlite3
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain

from ...core.errors import Damaged

RECORD_META = "erasure_record"
RECORD_MARK = "4"  # the format mark of files that keep the record (formats.py, "erasure record")
CHUNK_ROWS = 8192  # rows hashed per query: a million erased rows never sit in memory at once

UNREADABLE = (
    "The memory file's erasure record is unreadable or disagrees with its erasures; nothing was served. "
    "The operator should run `stash verify` and restore this store from a backup."
)


@dataclass(frozen=True)
class Record:
    erased: int  # rows of ``erased``
    receipts: int  # rows of ``erasures``
    rows: bytes  # digest of every row of both tables as stored (:func:`rows_digest`)
    runs: tuple[tuple[int, int], ...]  # the erased ids, as sorted maximal runs [start, end)

    def ids(self) -> frozenset[int]:
        return frozenset(chain.from_iterable(range(s, e) for s, e in self.runs))

    def holds(self, i: int) -> bool:
        """Whether memory ``i`` is erased: a binary search of the runs."""
        k = bisect_right(self.runs, i, key=lambda run: run[0]) - 1
        return k >= 0 and i < self.runs[k][1]

    def text(self) -> str:
        runs = ",".join(f"{s}-{e}" for s, e in self.runs) or "-"
        return f"{self.erased} {self.receipts} {self.rows.hex()} {runs}"


def runs_of(ids: Iterable[int]) -> tuple[tuple[int, int], ...]:
    out: list[list[int]] = []
    for i in sorted(set(ids)):
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return tuple((s, e) for s, e in out)


def parse(text: str | None) -> Record | None:
    """The record a meta value holds (None: no row). Damaged when it is not
    one this module writes, or its runs do not count its erased rows."""
    if text is None:
        return None
    try:
        erased, receipts, rows, runs_text = text.split(" ")
        runs = (
            ()
            if runs_text == "-"
            else tuple((int(a), int(b)) for a, b in (part.split("-") for part in runs_text.split(",")))
        )
        record = Record(int(erased), int(receipts), bytes.fromhex(rows), runs)
    except ValueError:
        raise Damaged(UNREADABLE) from None
    last = -1
    for s, e in record.runs:
        if not last < s < e:
            raise Damaged(UNREADABLE)
        last = e
    if sum(e - s for s, e in record.runs) != record.erased or record.receipts < 0 or len(record.rows) != 32:
        raise Damaged(UNREADABLE)
    return record


def counts(conn: sqlite3.Connection, tables: frozenset[str]) -> tuple[int, int]:
    """How many rows ``erased`` and ``erasures`` hold (0 for a table not made)."""
    return tuple(  # type: ignore[return-value]  # two tables, two counts
        int(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) if t in tables else 0
        for t in ("erased", "erasures")
    )


def rows_digest(conn: sqlite3.Connection, tables: frozenset[str]) -> bytes:
    """BLAKE2b over every row of ``erased`` and ``erasures`` as stored (id
    and sealed bytes, in id order), each chunk concatenated by SQLite."""
    h = hashlib.blake2b(digest_size=32, person=b"stash.erasures")
    for table in ("erased", "erasures"):
        h.update(f"|{table}|".encode())
        if table not in tables:
            continue
        after = -1
        while True:
            text, top, n = conn.execute(
                f"SELECT group_concat(id || ':' || hex(sealed), ','), MAX(id), COUNT(*) FROM "
                f"(SELECT id, sealed FROM {table} WHERE id > ? ORDER BY id LIMIT ?)",
                (after, CHUNK_ROWS),
            ).fetchone()
            if not n:
                break
            h.update(text.encode() + b";")
            after = int(top)
            if n < CHUNK_ROWS:
                break
    return h.digest()


def from_tables(conn: sqlite3.Connection, tables: frozenset[str], ids: Iterable[int] | None = None) -> Record:
    """The record of what the two tables hold now; ``ids``: the erased ids
    when the caller knows them (an erasure: those before it and its own)."""
    if ids is None:
        ids = [r[0] for r in conn.execute("SELECT id FROM erased")] if "erased" in tables else []
    erased, receipts = counts(conn, tables)
    return Record(erased, receipts, rows_digest(conn, tables), runs_of(ids))
