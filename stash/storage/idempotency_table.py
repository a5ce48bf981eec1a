"""The idempotency table of one file (memory file or key ring).

It stores opaque values: the lookup and fingerprint are keyed hashes and the
answer is sealed before it gets here (:mod:`stash.service.idempotency`).
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager

from .sqlite.schema import sections
from .sqlite.transactions import write_transaction


class Records:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def ensure(self) -> None:
        """Create the table in a file made before it existed. Outside any
        transaction: executescript commits whatever is open. A file that
        has the table and its index already is only looked at: running the
        script (two ``IF NOT EXISTS`` statements and a commit) on every
        write cost more than the look."""
        have = self.conn.execute(
            "SELECT COUNT(*) FROM sqlite_master WHERE (type = 'table' AND name = 'idempotency') "
            "OR (type = 'index' AND name = 'idempotency_created')"
        ).fetchone()[0]
        if have != 2:
            self.conn.executescript(sections()["idempotency"])

    def transaction(self) -> AbstractContextManager[None]:
        return write_transaction(self.conn)

    def purge(self, before: int) -> None:
        """Delete every record created at or before ``before`` (Unix seconds)."""
        self.conn.execute("DELETE FROM idempotency WHERE created <= ?", (before,))

    def keep_newest(self, n: int) -> None:
        """Delete all but the ``n`` newest records (a bound per file, whatever
        the rate of keyed writes within the window)."""
        self.conn.execute(
            "DELETE FROM idempotency WHERE lookup IN "
            "(SELECT lookup FROM idempotency ORDER BY created DESC, lookup LIMIT -1 OFFSET ?)",
            (n,),
        )

    def changes(self) -> int:
        """Rows this connection has inserted, updated or deleted so far: a
        write changed nothing when this is the same before and after it."""
        return self.conn.total_changes

    def find(self, lookup: bytes) -> tuple[bytes, bytes] | None:
        """``(fingerprint, sealed)`` of the record at ``lookup``, or None."""
        row = self.conn.execute("SELECT fingerprint, sealed FROM idempotency WHERE lookup = ?", (lookup,)).fetchone()
        return (bytes(row[0]), bytes(row[1])) if row else None

    def put(self, lookup: bytes, fingerprint: bytes, created: int, sealed: bytes) -> None:
        self.conn.execute(
            "INSERT INTO idempotency(lookup, fingerprint, created, sealed) VALUES (?, ?, ?, ?)",
            (lookup, fingerprint, created, sealed),
        )

    def created(self, lookup: bytes) -> int:
        """When the record at ``lookup`` was made (Unix seconds); 0 when there is none."""
        row = self.conn.execute("SELECT created FROM idempotency WHERE lookup = ?", (lookup,)).fetchone()
        return int(row[0]) if row else 0
