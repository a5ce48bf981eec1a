"""A user's memory file opened as someone holding it and its key would open
it, with the log's delete guard dropped: how the tamper tests cut a log."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import sqlcipher3.dbapi2 as sqlcipher

from stash.crypto import keys
from stash.storage.files import PAGE_BYTES
from stash.storage.schema import sections

_TRIGGERS = re.compile(r"CREATE TRIGGER IF NOT EXISTS log_\w+ .*?END;", re.S)


def restore_log_triggers(conn: sqlite3.Connection) -> None:
    """Put back the log's guard triggers as schema.sql writes them (the ones
    still there are left alone): an attacker who dropped them to cut or edit
    the log puts them back, since a missing trigger is itself refused as
    damage (the state head covers them)."""
    for statement in _TRIGGERS.findall(sections()["memory"]):
        conn.execute(statement)


@contextlib.contextmanager
def raw_memory_file(folder: Path, master: bytes, cipher: str) -> Iterator[sqlite3.Connection]:
    path = str(folder / "memory.db")
    if cipher == "sqlcipher":
        conn = sqlcipher.connect(path, isolation_level=None)
        conn.execute(f"PRAGMA key = \"x'{keys.subkey(master, b'file').hex()}'\"")
        conn.execute(f"PRAGMA cipher_page_size = {PAGE_BYTES}")
    else:
        conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("DROP TRIGGER IF EXISTS log_no_delete")
        yield conn
        # Put the guard back as schema.sql writes it: a dropped trigger is
        # itself refused as damage (the state head covers the log's triggers).
        restore_log_triggers(conn)
    finally:
        conn.close()
