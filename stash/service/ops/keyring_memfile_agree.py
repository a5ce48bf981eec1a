"""Whether a memory's key ring and memory file can be served together,
read without any key: what ``stash restore`` asks of each pair it brings
back from a replica, and ``stash verify`` of each memory's plain files
(docs/DESIGN.md, "Replication" and "Memories")."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ...crypto.chain import Head
from ...storage import safeopen
from ...storage.keyring import EPOCH, HEAD_COPY, STATE_COPY
from ...storage.memfile import EPOCH_META, HEAD_META, STATE_META


def meta(path: Path, table: str) -> dict[str, str]:
    """A plain file's meta table, name to value."""
    conn = safeopen.open_plain(path, read_only=True)  # a crafted view or trigger is refused, never run
    try:
        return dict(conn.execute(f"SELECT name, value FROM {table}").fetchall())
    finally:
        conn.close()


def agree(keyring: Path, memory: Path) -> str | None:
    """Why the two files cannot be served together, or None when they can:
    the key ring's copies of the log head and of the state version are not
    ahead of the memory file, and the memory file's rows are sealed under an
    epoch the key ring holds. Needs no key (the plain file's meta is clear)."""
    try:
        ring, mem = meta(keyring, "keyring_meta"), meta(memory, "meta")
    except safeopen.ForeignSchema as e:
        return f"a file holds a schema Stash does not make: {e}"
    except sqlite3.Error:
        return "a file does not open"
    copy = Head.parse(ring[HEAD_COPY]) if HEAD_COPY in ring else None
    head_text = mem.get(HEAD_META)
    if copy is not None and head_text is not None:
        count, _prev, digest = head_text.split(" ")
        if copy.count > int(count):
            return "the key ring records more memories than the memory file holds"
        if copy.count == int(count) and copy.digest.hex() != digest:
            return "the key ring's copy of the log head differs from the memory file's"
    if STATE_COPY in ring and STATE_META in mem and int(ring[STATE_COPY]) > int(mem[STATE_META].split(" ")[0]):
        return "the key ring records a later state than the memory file holds"
    if int(mem.get(EPOCH_META, "0")) > int(ring.get(EPOCH, "0")):
        return "the memory file is sealed under a key epoch the key ring does not hold"
    return None
