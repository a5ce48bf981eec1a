"""What every part of a memory file shares: the keys that open it, the names
of its meta rows, the state a handle holds, and the declarations by which one
part calls another (:class:`FilePart`).

Invariant: the parts hold no state of their own; everything a handle knows
lives in the attributes declared here, set by :meth:`MemoryFile._setup`.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...crypto import keys
from ...crypto.chain import Head
from ...crypto.epochs import KeyChain
from .. import formats
from ..files import PAGE_BYTES
from ..pool import Pool

HEAD_META = "log_head"
HOLES_META = "holes"  # JSON {size: [idx, ...]}: summaries an erasure dropped below a level's frontier
EPOCH_META = "epoch"  # the epoch whose key seals this file's rows; absent means 0
STATE_META = "state"  # "V mac": the authenticated head over the whole state (MemoryFile._state_digest)
DROPS_META = "drops"  # JSON: which summaries were dropped at which state version (forget and erase)

ROLLED_BACK = ("The end of this memory's log disagrees with its recorded digest: the file was cut short or "
               "replaced with an older copy. Nothing was served; the operator should run `stash verify` and "
               "restore this store from a backup.")


@dataclass(frozen=True)
class FileKeys:
    """What opening one memory file takes: handed to a recall worker process
    for the length of one request, never stored."""

    path: Path
    user_id: str
    cipher: str
    rows_key: bytes = field(repr=False)
    file_key: bytes | None = field(repr=False)
    chain_key: bytes = field(repr=False, default=b"")
    epoch: int = 0
    page_bytes: int = PAGE_BYTES  # what a SQLCipher file is read with (Keyring.memory_page_bytes)

    @classmethod
    def derive(cls, path: Path, user_id: str, chain: KeyChain, cipher: str,
               page_bytes: int = PAGE_BYTES) -> FileKeys:
        """The file key and the digest key come from epoch 0's key (they stay
        the same for the life of the file); the rows key is the current
        epoch's, so nothing sealed in this epoch opens with an older key."""
        file_key = keys.subkey(chain.base, b"file") if cipher == "sqlcipher" else None
        return cls(Path(path), user_id, cipher, keys.subkey(chain.current, b"rows"), file_key,
                   keys.subkey(chain.base, b"chain"), chain.epoch, page_bytes)


class FilePart:
    """The state of one open memory file, shared by its parts."""

    writer = 0
    """The grant id recorded as the writer of what this handle appends or
    settles (the session sets it; 0 records nothing)."""

    conn: sqlite3.Connection
    user_id: str
    epoch: int
    head: Head
    state_version: int
    _fk: FileKeys
    _path: Path
    _pool: Pool | None
    _may_reseal: bool
    _rows_key: bytes
    _chain_key: bytes
    _chunks: dict[int, bytes]  # opened key chunks, cleared whenever another writer may have changed one
    _erased_ids: frozenset[int]
    _drops: dict[str, Any]

    def _put_meta(self, name: str, value: str) -> None:
        self.conn.execute("INSERT INTO meta(name, value) VALUES (?, ?) "
                          "ON CONFLICT(name) DO UPDATE SET value = excluded.value", (name, value))

    def _tables(self) -> frozenset[str]:
        """The tables this file holds now (in this snapshot): an older file
        has every one, a newer one only those written to (schema.sql, "Pages")."""
        return frozenset(r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))

    def _rows(self, tables: frozenset[str], table: str, sql: str,
              args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        """The rows ``sql`` reads from ``table``, none when it was not made yet."""
        return self.conn.execute(sql, args).fetchall() if table in tables else []

    def count(self) -> int:
        """T: how many memories the log holds (ids are dense from 0)."""
        return int(self.conn.execute("SELECT COALESCE(MAX(id) + 1, 0) FROM log").fetchone()[0])

    def _ensure_table(self, name: str) -> None:
        formats.make_on_use(self.conn, "memory_on_use", name)

    if TYPE_CHECKING:  # what one part calls of another; each is defined once, in its part
        def _write_state(self) -> int: ...
        def _next_version(self) -> int: ...
        def _stored_state(self) -> tuple[int, bytes] | None: ...
        def _state_digest(self) -> tuple[bytes, frozenset[int]]: ...
        def _state_mac(self, version: int, digest: bytes, rows_key: bytes | None = None) -> bytes: ...
        def _stored_head(self) -> tuple[Head, bytes] | None: ...
        def recompute_head(self) -> tuple[Head, bytes]: ...
        @staticmethod
        def _head_text(head: Head, prev: bytes) -> str: ...
        def _read_drops(self) -> dict[str, Any]: ...
        def _drop_erased(self, fresh: list[int], T: int, version: int) -> list[tuple[int, int]]: ...
        def memory(self, i: int) -> tuple[int, str, str]: ...
        def memories(self, lo: int, hi: int) -> list[tuple[int, str, str]]: ...
        def _chunk(self, c: int, *, create: bool = False) -> bytes | None: ...
        def _memory_key(self, i: int, *, create: bool = False) -> bytes | None: ...
