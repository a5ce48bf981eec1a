"""A memory's append capabilities and the notes they wrote, in its key ring.

The key ring is plain SQLite, readable without any key, which is why an
append capability (which holds none) writes here and never into the memory
file: its notes wait in ``inbox``, sealed to the epoch's inbox public key
(stash/crypto/inbox_seal.py), until the next read-capable open folds them
into the log (stash/service/append.py). Schema: schema.sql, "memories".
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from .. import formats, memories
from ..sqlite.transactions import write_transaction
from .ring_file import now_utc


@dataclass(frozen=True)
class AppendGrant:
    id: int
    tag: bytes | None
    created: str
    revoked: str | None
    mac: bytes | None


@dataclass(frozen=True)
class Waiting:
    seq: int
    grant_id: int
    epoch: int
    claim: int
    sealed: bytes


def _has(conn: sqlite3.Connection, table: str) -> bool:
    return (
        conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone() is not None
    )


def find(conn: sqlite3.Connection, tag: bytes) -> AppendGrant | None:
    if not _has(conn, "append_grants"):
        return None
    row = conn.execute(
        "SELECT id, tag, created, revoked, mac FROM append_grants WHERE tag = ? AND revoked IS NULL", (tag,)
    ).fetchone()
    return None if row is None else AppendGrant(*row)


def grants(conn: sqlite3.Connection) -> list[AppendGrant]:
    if not _has(conn, "append_grants"):
        return []
    return [
        AppendGrant(*r) for r in conn.execute("SELECT id, tag, created, revoked, mac FROM append_grants ORDER BY id")
    ]


def live_tags(conn: sqlite3.Connection) -> frozenset[bytes]:
    if not _has(conn, "append_grants"):
        return frozenset()
    return frozenset(bytes(r[0]) for r in conn.execute("SELECT tag FROM append_grants WHERE revoked IS NULL"))


def add(
    conn: sqlite3.Connection,
    number: int,
    tag: bytes,
    mac_of: object,
    expires: str | None = None,
    label_of: object = None,
) -> int:
    """File an append grant of memory ``number``; ``mac_of(grant_id)`` is its
    MAC. Its expiry (in clear, as a read or full grant's, and bound by the
    MAC) and ``label_of(grant_id)`` (its sealed label) go into ``grant_notes``
    in the same transaction, so no crash leaves the grant without its expiry."""
    with write_transaction(conn):
        memories.ensure(conn, "append_grants")
        grant_id = next_id(conn, number)
        assert callable(mac_of)
        conn.execute(
            "INSERT INTO append_grants(id, tag, created, mac) VALUES (?, ?, ?, ?)",
            (grant_id, tag, now_utc(), mac_of(grant_id)),
        )
        if expires is not None or label_of is not None:
            assert label_of is None or callable(label_of)
            formats.make_on_use(conn, "keyring_on_use", "grant_notes")
            conn.execute(
                "INSERT INTO grant_notes(grant_id, label, expires) VALUES (?, ?, ?)",
                (grant_id, None if label_of is None else label_of(grant_id), expires),
            )
    return grant_id


def next_id(conn: sqlite3.Connection, number: int) -> int:
    """The id the next append grant of memory ``number`` takes: ids only
    grow, so every one minted from now on is at least this."""
    base = number * memories.GRANT_ID_SPAN + memories.APPEND_ID_OFFSET
    top = conn.execute("SELECT max(id) FROM append_grants").fetchone()[0] if _has(conn, "append_grants") else None
    return max(base, int(top or 0)) + 1


def revoke(conn: sqlite3.Connection, grant_id: int) -> str | None:
    """End one append grant: its row is marked revoked, and :func:`find`
    and :func:`live_tags` skip it from then on; its tag and MAC stay, so the
    notes it wrote before still fold. The revocation time, or None when it
    was revoked already."""
    with write_transaction(conn):
        row = conn.execute("SELECT revoked FROM append_grants WHERE id = ?", (grant_id,)).fetchone()
        if row is None or row[0] is not None:
            return None
        at = now_utc()
        conn.execute("UPDATE append_grants SET revoked = ? WHERE id = ?", (at, grant_id))
    return at


def pending(conn: sqlite3.Connection) -> int:
    if not _has(conn, "inbox"):
        return 0
    return int(conn.execute("SELECT count(*) FROM inbox").fetchone()[0])


def put(conn: sqlite3.Connection, grant_id: int, epoch: int, claim: int, sealed: bytes) -> None:
    with write_transaction(conn):
        memories.ensure(conn, "inbox")
        conn.execute(
            "INSERT INTO inbox(grant_id, epoch, claim, sealed) VALUES (?, ?, ?, ?)", (grant_id, epoch, claim, sealed)
        )


def waiting(conn: sqlite3.Connection) -> list[Waiting]:
    if not _has(conn, "inbox"):
        return []
    return [Waiting(*r) for r in conn.execute("SELECT seq, grant_id, epoch, claim, sealed FROM inbox ORDER BY seq")]


def done(conn: sqlite3.Connection, upto: int) -> None:
    """Remove the notes folded into the log, ``seq`` up to ``upto``."""
    with write_transaction(conn):
        conn.execute("DELETE FROM inbox WHERE seq <= ?", (upto,))
