"""Turning one memory's SQLCipher file into a plain SQLite file (``stash
migrate --file-cipher none``), so Litestream can stream it; every row stays
sealed with XChaCha20-Poly1305, only the whole-file layer goes.

Two files change: ``memory.db`` (its bytes) and the key ring's
``file_cipher`` row (which cipher opens it). No single write can change
both, so the move has one commit point and a way forward from either side:

1. the plain copy is written beside the file as :data:`NEXT`, compared row
   for row with the SQLCipher file in one connection, checked, and fsynced;
2. the key ring's row becomes ``none`` (one SQLite commit, fsynced): the
   commit point;
3. :data:`NEXT` is renamed over ``memory.db`` and the folder fsynced.

A crash before 2 leaves the old store whole (the copy is removed by the
next attempt: :func:`discard`); after it, the key ring says ``none`` and
:data:`NEXT` is still there until 3, so whoever opens the memory next
finishes the rename first (:func:`finish`: the server's session and ``stash
migrate`` both do). Every step runs under the memory's lock held exclusive
(:mod:`userlock`), so no request reads either file halfway.

A connection left open by another process (a server keeps files open
between requests: storage/sqlite/pool.py) would keep the old file's WAL and index
by name and fold them into the new file; so the swap goes ahead only when
closing this process's own connection removed both, which SQLite does only
for the last connection to the file anywhere (:class:`Busy` otherwise).
"""

from __future__ import annotations

import itertools
import os
import sqlite3
from pathlib import Path

from . import safeopen
from .disk_errors import DB_ERRORS
from .private_files import fsync_path
from .sqlite.connections import SQLCIPHER_OPEN_CLOSE, connect
from .sqlite.transactions import write_transaction

NEXT = "memory.db.plain"
"""The plain copy being made beside ``memory.db``."""
_SIDES = ("", "-journal", "-wal", "-shm")
EXPORT_CACHE_KIB = 64 * 1024  # the page cache of the one connection that copies (a request's is 512 KiB)


class Busy(Exception):
    """Another process has the memory file open; try again once it closed it."""


class Unequal(Exception):
    """The plain copy does not hold exactly what the SQLCipher file holds; nothing was changed."""


def pending(folder: Path) -> bool:
    """A converted memory's plain file still waits beside ``memory.db``."""
    return (Path(folder) / NEXT).is_file()


def finish(folder: Path) -> bool:
    """Step 3, for a memory whose key ring says ``none`` already: put the
    plain copy in place. True when it did. Caller holds the lock exclusive."""
    folder = Path(folder)
    if not (folder / NEXT).is_file():
        return False
    for side in ("-wal", "-shm"):
        # The SQLCipher file's, at rest (no one has it open under the lock):
        # left, they would be read as the plain file's.
        (folder / f"memory.db{side}").unlink(missing_ok=True)
    os.replace(folder / NEXT, folder / "memory.db")
    fsync_path(folder)
    return True


def discard(folder: Path) -> None:
    """Remove a copy left by an attempt that never reached its commit."""
    for side in _SIDES:
        (Path(folder) / f"{NEXT}{side}").unlink(missing_ok=True)


def _tables(conn: sqlite3.Connection, schema: str) -> list[tuple[str, str, str]]:
    rows = conn.execute(
        f"SELECT type, name, sql FROM {schema}.sqlite_master WHERE sql IS NOT NULL ORDER BY type, name"
    ).fetchall()
    return [(str(t), str(n), str(s)) for t, n, s in rows]


def _export(memory: Path, target: Path, file_key: bytes, page_bytes: int) -> None:
    """Step 1: write ``target`` from the SQLCipher file (SQLCipher's own
    ``sqlcipher_export``, into a database attached without a key) and
    compare every table of the two, row for row."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)  # 0600 whatever the umask
    os.fchmod(fd, 0o600)
    os.close(fd)
    conn = connect(memory, file_key=file_key, cipher="sqlcipher", page_bytes=page_bytes)
    try:
        conn.execute(f"PRAGMA cache_size = -{EXPORT_CACHE_KIB}")
        conn.execute("ATTACH DATABASE ? AS plain KEY ''", (str(target),))
        conn.execute(f"PRAGMA plain.page_size = {int(page_bytes)}")
        conn.execute("SELECT sqlcipher_export('plain')")
        if _tables(conn, "main") != _tables(conn, "plain"):
            raise Unequal("the plain copy's schema differs")
        for _, name, _ in (t for t in _tables(conn, "main") if t[0] == "table"):
            # A whole-table scan reads in key order, so two files that hold
            # the same rows yield them in the same order: one streaming pass.
            quoted = '"' + name.replace('"', '""') + '"'
            old = conn.execute(f"SELECT * FROM main.{quoted}")
            new = conn.cursor().execute(f"SELECT * FROM plain.{quoted}")
            if any(a != b for a, b in itertools.zip_longest(old, new)):
                raise Unequal("the plain copy's rows differ")
        conn.execute("DETACH DATABASE plain")
    finally:
        with SQLCIPHER_OPEN_CLOSE:
            conn.close()


def convert(folder: Path, keyring: sqlite3.Connection, file_key: bytes, page_bytes: int) -> None:
    """Steps 1 to 3 for the memory in ``folder`` whose key ring connection is
    ``keyring`` (a connection) and whose file opens with ``file_key`` at ``page_bytes``.
    Raises :class:`Busy` (nothing changed) when another process has the
    file open, :class:`Unequal` when the copy differs. Caller holds the lock
    exclusive and has checked that the key ring says ``sqlcipher``."""
    folder = Path(folder)
    memory, target = folder / "memory.db", folder / NEXT
    discard(folder)
    try:
        _export(memory, target, file_key, page_bytes)
        if any((folder / f"memory.db{side}").exists() for side in ("-wal", "-shm")):
            raise Busy()
        check = connect(target, file_key=None, cipher="none", page_bytes=page_bytes)  # WAL, schema checked
        try:
            safeopen.check_schema(check, "memory.db")
            if [r[0] for r in check.execute("PRAGMA integrity_check")] != ["ok"]:
                raise Unequal("the plain copy fails SQLite's integrity check")
        finally:
            check.close()
        fsync_path(target)
        with write_transaction(keyring):
            cur = keyring.execute(
                "UPDATE keyring_meta SET value = 'none' WHERE name = 'file_cipher' AND value = 'sqlcipher'"
            )
            if cur.rowcount != 1:
                raise Unequal("the key ring no longer says sqlcipher")
    except (Busy, Unequal, *DB_ERRORS, OSError):  # type: ignore[misc]  # a tuple of exception classes
        discard(folder)
        raise
    finish(folder)
