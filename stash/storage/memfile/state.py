"""Whole-state authentication: the state digest over everything an answer
depends on besides the log rows, its version and MAC, checked on every open.

Every write advances the head last, inside its own transaction
(:meth:`State.write`), so the head and the state commit together;
what leaves a handle is read back from what the file committed
(:meth:`State.committed`).
"""

from __future__ import annotations

import hashlib
import hmac
import sqlite3

from ...core.errors import Damaged, RolledBack
from ...crypto import aead, keys
from ...crypto.chain import Head
from .. import formats
from ..sqlite.transactions import read_snapshot, write_transaction
from .base import DROPS_META, EPOCH_META, HEAD_META, HOLES_META, ROLLED_BACK, STATE_META, FileBase
from .bound import BOUND_MARK, OPEN_META, RECORD_MARKS, RowDigests
from .erasure_record import RECORD_META, Record, counts, from_tables
from .row_tree import ROOT

STATE_GONE = (
    "This memory file's authenticated head was deleted (its key ring records one). Nothing was served; "
    "the operator should run `stash verify` and restore this store from a backup."
)


LEGACY_MARKS = (None, "1", "2")  # format marks written before the mark was authenticated
AUTHENTICATED_MARK = "3"  # formats.py, "authenticated format"
AUTHENTICATED_MARKS = (AUTHENTICATED_MARK, *RECORD_MARKS)  # the mark inside the MAC, the key ring's copies sealed
RING_UNSEALED = (
    "This memory file's authenticated format says its key ring's copies are sealed, and they are not "
    "(deleted, or put back from an older key ring). Nothing was served; the operator should run "
    "`stash verify` and restore this store from a backup."
)
NEWER_WITHOUT_STATE = (
    "This memory file has no authenticated head but shows a format that always has one (it was "
    "deleted, so an older format could be claimed). Nothing was served; the operator should run "
    "`stash verify` and restore this store from a backup."
)


class State:
    """The authenticated state of ``file``: its digest and MAC under the rows
    key (``codec``'s file), over the root of ``digests``' tree, checked on
    open and advanced by every write."""

    def __init__(self, file: FileBase, digests: RowDigests) -> None:
        self.file = file
        self.digests = digests

    def _newer_than_stateless(self) -> str | None:
        """What in this file shows a format newer than the last one without
        a state head (before 0.2.0), or None: an authenticated mark, a key
        epoch, the drop records, pages other than 16 KiB, a table made on
        use still absent, a row or summary of a later length. Each is
        written only by releases that also write the state head, and the row
        and summary lengths are sealed (not editable); run only for a file
        that lacks its head, so its full scans of the log are rare."""
        meta = dict(self.file.conn.execute("SELECT name, value FROM meta"))
        if meta.get("format") not in LEGACY_MARKS:
            return "format mark"
        for name in (EPOCH_META, DROPS_META):
            if name in meta:
                return f"meta {name}"
        if int(self.file.conn.execute("PRAGMA page_size").fetchone()[0]) != formats.LEGACY_PAGE_BYTES:
            return "page size"
        if not formats.on_use_tables("memory_on_use") <= self.file.tables():
            return "tables made on use"
        # Every length but the one rows and summaries had then: a later layout
        # (a row format added after this one included) shows as newer.
        older = (("log", formats.OLDER_MEMORY_PLAINTEXT_BYTES), ("summaries", formats.SUMMARY_PLAINTEXT_BYTES))
        for table, plain in older:
            if self.file.conn.execute(
                f"SELECT 1 FROM {table} WHERE length(sealed) != ? LIMIT 1", (plain + aead.OVERHEAD,)
            ).fetchone():
                return f"{table} row length"
        return None

    def refuse_stateless(self, recorded: bool) -> None:
        """Refuse a file without its state head unless it is a file of a
        store from before 0.2.0 as such a store is (:meth:`check`
        gives it one): before anything re-seals or upgrades it, so no later
        step can bless a file whose head was deleted."""
        if self.file.stored_state() is not None:
            return
        if recorded:
            raise Damaged(STATE_GONE)
        shown = self._newer_than_stateless()
        if shown is not None:
            raise Damaged(NEWER_WITHOUT_STATE.replace(" (it was", f" ({shown}; it was"))

    def check_ring_sealed(self, sealed: bool) -> None:
        """Refuse this file when its authenticated format (mark 3) says the
        key ring's copies are sealed and they are not (``sealed`` False)."""
        if not sealed and self.file.format_mark() in AUTHENTICATED_MARKS:
            raise Damaged(RING_UNSEALED)

    def authenticate_format(self) -> bool:
        """Move this file to the newest format, mark 5: the mark inside the
        state MAC (mark 3), the erasure record for the erasure rows (mark 4,
        erasure_record.py), the tree of row digests (bound.py). Only once the
        key ring's copies are sealed (the session sees to it), so a crash in
        between leaves a pair that opens; and only a file whose state still
        matches its head in this transaction, so the record and the tree are
        made from authenticated rows. Best effort: False when the file cannot
        be written now."""
        try:
            with write_transaction(self.file.conn):
                stored = self.file.stored_state()
                mark = self.file.format_mark()
                if mark == BOUND_MARK or stored is None:
                    return False
                if not hmac.compare_digest(stored[1], self.mac(stored[0], self.digest()[0])):
                    return False  # changed since it was opened: the next open refuses or upgrades it
                if mark not in RECORD_MARKS:
                    self.file.put_meta(RECORD_META, from_tables(self.file.conn, self.file.tables()).text())
                self.digests.build()
                self.file.put_meta("format", BOUND_MARK)
                self.write()
        except (sqlite3.Error, OSError):
            return False
        self.file.state_version = self.committed()[1]
        return True

    def _state_key(self) -> bytes:
        return keys.subkey(self.file.rows_key, b"state")

    def digest(self) -> tuple[bytes, frozenset[int] | None]:
        """A digest of everything in this file that a request's answer
        depends on, besides the log rows (which the running digest covers and
        the per-memory keys bind): the log head, the key epoch, every config
        row as stored, the erasures, the holes and drop records, each summary
        level's frontier, and the log's append-only triggers. The erasures
        are, from mark 4, the erasure record (erasure_record.py: counts, a
        digest of the rows, the erased ids as runs), so an open costs the same
        whatever was erased; before it, every erasure-date and receipt row.
        The summary tree is covered by one indexed read per level and by
        :meth:`SummaryTree._summary_valid`, and from mark 5 each row of it by the tree
        of row digests (bound.py), whose root is left in ``_root_seen``.
        Returns the erased ids too before mark 4 (None from it: the record's)."""
        h = hashlib.blake2b(digest_size=32, person=b"stash.state")

        def put(*parts: object) -> None:
            for part in parts:
                b = part if isinstance(part, bytes) else str(part).encode()
                h.update(len(b).to_bytes(8, "big"))
                h.update(b)

        meta = dict(
            self.file.conn.execute(
                "SELECT name, value FROM meta WHERE name IN (?, ?, ?, ?, ?, ?, 'format')",
                (HEAD_META, EPOCH_META, HOLES_META, DROPS_META, RECORD_META, OPEN_META),
            )
        )
        put(
            self.file.user_id, *(f"{name}={meta.get(name)}" for name in (HEAD_META, EPOCH_META, HOLES_META, DROPS_META))
        )
        if meta.get("format") not in LEGACY_MARKS:
            # From mark 3 on the mark is inside the MAC, so no older format can
            # be claimed by editing it (a file at 1 or 2 digests as they did).
            put("format", meta.get("format"))
        # A table not made yet reads as the empty one it would be: making one
        # changes nothing here, dropping one that held rows changes it.
        tables = self.file.tables()
        for name, sealed in self.file.rows(tables, "config", "SELECT name, sealed FROM config ORDER BY name"):
            put("config", name, sealed)
        erased: list[int] | None = None
        if meta.get("format") in RECORD_MARKS:
            put("erasure_record", meta.get(RECORD_META))
        else:
            erased = []
            for i, sealed in self.file.rows(tables, "erased", "SELECT id, sealed FROM erased ORDER BY id"):
                put("erased", i, sealed)
                erased.append(i)
            for rid, sealed in self.file.rows(tables, "erasures", "SELECT id, sealed FROM erasures ORDER BY id"):
                put("erasures", rid, sealed)
        top = (
            (self.file.conn.execute("SELECT MAX(size) FROM summaries").fetchone()[0] or 0)
            if "summaries" in tables
            else 0
        )
        for size, top_idx in self.file.frontiers(top):
            put("level", size, top_idx)
        for name, sql in self.file.conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'log' ORDER BY name"
        ):
            put("trigger", name, sql)
        bound = meta.get("format") == BOUND_MARK
        self.file.root_seen = (
            self.digests.stored_node(ROOT) if bound else b"",
            bound,
            meta.get(OPEN_META) if bound else None,
        )
        if bound:
            put("row_digests", self.file.root_seen[0], self.file.root_seen[2] or "")
        return h.digest(), None if erased is None else frozenset(erased)

    def _take_erased(self, erased: frozenset[int] | None, record: Record | None) -> None:
        """What this handle serves as erased from now on: the ids the state
        digest read (before mark 4), or the record's (from it, made into a
        set only when asked)."""
        if erased is None:
            if record != self.file.erasure_record:  # a write that erased nothing keeps the set made
                self.file.erased_cache = None
        else:
            self.file.erased_ids = erased
        self.file.erasure_record = record

    def mac(self, version: int, digest: bytes, rows_key: bytes | None = None) -> bytes:
        key = self._state_key() if rows_key is None else keys.subkey(rows_key, b"state")
        return hashlib.blake2b(
            version.to_bytes(8, "big") + digest, key=key, digest_size=32, person=b"stash.state.mac"
        ).digest()

    def write(self) -> int:
        """Advance the state head over what this write transaction leaves:
        version + 1, MAC over the new digest. Every write calls it last,
        inside its transaction, so the head and the state commit together.

        Nothing outside the file is told the new version here: the
        transaction may still be rolled back (a batch's savepoint, a refusal
        of the caller's, a failed commit). What leaves this handle is read
        back from what the file committed (:meth:`committed`)."""
        self.digests.apply_binds()  # the tree of row digests first: the state digest covers its root
        stored = self.file.stored_state()
        version = (stored[0] if stored else 0) + 1
        digest, erased = self.digest()
        self.file.put_meta(STATE_META, f"{version} {self.mac(version, digest).hex()}")
        self._take_erased(erased, None if erased is not None else self.file.record_now())
        self.digests.trust_root(*self.file.root_seen)
        return version

    def committed(self) -> tuple[Head, int]:
        """The log head and state version this file holds committed now, read
        in one snapshot outside any transaction: the only values a copy kept
        elsewhere (the key ring's) may be raised to. A version this handle
        wrote in a transaction that was then rolled back is never among them,
        and a version another writer committed meanwhile is as good as its
        own (versions only grow while nothing is rolled back)."""
        if self.file.conn.in_transaction:
            raise RuntimeError("committed() reads what is committed: no transaction may be open")
        self.file.conn.execute("BEGIN")
        try:
            stored, state = self.file.stored_head(), self.file.stored_state()
        finally:
            self.file.conn.execute("COMMIT")
        return (self.file.head if stored is None else stored[0]), (0 if state is None else state[0])

    def load(self) -> None:
        self.file.drops = self.file.read_drops()

    def check(self, recorded: bool = False) -> None:
        """Refuse this file unless its state matches its authenticated head
        (one snapshot). A file written before the head existed gets one now,
        once (best effort: a read-only file is served as it is, unchecked,
        until it can be written) — unless the key ring ``recorded`` a copy of
        its state version: then the head was deleted, and the file is refused
        as damaged with nothing written into it."""
        with read_snapshot(self.file.conn):  # joins the request's snapshot when a refresh runs inside one
            stored = self.file.stored_state()
            digest, erased = self.digest()
            drops = self.file.read_drops()
            # From mark 4: the record, and how many rows the two tables hold
            # (SQLite counts cells; no row is read), in the same snapshot.
            record = self.file.record_now() if erased is None else None
            held = counts(self.file.conn, self.file.tables()) if erased is None else (0, 0)
        if stored is None:
            if recorded:
                raise Damaged(STATE_GONE)
            try:
                with write_transaction(self.file.conn):
                    if self.file.stored_state() is None:
                        self.write()
            except Exception as exc:
                if isinstance(exc, Damaged):
                    raise
                self._take_erased(erased, record)
                self.file.drops = drops
                return
            return self.check()
        version, mac = stored
        if not hmac.compare_digest(mac, self.mac(version, digest)):
            raise Damaged(
                "This memory file's state does not match its authenticated head: a row or page was "
                "put back from an older copy, deleted, or altered. Nothing was served; the operator "
                "should run `stash verify` and restore this store from a backup."
            )
        if erased is None and held != ((0, 0) if record is None else (record.erased, record.receipts)):
            raise Damaged(
                "This memory file's erasures do not match its authenticated record: an erasure or "
                "receipt row was deleted, added or put back. Nothing was served; the operator should run "
                "`stash verify` and restore this store from a backup."
            )
        self.file.state_version, self.file.drops = version, drops
        self._take_erased(erased, record)
        self.digests.trust_root(*self.file.root_seen)  # the root this snapshot's digest read

    def refresh(self) -> None:
        """Authenticate the state again as the file holds it now, as an open
        does: another worker may have written since this handle opened, and
        what is served as erased, or as a bound row, is only what the
        authenticated record or tree names. A file without a head stays as is."""
        if self.file.stored_state() is not None:
            self.check()

    def check_copy(self, copy: int | None) -> None:
        """Refuse this file if the key ring's copy of the state version is
        ahead of it: the file was put back whole from an older copy."""
        if copy is not None and copy > self.file.state_version:
            raise RolledBack(ROLLED_BACK)
