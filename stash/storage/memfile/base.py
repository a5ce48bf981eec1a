"""What every part of a memory file shares: the keys that open it, the names
of its meta rows, and :class:`FileBase`, the open file itself — its
connection, the state a handle holds, and the reads every part makes.

Invariant: the parts hold no state of their own; everything a handle knows
lives in the attributes of :class:`FileBase`, set by :meth:`MemoryFile._setup`
(handle.py). Each part is given this object and the other parts it calls.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.errors import Damaged
from ...crypto import aead, keys
from ...crypto.chain import Head
from ...crypto.epochs import KeyChain
from .. import formats
from ..formats import PAGE_BYTES
from ..sqlite.pool import Pool
from ..sqlite.transactions import read_snapshot
from .erasure_record import RECORD_META, Record, parse
from .row_tree import Nodes, Slot

HEAD_META = "log_head"
HOLES_META = "holes"  # JSON {size: [idx, ...]}: summaries an erasure dropped below a level's frontier
EPOCH_META = "epoch"  # the epoch whose key seals this file's rows; absent means 0
STATE_META = "state"  # "V mac": the authenticated head over the whole state (State.digest, state.py)
DROPS_META = "drops"  # JSON: which summaries were dropped at which state version (forget and erase)
# The epoch whose key sealed every row whose ``epoch`` column is NULL: the
# file's epoch when its first new epoch after this release added the column
# (Epochs.reseal, reseal.py). Absent: the file has no such column, and every row is
# sealed under the key of the epoch EPOCH_META names.
SEALED_BASE_META = "sealed_base"
KEYS_PER_CHUNK = 128  # memory keys per key chunk (log.py), each chunk sealed whole
CHUNK_BYTES = KEYS_PER_CHUNK * aead.KEY_BYTES
ERASED_KEY = bytes(aead.KEY_BYTES)
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


class FileBase:
    """One open memory file: its connection, the state its parts share, and
    the reads every part makes (its tables, meta rows, heads as stored)."""

    writer = 0
    """The grant id recorded as the writer of what this handle appends or
    settles (the session sets it; 0 records nothing)."""

    conn: sqlite3.Connection
    user_id: str
    epoch: int
    head: Head
    state_version: int
    fk: FileKeys
    path: Path
    pool: Pool | None
    may_reseal: bool
    rows_key: bytes
    keychain: KeyChain | None  # every epoch key, to open rows sealed in an earlier epoch
    epoch_keys: dict[int, bytes]  # rows keys of earlier epochs derived so far (this handle's life)
    epoch_columns: dict[str, bool]  # which sealed tables have an ``epoch`` column (this handle's life)
    seen: set[str]  # tables made on use seen to exist (FileBase.made)
    made_here: set[str]  # tables this handle made, maybe in a transaction not committed yet
    base_epoch: int  # the epoch of a row whose ``epoch`` is NULL (SEALED_BASE_META)
    chain_key: bytes
    chunks: dict[int, bytes]  # opened key chunks, cleared whenever another writer may have changed one
    chunks_pinned: bool  # inside FileBase.snapshot: the chunks stay valid for its whole read
    erased_cache: frozenset[int] | None  # the erased ids, once a request asked for them
    erasure_record: Record | None  # from mark 4: the authenticated record the erased ids come from
    erased_runs_made: tuple[object, Any] | None  # the runs made of the erased ids, and what from (tree.py)
    drops: dict[str, Any]
    # The tree of row digests (bound.py): whether this file's rows are bound,
    # the root its authenticated state holds, and the slots the write in
    # progress changed (the nodes checked are kept on the connection).
    is_bound: bool
    root: bytes
    checked: Nodes  # the nodes read through this file's connection, and the leaves checked against root
    root_seen: tuple[bytes, bool, str | None]  # root, whether bound, open chunk: as the last state digest read them
    newest: tuple[int, bytes]  # the open key chunk and its digest, which the tree does not hold (bound.py)
    binds: dict[Slot, bytes | None]
    cuts: dict[int, int]

    @property
    def erased_ids(self) -> frozenset[int]:
        """The erased memories as the authenticated state covers them: the
        erasure table's ids before mark 4 (read with the state check), from
        mark 4 the runs of the erasure record (erasure_record.py), made
        into a set only when a request first asks, so an open costs the same
        whatever was erased."""
        if self.erased_cache is None:
            record = self.erasure_record
            self.erased_cache = frozenset() if record is None else record.ids()
        return self.erased_cache

    @erased_ids.setter
    def erased_ids(self, ids: frozenset[int]) -> None:
        self.erased_cache = ids

    def is_erased(self, i: int) -> bool:
        """``i in self.erased_ids``, without making the set when the
        record's runs can answer (a request that reads a few memories)."""
        record = self.erasure_record
        if record is not None and self.erased_cache is None:
            return record.holds(i)
        return i in self.erased_ids

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """One read snapshot of the file (storage.sqlite.transactions.read_snapshot) in
        which a key chunk opened once stays opened for every call. Outside
        one, each read forgets the chunks opened before it, since another
        writer may have added keys to them since; inside one, no other
        writer's commit is visible and this handle cannot write, so a chunk
        is what the snapshot holds for as long as it lasts. Nested in another,
        it changes nothing. Inside a transaction already (a write's, which
        holds the write lock), it joins it and keeps the chunks too: no other
        writer can commit until it ends, and this handle's own writes keep the
        chunks they touch up to date (Log.append, Erasure)."""
        if self.chunks_pinned:
            with read_snapshot(self.conn):
                yield
            return
        with read_snapshot(self.conn):
            self.chunks.clear()
            self.chunks_pinned = True
            try:
                yield
            finally:
                self.chunks_pinned = False
                self.chunks.clear()

    def fresh_chunks(self) -> None:
        """Forget the opened key chunks, unless a :meth:`snapshot` keeps them."""
        if not self.chunks_pinned:
            self.chunks.clear()

    def put_meta(self, name: str, value: str) -> None:
        self.conn.execute(
            "INSERT INTO meta(name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            (name, value),
        )

    def tables(self) -> frozenset[str]:
        """The tables this file holds now (in this snapshot): an older file
        has every one, a newer one only those written to (schema.sql, "Pages")."""
        found = frozenset(r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
        self.seen.update(found - self.made_here)  # what made() remembers (the open reads this once)
        return found

    def rows(
        self, tables: frozenset[str], table: str, sql: str, args: tuple[object, ...] = ()
    ) -> list[tuple[Any, ...]]:
        """The rows ``sql`` reads from ``table``, none when it was not made yet."""
        return self.conn.execute(sql, args).fetchall() if table in tables else []

    def reading(
        self, table: str, sql: str, args: tuple[object, ...] = ()
    ) -> contextlib.AbstractContextManager[Iterable[Any]]:
        """The rows ``sql`` reads from ``table`` (none when it was not made
        yet), its statement closed when the block ends however it ends (a row
        refused as damage mid-way included): a statement left open keeps the
        file, and a read snapshot of it, open until it is garbage collected."""
        return contextlib.closing(self.conn.execute(sql, args)) if self.made(table) else contextlib.nullcontext(())

    def made(self, table: str) -> bool:
        """Whether ``table`` exists in this snapshot: every read of a table
        made on use asks first, and reads a missing one as the empty table it
        would be (schema.sql, "Pages"). A table seen is remembered for the
        handle's life (no honest writer drops one; one dropped meanwhile
        fails its query, as damage), unless this handle made it itself in a
        transaction still open: that one may still be rolled back, and with
        it the table. Found outside a transaction, it is committed."""
        if table in self.seen:
            return True
        found = (
            self.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
            is not None
        )
        if found and (table not in self.made_here or not self.conn.in_transaction):
            self.made_here.discard(table)
            self.seen.add(table)
        return found

    def top_idxs(self, sizes: list[int]) -> list[Any]:
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

    def frontiers(self, top: Any) -> list[tuple[int, Any]]:
        """``(size, MAX(idx))`` of every level 2, 4, … up to ``top``."""
        sizes = []
        size = 2
        while size <= top:
            sizes.append(size)
            size *= 2
        return list(zip(sizes, self.top_idxs(sizes), strict=True))

    def count(self) -> int:
        """T: how many memories the log holds (ids are dense from 0)."""
        if not self.made("log"):
            return 0
        return int(self.conn.execute("SELECT COALESCE(MAX(id) + 1, 0) FROM log").fetchone()[0])

    def ensure_table(self, name: str) -> None:
        """Make table ``name`` and its triggers before its first row (inside
        the caller's write transaction); in a file that records row epochs
        (:data:`SEALED_BASE_META`), a sealed table gets its ``epoch`` column
        with it, so its rows never read as sealed in the base epoch."""
        if name in self.seen:
            return
        if not self.made(name):
            self.made_here.add(name)
        formats.make_on_use(self.conn, "memory_on_use", name)
        if name in SEALED_TABLES:
            self.epoch_columns.pop(name, None)
            based = self.conn.execute("SELECT 1 FROM meta WHERE name = ?", (SEALED_BASE_META,)).fetchone()
            if based is not None and not any(r[1] == "epoch" for r in self.conn.execute(f"PRAGMA table_info({name})")):
                self.conn.execute(f"ALTER TABLE {name} ADD COLUMN epoch INTEGER")

    def format_mark(self) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()
        return None if row is None else str(row[0])

    def stored_state(self) -> tuple[int, bytes] | None:
        """The authenticated head's version and MAC as stored (state.py checks them)."""
        row = self.conn.execute("SELECT value FROM meta WHERE name = ?", (STATE_META,)).fetchone()
        if row is None:
            return None
        try:
            v, mac = row[0].split(" ")
            return int(v), bytes.fromhex(mac)
        except ValueError:
            raise Damaged(
                "The memory file's authenticated head is unreadable; restore this store from a backup."
            ) from None

    def next_version(self) -> int:
        """The state version the write in progress commits at."""
        stored = self.stored_state()
        return (stored[0] if stored else 0) + 1

    @staticmethod
    def head_text(head: Head, prev: bytes) -> str:
        return f"{head.count} {prev.hex()} {head.digest.hex()}"

    def stored_head(self) -> tuple[Head, bytes] | None:
        """The head recorded in this file and the digest before it, or None
        for a file written before the digest existed (format 1)."""
        row = self.conn.execute("SELECT value FROM meta WHERE name = ?", (HEAD_META,)).fetchone()
        if row is None:
            return None
        try:
            count, prev, digest = row[0].split(" ")
            return Head(int(count), bytes.fromhex(digest)), bytes.fromhex(prev)
        except ValueError:
            raise Damaged(
                "The memory file's recorded digest is unreadable; restore this store from a backup."
            ) from None

    def record_now(self) -> Record | None:
        """The erasure record as stored (erasure_record.py)."""
        row = self.conn.execute("SELECT value FROM meta WHERE name = ?", (RECORD_META,)).fetchone()
        return parse(None if row is None else str(row[0]))

    def read_drops(self) -> dict[str, Any]:
        """Which summaries were dropped at which state version (tree.py keeps them)."""
        row = self.conn.execute("SELECT value FROM meta WHERE name = ?", (DROPS_META,)).fetchone()
        if row is None:
            return {"s": {}, "p": {}}
        try:
            raw = json.loads(row[0])
            return {
                "s": {int(k): [(int(f), int(v)) for f, v in recs] for k, recs in raw["s"].items()},
                "p": {int(k): {int(i): int(v) for i, v in recs.items()} for k, recs in raw["p"].items()},
            }
        except (ValueError, TypeError, KeyError, AttributeError):
            raise Damaged(
                "The memory file's record of dropped summaries is unreadable; restore this store from a backup."
            ) from None
