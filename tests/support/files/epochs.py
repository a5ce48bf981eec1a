"""A memory's epoch keys as a token opens them from a copy of its key ring,
and everything those keys open in copies of its memory file: how the key
epoch, expiry, rotation, owner-only and replication tests tell what an old
key or a stolen copy still reads."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

from nacl import bindings
from nacl.exceptions import CryptoError

from stash.crypto import keys, tokens
from stash.storage.keyring import Keyring, StaleGrant
from tests.support.files.raw import raw_memory_file
from tests.support.memories import MAIN_MEMORY, Memory
from tests.support.server import Http, Server

KEY = 32


NONCE = 24


def aad(user_id: str, table: str, position) -> bytes:
    return f"stash/v1|{user_id}|{table}|{position}".encode()


def opens(key: bytes, sealed: bytes, ad: bytes) -> bytes | None:
    try:
        return bindings.crypto_aead_xchacha20poly1305_ietf_decrypt(sealed[NONCE:], ad, sealed[:NONCE], key)
    except (CryptoError, ValueError, TypeError):
        return None


def snapshot(server: Server, user_id: str, into: Path) -> Path:
    """Stop the server, copy the user's folder (as a backup or disk image
    would), start it again on the same port."""
    server.stop()
    shutil.copytree(server.data / "users" / user_id, into)
    server.start(same_port=True)
    return into


def epoch_keys_of(keyring: Path, token: str | tokens.Token, store: str | None = None) -> list[bytes]:
    """Every epoch key ``token`` opens from this copy of a key ring, or []
    (``store``: the key ring's store id, for a memory other than main; the
    owner's token as that memory files it: tests/support/memories.py, ``filed``)."""
    tok = token if isinstance(token, tokens.Token) else tokens.parse(token)
    assert tok is not None, "not a token"
    ring = Keyring(keyring, store or tok.user_id)
    try:
        grant = ring.find(tokens.lookup_tag(tok.user_id, tok.secret))
        if grant is None or grant.wrapped is None:
            return []
        try:
            return list(ring.open_grant(grant, tok.secret).chain.keys)
        except StaleGrant:
            return []
    finally:
        ring.close()


def everything_readable(
    user_id: str, memory_copies: list[Path], epoch_keys: list[bytes], cipher: str = "sqlcipher"
) -> set[str]:
    """Every plaintext that ``epoch_keys`` open in any of ``memory_copies``
    (folders holding a memory.db), the copies' memory keys pooled together:
    a key of memory #i found in one copy is tried on row #i of every copy.
    ``user_id``: the store id the rows are bound to (a memory other than
    main: ``<user_id>/m/<name>``)."""
    if not epoch_keys:
        return set()
    rows_keys = [keys.subkey(k, b"rows") for k in epoch_keys]
    tables: list[tuple[str, Any, bytes]] = []
    logs: list[tuple[int, bytes]] = []
    for folder in memory_copies:
        work = folder.parent / f"{folder.name}-attack"
        shutil.copytree(folder, work)
        try:
            with raw_memory_file(work, epoch_keys[0], cipher) as conn:
                # A table a store has not written to is not made (schema.sql, "Pages").
                present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                for table, pos_sql in (
                    ("memory_keys", "chunk"),
                    ("summaries", "size || '|' || idx"),
                    ("config", "name"),
                    ("erased", "id"),
                    ("erasures", "id"),
                ):
                    if table not in present:
                        continue
                    tables += [
                        (table, pos, sealed) for pos, sealed in conn.execute(f"SELECT {pos_sql}, sealed FROM {table}")
                    ]
                logs += conn.execute("SELECT id, sealed FROM log").fetchall()
        except sqlite3.DatabaseError:
            continue  # the file key does not open this copy
        finally:
            shutil.rmtree(work)
    plain: set[str] = set()
    memory_keys: dict[int, set[bytes]] = {}
    for table, pos, sealed in tables:
        for rk in rows_keys:
            value = opens(rk, sealed, aad(user_id, table, pos))
            if value is None:
                continue
            if table == "memory_keys":
                for k in range(len(value) // KEY):
                    memory_keys.setdefault(int(pos) * 128 + k, set()).add(value[k * KEY : (k + 1) * KEY])
            else:
                plain.add(value.decode(errors="replace"))
    for i, sealed in logs:
        for mk in memory_keys.get(i, ()):
            value = opens(mk, sealed, aad(user_id, "log", i))
            if value is not None:
                plain.add(value.decode(errors="replace"))
    return plain


def text_in(marker: str, plain: set[str]) -> bool:
    return any(marker in p for p in plain)


def settle(http: Http, token: str, text: str, memory: Memory = MAIN_MEMORY) -> None:
    """Write every summary due in ``memory`` (the owner's address of it)."""
    nap_at = memory.at("/nap")
    while (nap := http.ok("POST", nap_at, token, json={})["nap"]) is not None:
        http.ok("POST", nap_at, token, json={"block": nap["block"], "text": f"{text} {nap['block']}"})
