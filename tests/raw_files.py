"""A user's memory file opened as someone holding it and its key would open
it, with the log's delete guard dropped: how the tamper tests cut a log."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import sqlcipher3.dbapi2 as sqlcipher

from stash.crypto import keys
from stash.storage.files import PAGE_BYTES


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
    finally:
        conn.close()
