"""What the erasure's and revocation's flush counts as done on a file that
Litestream streams (storage/sqlite/transactions.py, ``_only_litestreams``), on a real
SQLite WAL: a generation holding only Litestream's own row is one that
restarted after everything before it was checkpointed; one holding a page
of ours is not."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from stash.storage.sqlite.transactions import _only_litestreams


def test_a_wal_restarted_by_litestreams_row_counts_as_flushed(tmp_path: Path):
    path = tmp_path / "memory.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE ours (x)")
    conn.execute("CREATE TABLE _litestream_seq (id INTEGER PRIMARY KEY, seq INTEGER)")
    conn.execute("INSERT INTO ours VALUES ('a destroyed key')")
    assert not _only_litestreams(conn, str(path))  # our write is in the WAL, not yet checkpointed
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    assert not _only_litestreams(conn, str(path))  # checkpointed, but the generation still holds our frames
    # As Litestream does after its checkpoint: its own row, which restarts the WAL.
    conn.execute("INSERT INTO _litestream_seq (id, seq) VALUES (1, 1) ON CONFLICT (id) DO UPDATE SET seq = seq + 1")
    assert _only_litestreams(conn, str(path))
    conn.execute("INSERT INTO ours VALUES ('a later write')")
    assert not _only_litestreams(conn, str(path))
    conn.close()
