"""Transactions on a SQLite file, and its WAL folded into it: a read
snapshot, a write transaction, a checkpoint, a flush that leaves no old page
version behind (waiting for Litestream's own checkpoint when it streams the
file)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from ..disk_errors import DB_ERRORS

BUSY_TIMEOUT_MS = 30_000


_READING: set[int] = set()


@contextlib.contextmanager
def read_snapshot(conn: sqlite3.Connection) -> Iterator[None]:
    """Read every statement of the block from one snapshot of the file (a
    deferred ``BEGIN``, ended by ``COMMIT``). Outside a transaction each
    statement sees the newest commit, so a forget or an erasure by another
    worker landing between two reads (the settled tree, then a summary it
    names) would look like a damaged file. Inside a transaction already, it
    joins it. A write inside the block raises: a deferred read cannot become
    a write once another writer has committed, so writes take their own
    ``write_transaction`` outside it."""
    if conn.in_transaction:
        yield
        return
    conn.execute("BEGIN")
    _READING.add(id(conn))
    try:
        yield
    finally:
        _READING.discard(id(conn))
        conn.commit()  # ends the read; a no-op if nothing is open any more


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """Hold the file's write lock (``BEGIN IMMEDIATE``) for the block and
    commit it whole, or roll all of it back if the block raises. Inside a
    transaction already, it joins it: the outer block commits, so a write and
    the idempotency record of it land together or not at all."""
    if id(conn) in _READING:
        raise RuntimeError("a write inside a read snapshot: take the write outside read_snapshot")
    if conn.in_transaction:
        yield
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.rollback()
        raise
    conn.commit()


def checkpoint(conn: sqlite3.Connection, attempts: int = 50, pause: float = 0.02) -> bool:
    """``wal_checkpoint(TRUNCATE)`` until it completes: True, or False when
    readers kept it busy for every attempt. Each attempt must not wait in the
    busy handler, or a long reader would hold the request for minutes. A file
    Litestream streams is flushed by Litestream's own checkpoint instead
    (:func:`litestream_flushed`)."""
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        for _ in range(attempts):
            if not conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]:
                return True
            time.sleep(pause)
    finally:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return attempts > 1 and litestream_flushed(conn)


# How long a flush waits for Litestream's checkpoint: many of its sync
# intervals (stash replicate's default is one second). Litestream ships the
# write, then checkpoints at its next timer, two intervals on a quiet host;
# 5 s was once too short on a loaded one (the whole suite's replication
# test answered flushed false), and a flush that times out stays pending.
LITESTREAM_FLUSH_S = 10.0


def _wal_header(path: str) -> bytes | None:
    """The WAL's salts (header bytes 16 to 24), b"" for an empty WAL, None without one."""
    try:
        with open(f"{path}-wal", "rb") as f:
            head = f.read(24)
    except OSError:
        return None
    return head[16:24] if len(head) == 24 else b""


def _streamed(conn: sqlite3.Connection) -> str | None:
    """The file's path when Litestream streams it (its ``-litestream`` folder lies beside it)."""
    row = conn.execute("PRAGMA database_list").fetchone()
    path = row[2] if row else ""
    return path if path and (Path(path).parent / f".{Path(path).name}-litestream").is_dir() else None


def _wal_frames_pages(path: str) -> list[int] | None:
    """The page numbers of the frames of the WAL's current generation (those
    carrying its header's salts), in order; None without a readable WAL."""
    try:
        with open(f"{path}-wal", "rb") as f:
            header = f.read(32)
            if len(header) < 32:
                return []
            page = int.from_bytes(header[8:12], "big")
            salts = header[16:24]
            pages: list[int] = []
            while True:
                frame = f.read(24)
                if len(frame) < 24 or frame[8:16] != salts:
                    return pages
                pages.append(int.from_bytes(frame[:4], "big"))
                f.seek(page, os.SEEK_CUR)
    except OSError:
        return None


def _only_litestreams(conn: sqlite3.Connection, path: str) -> bool:
    """The WAL's current generation holds nothing but Litestream's own row
    (``_litestream_seq``, which it writes after each checkpoint): so it
    restarted after everything written before was checkpointed."""
    pages = _wal_frames_pages(path)
    if pages is None or not pages:
        return pages is not None
    try:
        row = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = '_litestream_seq'").fetchone()
    except DB_ERRORS:
        return False
    return row is not None and set(pages) == {int(row[0])}


def litestream_flushed(conn: sqlite3.Connection, timeout: float = LITESTREAM_FLUSH_S) -> bool:
    """Litestream holds a read transaction on every file it streams, so no
    checkpoint but its own completes; ``stash replicate`` has it checkpoint
    a WAL once an interval after a write of it was shipped. Wait for that:
    True once every frame now in the WAL was checkpointed into the file and
    the WAL restarted or truncated (its salts change, or it empties, or its
    current generation holds only the row Litestream writes after each
    checkpoint: it may have checkpointed between the commit and this call),
    False when the file is not streamed (no ``-litestream`` folder beside
    it) or the wait ran out."""
    path = _streamed(conn)
    if path is None:
        return False
    before = _wal_header(path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = _wal_header(path)
        if now is None or now == b"" or now != before or _only_litestreams(conn, path):
            return True
        time.sleep(0.01)
    return False


FLUSH_WAIT_MS = 5_000
FLUSH_HOLD_MS = 20
"""How long one attempt of :func:`flush` may keep the file's other writers
waiting: a checkpoint that restarts the WAL holds the write lock while it
waits for the readers still using it. Capped, so an agent's note behind a
flush waits a moment, never the whole of a long reader."""
FLUSH_PAUSE_S = 2 * FLUSH_HOLD_MS / 1000  # between attempts: the writers held back by one go first


def flush(conn: sqlite3.Connection, wait_ms: int | None = None) -> bool:
    """Fold the whole WAL into the file and truncate it, so a page version
    that held a destroyed key (or an erased memory's text) survives in
    neither: True once done, False when ``wait_ms`` passed first. Under a
    steady stream of writes the WAL is never empty on its own, so the flush
    makes its moment instead of waiting for one: each attempt waits in
    SQLite's busy handler for the write lock and for the readers of the WAL
    to reach the newest snapshot, holding new writers back meanwhile, but
    for at most :data:`FLUSH_HOLD_MS`; then it lets them go and tries again.
    Readers are never held. A file Litestream streams is flushed by
    Litestream's own checkpoint instead (:func:`litestream_flushed`): its
    read transaction never ends, so ours would never complete."""
    if _streamed(conn) is not None:
        return litestream_flushed(conn)
    deadline = time.monotonic() + (FLUSH_WAIT_MS if wait_ms is None else wait_ms) / 1000
    conn.execute(f"PRAGMA busy_timeout = {FLUSH_HOLD_MS}")
    try:
        while True:
            try:
                if not conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]:
                    return True
            except DB_ERRORS:
                return False
            if time.monotonic() >= deadline:
                return False
            time.sleep(FLUSH_PAUSE_S)
    finally:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
