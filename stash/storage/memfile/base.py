"""What every part of a memory file shares: the keys that open it, the names
of its meta rows, the state a handle holds, and the declarations by which one
part calls another (:class:`FilePart`).

Invariant: the parts hold no state of their own; everything a handle knows
lives in the attributes declared here, set by :meth:`MemoryFile._setup`.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...crypto import keys
from ...crypto.chain import Head
from ...crypto.epochs import KeyChain
from .. import formats
from ..formats import PAGE_BYTES
from ..sqlite.pool import Pool
from ..sqlite.transactions import read_snapshot
from .erasure_record import Record

if TYPE_CHECKING:
    from .row_tree import Nodes, Slot

HEAD_META = "log_head"
HOLES_META = "holes"  # JSON {size: [idx, ...]}: summaries an erasure dropped below a level's frontier
EPOCH_META = "epoch"  # the epoch whose key seals this file's rows; absent means 0
STATE_META = "state"  # "V mac": the authenticated head over the whole state (MemoryFile._state_digest)
DROPS_META = "drops"  # JSON: which summaries were dropped at which state version (forget and erase)
# The epoch whose key sealed every row whose ``epoch`` column is NULL: the
# file's epoch when its first new epoch after this release added the column
# (MemoryFile.reseal). Absent: the file has no such column, and every row is
# sealed under the key of the epoch EPOCH_META names.
SEALED_BASE_META = "sealed_base"
SEALED_TABLES = ("memory_keys", "summaries", "config", "erased", "erasures")  # rows under an epoch's rows key

ROLLED_BACK = (
    "The end of this memory's log disagrees with its recorded digest: the file was cut short or "
    "replaced with an older copy. Nothing was served; the operator should run `stash verify` and "
    "restore this store from a backup."
)


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
    def derive(cls, path: Path, user_id: str, chain: KeyChain, cipher: str, page_bytes: int = PAGE_BYTES) -> FileKeys:
        """The file key and the digest key come from epoch 0's key (they stay
        the same for the life of the file); the rows key is the current
        epoch's, so nothing sealed in this epoch opens with an older key."""
        file_key = keys.subkey(chain.base, b"file") if cipher == "sqlcipher" else None
        return cls(
            Path(path),
            user_id,
            cipher,
            keys.subkey(chain.current, b"rows"),
            file_key,
            keys.subkey(chain.base, b"chain"),
            chain.epoch,
            page_bytes,
        )


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
    _keychain: KeyChain | None  # every epoch key, to open rows sealed in an earlier epoch
    _epoch_keys: dict[int, bytes]  # rows keys of earlier epochs derived so far (this handle's life)
    _epoch_columns: dict[str, bool]  # which sealed tables have an ``epoch`` column (this handle's life)
    _seen: set[str]  # tables made on use seen to exist (FilePart._made)
    _made_here: set[str]  # tables this handle made, maybe in a transaction not committed yet
    _base_epoch: int  # the epoch of a row whose ``epoch`` is NULL (SEALED_BASE_META)
    _chain_key: bytes
    _chunks: dict[int, bytes]  # opened key chunks, cleared whenever another writer may have changed one
    _chunks_pinned: bool  # inside FilePart.snapshot: the chunks stay valid for its whole read
    _erased_cache: frozenset[int] | None  # the erased ids, once a request asked for them
    _erasure_record: Record | None  # from mark 4: the authenticated record the erased ids come from
    _drops: dict[str, Any]
    # The tree of row digests (bound.py): whether this file's rows are bound,
    # the root its authenticated state holds, and the slots the write in
    # progress changed (the nodes checked are kept on the connection).
    _bound: bool
    _root: bytes
    _checked: Nodes  # the nodes read through this file's connection, and the leaves checked against _root
    _root_seen: tuple[bytes, bool, str | None]  # root, whether bound, open chunk: as the last state digest read them
    _newest: tuple[int, bytes]  # the open key chunk and its digest, which the tree does not hold (bound.py)
    _binds: dict[Slot, bytes | None]
    _cuts: dict[int, int]

    @property
    def _erased_ids(self) -> frozenset[int]:
        """The erased memories as the authenticated state covers them: the
        erasure table's ids before mark 4 (read with the state check), from
        mark 4 the runs of the erasure record (erasure_record.py), made
        into a set only when a request first asks, so an open costs the same
        whatever was erased."""
        if self._erased_cache is None:
            record = self._erasure_record
            self._erased_cache = frozenset() if record is None else record.ids()
        return self._erased_cache

    @_erased_ids.setter
    def _erased_ids(self, ids: frozenset[int]) -> None:
        self._erased_cache = ids

    def _is_erased(self, i: int) -> bool:
        """``i in self._erased_ids``, without making the set when the
        record's runs can answer (a request that reads a few memories)."""
        record = self._erasure_record
        if record is not None and self._erased_cache is None:
            return record.holds(i)
        return i in self._erased_ids

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """One read snapshot of the file (storage.sqlite.transactions.read_snapshot) in
        which a key chunk opened once stays opened for every call. Outside
        one, each read forgets the chunks opened before it, since another
        writer may have added keys to them since; inside one, no other
        writer's commit is visible and this handle cannot write, so a chunk
        is what the snapshot holds for as long as it lasts. Joined (nested,
        or inside a write transaction, whose own writes keep the chunks they
        touch up to date), it changes nothing."""
        if self.conn.in_transaction:
            with read_snapshot(self.conn):
                yield
            return
        with read_snapshot(self.conn):
            self._chunks.clear()
            self._chunks_pinned = True
            try:
                yield
            finally:
                self._chunks_pinned = False
                self._chunks.clear()

    def _fresh_chunks(self) -> None:
        """Forget the opened key chunks, unless a :meth:`snapshot` keeps them."""
        if not self._chunks_pinned:
            self._chunks.clear()

    def _put_meta(self, name: str, value: str) -> None:
        self.conn.execute(
            "INSERT INTO meta(name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            (name, value),
        )

    def _tables(self) -> frozenset[str]:
        """The tables this file holds now (in this snapshot): an older file
        has every one, a newer one only those written to (schema.sql, "Pages")."""
        found = frozenset(r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
        self._seen.update(found - self._made_here)  # what _made remembers (the open reads this once)
        return found

    def _rows(
        self, tables: frozenset[str], table: str, sql: str, args: tuple[object, ...] = ()
    ) -> list[tuple[Any, ...]]:
        """The rows ``sql`` reads from ``table``, none when it was not made yet."""
        return self.conn.execute(sql, args).fetchall() if table in tables else []

    def _reading(
        self, table: str, sql: str, args: tuple[object, ...] = ()
    ) -> contextlib.AbstractContextManager[Iterable[Any]]:
        """The rows ``sql`` reads from ``table`` (none when it was not made
        yet), its statement closed when the block ends however it ends (a row
        refused as damage mid-way included): a statement left open keeps the
        file, and a read snapshot of it, open until it is garbage collected."""
        return contextlib.closing(self.conn.execute(sql, args)) if self._made(table) else contextlib.nullcontext(())

    def _made(self, table: str) -> bool:
        """Whether ``table`` exists in this snapshot: every read of a table
        made on use asks first, and reads a missing one as the empty table it
        would be (schema.sql, "Pages"). A table seen is remembered for the
        handle's life (no honest writer drops one; one dropped meanwhile
        fails its query, as damage), unless this handle made it itself in a
        transaction still open: that one may still be rolled back, and with
        it the table. Found outside a transaction, it is committed."""
        if table in self._seen:
            return True
        found = (
            self.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
            is not None
        )
        if found and (table not in self._made_here or not self.conn.in_transaction):
            self._made_here.discard(table)
            self._seen.add(table)
        return found

    def _top_idxs(self, sizes: list[int]) -> list[Any]:
        """``SELECT MAX(idx) FROM summaries WHERE size = ?`` for each of
        ``sizes``, in one statement (one indexed read per level, as many
        statements would make; a request reads every level's frontier two
        or three times, and a statement's own cost was most of each)."""
        out: list[Any] = []
        for k in range(0, len(sizes), 64):
            part = sizes[k : k + 64]
            sql = "SELECT " + ", ".join(["(SELECT MAX(idx) FROM summaries WHERE size = ?)"] * len(part))
            out += list(self.conn.execute(sql, part).fetchone())
        return out

    def _frontiers(self, top: Any) -> list[tuple[int, Any]]:
        """``(size, MAX(idx))`` of every level 2, 4, … up to ``top``."""
        sizes = []
        size = 2
        while size <= top:
            sizes.append(size)
            size *= 2
        return list(zip(sizes, self._top_idxs(sizes), strict=True))

    def count(self) -> int:
        """T: how many memories the log holds (ids are dense from 0)."""
        if not self._made("log"):
            return 0
        return int(self.conn.execute("SELECT COALESCE(MAX(id) + 1, 0) FROM log").fetchone()[0])

    def _ensure_table(self, name: str) -> None:
        """Make table ``name`` and its triggers before its first row (inside
        the caller's write transaction); in a file that records row epochs
        (:data:`SEALED_BASE_META`), a sealed table gets its ``epoch`` column
        with it, so its rows never read as sealed in the base epoch."""
        if name in self._seen:
            return
        if not self._made(name):
            self._made_here.add(name)
        formats.make_on_use(self.conn, "memory_on_use", name)
        if name in SEALED_TABLES:
            self._epoch_columns.pop(name, None)
            based = self.conn.execute("SELECT 1 FROM meta WHERE name = ?", (SEALED_BASE_META,)).fetchone()
            if based is not None and not any(r[1] == "epoch" for r in self.conn.execute(f"PRAGMA table_info({name})")):
                self.conn.execute(f"ALTER TABLE {name} ADD COLUMN epoch INTEGER")

    if TYPE_CHECKING:  # what one part calls of another; each is defined once, in its part

        def _write_state(self) -> int: ...
        def format_mark(self) -> str | None: ...
        def check_erasure_record(self) -> None: ...
        def _record_now(self) -> Record | None: ...
        def _refresh_state(self) -> None: ...
        def _next_version(self) -> int: ...
        def _stored_state(self) -> tuple[int, bytes] | None: ...
        def _state_digest(self) -> tuple[bytes, frozenset[int] | None]: ...
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
        def chain_rows(self, rows: Iterable[tuple[int, bytes]]) -> Iterator[bytes]: ...
        def _open_row(self, i: int, key: bytes, stored: bytes) -> bytes: ...
        def _short_rows(self, ids: list[int]) -> dict[int, bytes]: ...
        def _ensure_tails(self) -> None: ...
        def _open_bound(self, slot: Slot, sealed: bytes, epoch: int | None, position: str | int) -> bytes: ...
        def _authentic(self, slot: Slot, sealed: bytes, epoch: int | None) -> tuple[bytes, int | None]: ...
        def _bind(self, slot: Slot, sealed: bytes | None) -> None: ...
        def _bind_from(self, kind: int, start: int) -> None: ...
        def _apply_binds(self) -> None: ...
        def _stored_node(self, node: int) -> bytes: ...
        def _row_at(self, slot: Slot, epoch_sql: str) -> tuple[bytes, int | None] | None: ...
        def _trust_root(self, root: bytes, bound: bool, open_chunk: str | None) -> None: ...
        def build_row_digests(self) -> None: ...
