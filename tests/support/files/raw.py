"""A user's files opened outside the service, as someone holding a file and
its key would open it: the one raw opener of the tamper tests (``open_raw``),
and the memory file with the log's delete guard dropped, how they cut a log."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlcipher3.dbapi2 as sqlcipher

from stash.crypto import keys
from stash.storage.formats import PAGE_BYTES
from stash.storage.sqlite.schema import sections

_TRIGGERS = re.compile(r"CREATE TRIGGER IF NOT EXISTS log_\w+ .*?END;", re.S)


def restore_log_triggers(conn: sqlite3.Connection) -> None:
    """Put back the log's guard triggers as schema.sql writes them (the ones
    still there are left alone): an attacker who dropped them to cut or edit
    the log puts them back, since a missing trigger is itself refused as
    damage (the state head covers them)."""
    for statement in _TRIGGERS.findall(sections()["memory_on_use"]):
        conn.execute(statement)


def file_key(master: bytes) -> bytes:
    """The SQLCipher key of a user's memory file, as the server derives it."""
    return keys.subkey(master, b"file")


def open_raw(path: Path, key: bytes | None, page_bytes: int = PAGE_BYTES, **connect: Any) -> sqlite3.Connection:
    """``path`` opened with SQLCipher under the raw 32-byte ``key`` and the
    server's page size, or with the stdlib sqlite3 when ``key`` is None (a
    plain file). Opening never checks the key: with a wrong one the first
    read fails, as it does for the server."""
    if key is None:
        return sqlite3.connect(str(path), **connect)
    conn = sqlcipher.connect(str(path), **connect)
    conn.execute(f"PRAGMA key = \"x'{key.hex()}'\"")
    conn.execute(f"PRAGMA cipher_page_size = {page_bytes}")
    return conn


@contextlib.contextmanager
def raw_memory_file(
    folder: Path, master: bytes, cipher: str, page_bytes: int = PAGE_BYTES
) -> Iterator[sqlite3.Connection]:
    conn = open_raw(
        folder / "memory.db", file_key(master) if cipher == "sqlcipher" else None, page_bytes, isolation_level=None
    )
    try:
        conn.execute("DROP TRIGGER IF EXISTS log_no_delete")
        yield conn
        # Put the guard back as schema.sql writes it: a dropped trigger is
        # itself refused as damage (the state head covers the log's triggers).
        restore_log_triggers(conn)
    finally:
        conn.close()
