"""A live server's memory file opened raw, with the base key a token unlocks
from the key ring: how the whole-state, copies and swap-matrix tests read or
edit what the server holds behind its back."""

from __future__ import annotations

import contextlib
from pathlib import Path

from stash.crypto import tokens
from stash.storage.keyring import Keyring
from tests.support.api import token_parts
from tests.support.files.raw import file_key, open_raw, restore_log_triggers
from tests.support.server import Server


def base_key(server: Server, token: str) -> bytes:
    tok = token_parts(token)
    ring = Keyring(server.data / "users" / tok.user_id / "keyring.db", tok.user_id)
    try:
        grant = ring.find(tokens.lookup_tag(tok.user_id, tok.secret))
        assert grant is not None
        return ring.open_grant(grant, tok.secret).chain.base
    finally:
        ring.close()


@contextlib.contextmanager
def raw(folder: Path, base: bytes, restore: bool = True):
    """The memory file opened with its file key (as the holder of any old key
    ring copy can), the log's guards dropped for the edit and put back after."""
    conn = open_raw(folder / "memory.db", file_key(base), isolation_level=None)
    try:
        conn.execute("DROP TRIGGER IF EXISTS log_no_update")
        conn.execute("DROP TRIGGER IF EXISTS log_no_delete")
        conn.execute("DROP TRIGGER IF EXISTS log_no_replace")
        yield conn
        if restore:
            restore_log_triggers(conn)
    finally:
        conn.close()


def rows(folder: Path, base: bytes, sql: str, args=()) -> list:
    with raw(folder, base) as conn:
        return conn.execute(sql, args).fetchall()
