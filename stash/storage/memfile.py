"""A user's memory file: the sealed log, summary tree and config.

Opened for one request with the master key, closed at its end. Every value is
sealed with associated data naming its user, table and position, and any value
that fails to open raises :class:`Damaged` — it is never served.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.blocks import Settled, erase_span, forget_span, levels
from ..core.errors import Damaged, PinMismatch, RolledBack, Unavailable
from ..core.lines import plural
from ..crypto import aead, chain, keys
from ..crypto.chain import Head
from ..crypto.epochs import KeyChain
from . import scancache
from .files import (
    PAGE_BYTES,
    MissingFile,
    checkpoint,
    connect,
    flush,
    release,
    storage_error,
    write_transaction,
)
from .idempotency import Records
from .pool import Pool
from .schema import sections

# A memory's plaintext: 2-byte length + "YYYY-MM-DD " + up to 280 bytes, padded,
# then the writer (297 bytes at most). 312 makes a sealed row 352 bytes, so a
# 4 KiB page holds 11 log rows where 320 fitted 10. Rows of earlier releases
# are 320; both open, each row has one length.
MEMORY_PLAINTEXT_BYTES = 312
LARGEST_MEMORY_PLAINTEXT = 320
SUMMARY_PLAINTEXT_BYTES = 288
SUMMARY_VERSION_BYTES = 8  # a summary's plaintext starts with the state version it was written at
# The grant that wrote a memory or a summary: the last bytes of its padded
# plaintext, sealed with it (0: not recorded, as in rows written before this
# field). The text's own padding leaves room for it, so it costs no byte.
WRITER_BYTES = 4
KEYS_PER_CHUNK = 128
CHUNK_BYTES = KEYS_PER_CHUNK * aead.KEY_BYTES
ERASED_KEY = bytes(aead.KEY_BYTES)
SCAN_BATCH = 32 * KEYS_PER_CHUNK  # whole chunks, so a batch starts on a chunk boundary

ERASED = "[erased]"


def _raise_if_unavailable(exc: Exception, folder: Path) -> None:
    """A file that cannot be opened for a reason outside its bytes (a full
    disk, a read-only folder) is reported as that, not as damage; the file's
    ``folder`` tells a full disk from an unreadable file, since SQLite
    reports a WAL index it had no room to create as an I/O error."""
    err = storage_error(exc, folder)
    if isinstance(err, Unavailable):
        raise err from None


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


HEAD_META = "log_head"
HOLES_META = "holes"  # JSON {size: [idx, ...]}: summaries an erasure dropped below a level's frontier
EPOCH_META = "epoch"  # the epoch whose key seals this file's rows; absent means 0
STATE_META = "state"  # "V mac": the authenticated head over the whole state (MemoryFile._state_digest)
DROPS_META = "drops"  # JSON: which summaries were dropped at which state version (forget and erase)
RESEAL_BATCH = 4096
FORMAT = "2"  # 1: no running digest; opening a format-1 file computes it once

ROLLED_BACK = ("The end of this memory's log disagrees with its recorded digest: the file was cut short or "
               "replaced with an older copy. Nothing was served; the operator should run `stash verify` and "
               "restore this store from a backup.")


STATE_GONE = ("This memory file's authenticated head was deleted (its key ring records one). Nothing was served; "
              "the operator should run `stash verify` and restore this store from a backup.")
DIGEST_GONE = ("This memory file's recorded digest was deleted (the file's format records one). Nothing was "
               "served; the operator should run `stash verify` and restore this store from a backup.")


KEYS_BEHIND = ("This memory file was sealed in a later key epoch than its key ring knows: the key ring was "
               "replaced with an older copy. Nothing was served; the operator should run `stash verify` and "
               "restore this store from a backup.")


class KeysBehind(RolledBack):
    """The file's rows are sealed in a later epoch than the key chain it was
    opened with: an older key ring was put back (or, during a revocation, the
    request read the ring just before the epoch moved)."""


def check_not_behind(fk: FileKeys) -> None:
    """Refuse (:class:`KeysBehind`) when the memory file at ``fk.path`` says
    its rows are sealed in a later key epoch than ``fk``'s: the key ring (or
    a page of it) was put back from before a revocation or rotation. Reads
    that one value only, so the key-ring routes stay usable when the file is
    missing or damaged (then nothing is refused here: an owner can still
    revoke a leaked token)."""
    try:
        conn = connect(fk.path, file_key=fk.file_key, cipher=fk.cipher, page_bytes=fk.page_bytes)
    except Exception:  # missing, damaged, busy: the key-ring route goes on
        return
    try:
        row = conn.execute("SELECT value FROM meta WHERE name = ?", (EPOCH_META,)).fetchone()
        epoch = 0 if row is None else int(row[0])
    except Exception:
        epoch = 0
    finally:
        release(conn, fk.path, fk.file_key)
    if epoch > fk.epoch:
        raise KeysBehind(KEYS_BEHIND)


class ResealDue(Exception):
    """The file is from an earlier epoch than the key chain, and this open
    may not re-seal it: the caller re-seals it while no other request has the
    file open (access.Session.memory), since a request still working under
    the old epoch's keys would otherwise read or write across the change."""


class MemoryFile:
    writer = 0
    """The grant id recorded as the writer of what this handle appends or
    settles (the session sets it; 0 records nothing)."""

    def __init__(self, path: Path, user_id: str, master: bytes | KeyChain, cipher: str, *,
                 create: bool = False, page_bytes: int = PAGE_BYTES, recorded: bool = False,
                 pool: Pool | None = None, reseal: bool = True) -> None:
        """``page_bytes``: the page size of a new file, or the one an existing
        SQLCipher file was made with (the key ring records it). ``recorded``:
        the key ring holds a copy of this file's state version, so the file
        had one (:meth:`_check_state`). ``pool``: where its connection may be
        kept between requests. ``reseal`` False: a file from an earlier epoch
        raises :class:`ResealDue` instead of being re-sealed here."""
        self._pool = pool
        self._may_reseal = reseal
        keychain = master if isinstance(master, KeyChain) else KeyChain(user_id, (master,))
        self._setup(FileKeys.derive(path, user_id, keychain, cipher, page_bytes), create, keychain, recorded)

    def file_keys(self) -> FileKeys:
        return self._fk

    def _setup(self, fk: FileKeys, create: bool, keychain: KeyChain | None = None, recorded: bool = False) -> None:
        self._fk = fk
        self._path = fk.path
        self.user_id = user_id = fk.user_id
        self._rows_key = fk.rows_key
        path, file_key, cipher = fk.path, fk.file_key, fk.cipher
        try:
            self.conn = connect(path, file_key=file_key, cipher=cipher, create=create, page_bytes=fk.page_bytes,
                                pool=self._pool)
        except MissingFile:
            raise
        except Exception as exc:
            _raise_if_unavailable(exc, path.parent)
            raise Damaged(
                "The memory file cannot be opened: it is damaged or was replaced; restore it from a backup."
            ) from None
        self._chain_key = fk.chain_key
        self.epoch = fk.epoch
        self._chunks: dict[int, bytes] = {}
        self.state_version = 0
        self._erased_ids: frozenset[int] = frozenset()
        self._drops: dict[str, Any] = {"s": {}, "p": {}}
        try:
            if create:
                # Only the tables every store uses; the others are made by
                # their first write (schema.sql, "Pages").
                self.conn.executescript(sections()["memory"])
                self.head = Head(0, chain.genesis(self._chain_key, user_id))
                self.conn.execute(
                    "INSERT INTO meta(name, value) VALUES ('user_id', ?), ('format', ?), (?, ?), (?, ?)",
                    (user_id, FORMAT, HEAD_META, self._head_text(self.head, b""), EPOCH_META, str(fk.epoch)),
                )
                with write_transaction(self.conn):
                    self._write_state()
                self._load_state()
                self.state_version = self.committed()[1]
            else:
                row = self.conn.execute("SELECT value FROM meta WHERE name = 'user_id'").fetchone()
                if not row or row[0] != user_id:
                    raise Damaged("This memory file does not belong to this user; restore it from a backup.")
                self._match_epoch(keychain)
                self.head = self._verified_head()
                self._check_state(recorded)
        except (Damaged, ResealDue):
            self.conn.close()
            raise
        except Exception as exc:
            self.conn.close()
            _raise_if_unavailable(exc, path.parent)
            raise Damaged(
                "The memory file cannot be opened: it is damaged or was replaced; restore it from a backup."
            ) from None

    def idempotency_records(self) -> Records:
        return Records(self.conn)

    def close(self) -> None:
        self._chunks.clear()
        self._rows_key = b""
        self._chain_key = b""
        if self._fk is None:
            return  # closed already: the connection may be another request's by then
        file_key = self._fk.file_key
        self._fk = None  # type: ignore[assignment]  # closed: no keys are held
        release(self.conn, self._path, file_key, self._pool)

    # ------------------------------------------------------------ key epochs

    def file_epoch(self) -> int:
        """The epoch whose key sealed this file's rows (0 for files written
        before epochs). A hand-edited value only makes the rows fail to open."""
        row = self.conn.execute("SELECT value FROM meta WHERE name = ?", (EPOCH_META,)).fetchone()
        try:
            return 0 if row is None else int(row[0])
        except ValueError:
            raise Damaged("The memory file's key epoch is unreadable; restore this store from a backup.") from None

    def _match_epoch(self, keychain: KeyChain | None) -> None:
        """Make the file's epoch the chain's: refuse a file from a later epoch
        (:class:`KeysBehind`), and bring a file from an earlier one forward
        (:meth:`reseal`), which finishes a revocation that stopped between
        its two files."""
        epoch = self.file_epoch()
        if epoch > self.epoch:
            raise KeysBehind(KEYS_BEHIND)
        if epoch < self.epoch:
            if keychain is None:
                raise Damaged("The memory file is from an older key epoch; retry the request.")
            if not getattr(self, "_may_reseal", True):
                raise ResealDue()
            self.reseal(keychain)

    def reseal(self, keychain: KeyChain) -> int:
        """Re-seal every value this file seals under a rows key (memory-key
        chunks, summaries, config, erasure dates and receipts) from its
        epoch's key to ``keychain``'s current one, in one transaction, and record
        the new epoch. The slots of the newest memory-key chunk that no memory
        uses yet get fresh random keys, so a memory written from now on has a
        key no older key ever sealed; idempotency records (sealed under an
        epoch-derived key) are dropped. Log rows are not touched: each is
        sealed under its own memory key. Returns how many values moved.

        After this, an older epoch's key opens nothing in this file but the
        SQLCipher layer (whose key is epoch 0's): row counts and positions,
        never a value written from now on."""
        new_key = keys.subkey(keychain.current, b"rows")
        moved = 0
        with write_transaction(self.conn):
            epoch = self.file_epoch()
            if epoch == keychain.epoch:
                return 0
            if epoch > keychain.epoch:
                raise KeysBehind(KEYS_BEHIND)
            old_key = keys.subkey(keychain.key(epoch), b"rows")
            stored = self._stored_state()
            if stored is not None and not hmac.compare_digest(
                    stored[1], self._state_mac(stored[0], self._state_digest()[0], old_key)):
                # Re-sealing must not bless a state that was tampered with.
                raise Damaged("This memory file's state does not match its authenticated head; nothing was "
                              "re-sealed. The operator should run `stash verify` and restore it from a backup.")
            T = self.count()
            fresh_from = (T // KEYS_PER_CHUNK, T % KEYS_PER_CHUNK)

            def chunk_plain(c: int, plain: bytes) -> bytes:
                if c == fresh_from[0] and len(plain) == CHUNK_BYTES:
                    k = fresh_from[1] * aead.KEY_BYTES
                    return plain[:k] + os.urandom(CHUNK_BYTES - k)
                return plain

            moved += self._reseal_table("memory_keys", ("chunk",), old_key, new_key,
                                        lambda r: r[0], lambda r, p: chunk_plain(r[0], p))
            moved += self._reseal_table("summaries", ("size", "idx"), old_key, new_key,
                                        lambda r: f"{r[0]}|{r[1]}")
            moved += self._reseal_table("config", ("name",), old_key, new_key, lambda r: r[0])
            moved += self._reseal_table("erased", ("id",), old_key, new_key, lambda r: r[0])
            moved += self._reseal_table("erasures", ("id",), old_key, new_key, lambda r: r[0])
            if "idempotency" in self._tables():
                self.conn.execute("DELETE FROM idempotency")
            self.conn.execute("INSERT INTO meta(name, value) VALUES (?, ?) "
                              "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                              (EPOCH_META, str(keychain.epoch)))
            old_rows_key, self._rows_key = self._rows_key, new_key
            try:
                if self._stored_state() is not None:
                    self._write_state()  # the head's MAC key is the new epoch's
            except BaseException:
                self._rows_key = old_rows_key
                raise
        self._rows_key = new_key
        self.epoch = keychain.epoch
        self._fk = FileKeys(self._fk.path, self.user_id, self._fk.cipher, new_key, self._fk.file_key,
                            self._chain_key, keychain.epoch, self._fk.page_bytes)
        self._chunks.clear()
        checkpoint(self.conn)  # best effort: the old pages leave the WAL
        return moved

    def _reseal_table(self, table: str, pk: tuple[str, ...], old_key: bytes, new_key: bytes,
                      position: Callable[[tuple[Any, ...]], str | int],
                      transform: Callable[[tuple[Any, ...], bytes], bytes] | None = None) -> int:
        """Re-seal one table in primary-key order, a batch at a time, so a
        million summaries are never held at once. A value that does not open
        under the old key is damage: nothing is re-sealed (the caller's
        transaction rolls back)."""
        if table not in self._tables():
            return 0  # never made: nothing sealed in it
        cols = ", ".join(pk)
        after: tuple[Any, ...] | None = None
        moved = 0
        opener = aead.BulkOpener(CHUNK_BYTES)
        sealer = aead.BulkSealer(CHUNK_BYTES)
        while True:
            where = "" if after is None else f"WHERE ({cols}) > ({', '.join('?' * len(pk))})"
            rows = self.conn.execute(f"SELECT {cols}, sealed FROM {table} {where} ORDER BY {cols} LIMIT ?",
                                     (*(after or ()), RESEAL_BATCH)).fetchall()
            if not rows:
                return moved
            updates = []
            for row in rows:
                key, sealed = row[:-1], row[-1]
                ad = self._aad(table, position(key))
                try:
                    plain = bytes(opener.open(old_key, sealed, ad))
                except aead.Unsealable:
                    raise Damaged(f"Stored {table} data at {position(key)} failed its integrity check; nothing "
                                  "was re-sealed. Restore this store from a backup.") from None
                if transform is not None:
                    plain = transform(key, plain)
                updates.append((sealer.seal(new_key, plain, ad), *key))
            self.conn.executemany(
                f"UPDATE {table} SET sealed = ? WHERE {' AND '.join(f'{c} = ?' for c in pk)}", updates)
            moved += len(rows)
            after = rows[-1][:-1]

    # ------------------------------------------------------------ the whole-state head

    def _state_key(self) -> bytes:
        return keys.subkey(self._rows_key, b"state")

    def _state_digest(self) -> tuple[bytes, frozenset[int]]:
        """A digest of everything in this file that a request's answer
        depends on, besides the log rows (which the running digest covers and
        the per-memory keys bind): the log head, the key epoch, every config,
        erasure-date and receipt row as stored, the holes and drop records,
        each summary level's frontier, and the log's append-only triggers.
        Cheap enough for every open: the tables it reads whole are the small
        ones (at most five config rows, one row per erased memory and per
        receipt); the summary tree is covered by one indexed read per level
        and by :meth:`_summary_valid`. Returns the erased ids too."""
        h = hashlib.blake2b(digest_size=32, person=b"stash.state")

        def put(*parts: object) -> None:
            for part in parts:
                b = part if isinstance(part, bytes) else str(part).encode()
                h.update(len(b).to_bytes(8, "big"))
                h.update(b)

        meta = dict(self.conn.execute("SELECT name, value FROM meta WHERE name IN (?, ?, ?, ?)",
                                      (HEAD_META, EPOCH_META, HOLES_META, DROPS_META)))
        put(self.user_id, *(f"{name}={meta.get(name)}" for name in (HEAD_META, EPOCH_META, HOLES_META, DROPS_META)))
        # A table not made yet is read as the empty table it would be, so
        # making one changes nothing here, and dropping one that held rows
        # changes the digest as deleting its rows would.
        tables = self._tables()
        for name, sealed in self._rows(tables, "config", "SELECT name, sealed FROM config ORDER BY name"):
            put("config", name, sealed)
        erased = []
        for i, sealed in self._rows(tables, "erased", "SELECT id, sealed FROM erased ORDER BY id"):
            put("erased", i, sealed)
            erased.append(i)
        for rid, sealed in self._rows(tables, "erasures", "SELECT id, sealed FROM erasures ORDER BY id"):
            put("erasures", rid, sealed)
        top = self.conn.execute("SELECT MAX(size) FROM summaries").fetchone()[0] or 0
        size = 2
        while size <= top:
            top_idx = self.conn.execute("SELECT MAX(idx) FROM summaries WHERE size = ?", (size,)).fetchone()[0]
            put("level", size, top_idx)
            size *= 2
        for name, sql in self.conn.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'log' ORDER BY name"):
            put("trigger", name, sql)
        return h.digest(), frozenset(erased)

    def _tables(self) -> frozenset[str]:
        """The tables this file holds now (in this snapshot): an older file
        has every one, a newer one only those written to (schema.sql, "Pages")."""
        return frozenset(r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))

    def _rows(self, tables: frozenset[str], table: str, sql: str,
              args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        """The rows ``sql`` reads from ``table``, none when it was not made yet."""
        return self.conn.execute(sql, args).fetchall() if table in tables else []

    def _ensure_table(self, name: str) -> None:
        """Make table ``name`` of section memory_on_use as schema.sql writes it,
        inside the caller's write transaction, before its first row."""
        text = sections()["memory_on_use"]
        start = text.index(f"CREATE TABLE IF NOT EXISTS {name} ")
        self.conn.execute(text[start:text.index(");", start) + 2])

    def _state_mac(self, version: int, digest: bytes, rows_key: bytes | None = None) -> bytes:
        key = self._state_key() if rows_key is None else keys.subkey(rows_key, b"state")
        return hashlib.blake2b(version.to_bytes(8, "big") + digest, key=key, digest_size=32,
                               person=b"stash.state.mac").digest()

    def bulk_loaded(self) -> None:
        """Advance the state head over rows written straight into the file by
        bench/build.py (a million summaries in a few transactions); the
        server's own writes advance it themselves."""
        with write_transaction(self.conn):
            self._write_state()

    def _stored_state(self) -> tuple[int, bytes] | None:
        row = self.conn.execute("SELECT value FROM meta WHERE name = ?", (STATE_META,)).fetchone()
        if row is None:
            return None
        try:
            v, mac = row[0].split(" ")
            return int(v), bytes.fromhex(mac)
        except ValueError:
            raise Damaged("The memory file's authenticated head is unreadable; restore this store from a "
                          "backup.") from None

    def _write_state(self) -> int:
        """Advance the state head over what this write transaction leaves:
        version + 1, MAC over the new digest. Every write calls it last,
        inside its transaction, so the head and the state commit together.

        Nothing outside the file is told the new version here: the
        transaction may still be rolled back (a batch's savepoint, a refusal
        of the caller's, a failed commit). What leaves this handle is read
        back from what the file committed (:meth:`committed`)."""
        stored = self._stored_state()
        version = (stored[0] if stored else 0) + 1
        digest, erased = self._state_digest()
        self.conn.execute("INSERT INTO meta(name, value) VALUES (?, ?) "
                          "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                          (STATE_META, f"{version} {self._state_mac(version, digest).hex()}"))
        self._erased_ids = erased
        return version

    def committed(self) -> tuple[Head, int]:
        """The log head and state version this file holds committed now, read
        in one snapshot outside any transaction: the only values a copy kept
        elsewhere (the key ring's) may be raised to. A version this handle
        wrote in a transaction that was then rolled back is never among them,
        and a version another writer committed meanwhile is as good as its
        own (versions only grow while nothing is rolled back)."""
        if self.conn.in_transaction:
            raise RuntimeError("committed() reads what is committed: no transaction may be open")
        self.conn.execute("BEGIN")
        try:
            stored, state = self._stored_head(), self._stored_state()
        finally:
            self.conn.execute("COMMIT")
        return (self.head if stored is None else stored[0]), (0 if state is None else state[0])

    def _next_version(self) -> int:
        stored = self._stored_state()
        return (stored[0] if stored else 0) + 1

    def _load_state(self) -> None:
        self._drops = self._read_drops()

    def _check_state(self, recorded: bool = False) -> None:
        """Refuse this file unless its state matches its authenticated head
        (one snapshot). A file written before the head existed gets one now,
        once (best effort: a read-only file is served as it is, unchecked,
        until it can be written) — unless the key ring ``recorded`` a copy of
        its state version: then the head was deleted, and the file is refused
        as damaged with nothing written into it."""
        self.conn.execute("BEGIN")
        try:
            stored = self._stored_state()
            digest, erased = self._state_digest()
            drops = self._read_drops()
        finally:
            self.conn.execute("COMMIT")
        if stored is None:
            if recorded:
                raise Damaged(STATE_GONE)
            try:
                with write_transaction(self.conn):
                    if self._stored_state() is None:
                        self._write_state()
            except Exception as exc:
                if isinstance(exc, Damaged):
                    raise
                self._erased_ids, self._drops = erased, drops
                return
            return self._check_state()
        version, mac = stored
        if not hmac.compare_digest(mac, self._state_mac(version, digest)):
            raise Damaged("This memory file's state does not match its authenticated head: a row or page was "
                          "put back from an older copy, deleted, or altered. Nothing was served; the operator "
                          "should run `stash verify` and restore this store from a backup.")
        self.state_version, self._erased_ids, self._drops = version, erased, drops

    def check_state_copy(self, copy: int | None) -> None:
        """Refuse this file if the key ring's copy of the state version is
        ahead of it: the file was put back whole from an older copy."""
        if copy is not None and copy > self.state_version:
            raise RolledBack(ROLLED_BACK)

    # ------------------------------------------------------------ drop records

    def _read_drops(self) -> dict[str, Any]:
        row = self.conn.execute("SELECT value FROM meta WHERE name = ?", (DROPS_META,)).fetchone()
        if row is None:
            return {"s": {}, "p": {}}
        try:
            raw = json.loads(row[0])
            return {"s": {int(k): [(int(f), int(v)) for f, v in recs] for k, recs in raw["s"].items()},
                    "p": {int(k): {int(i): int(v) for i, v in recs.items()} for k, recs in raw["p"].items()}}
        except (ValueError, TypeError, KeyError, AttributeError):
            raise Damaged("The memory file's record of dropped summaries is unreadable; restore this store "
                          "from a backup.") from None

    def _save_drops(self, drops: dict[str, Any]) -> None:
        self._drops = drops
        text = json.dumps({"s": {str(k): v for k, v in drops["s"].items()},
                           "p": {str(k): {str(i): v for i, v in recs.items()} for k, recs in drops["p"].items()}})
        self.conn.execute("INSERT INTO meta(name, value) VALUES (?, ?) "
                          "ON CONFLICT(name) DO UPDATE SET value = excluded.value", (DROPS_META, text))

    def _summary_valid(self, size: int, idx: int, written: int) -> bool:
        """A summary written at state version ``written`` is current unless
        its block was dropped (forgotten or erased over) after that: then it
        is an older copy put back."""
        need = self._drops["p"].get(size, {}).get(idx, 0)
        for start, v in self._drops["s"].get(size, ()):
            if start <= idx:
                need = max(need, v)
        return bool(written >= need)

    # ------------------------------------------------------------ the running digest

    @staticmethod
    def _head_text(head: Head, prev: bytes) -> str:
        return f"{head.count} {prev.hex()} {head.digest.hex()}"

    def _stored_head(self) -> tuple[Head, bytes] | None:
        """The head recorded in this file and the digest before it, or None
        for a file written before the digest existed (format 1)."""
        row = self.conn.execute("SELECT value FROM meta WHERE name = ?", (HEAD_META,)).fetchone()
        if row is None:
            return None
        try:
            count, prev, digest = row[0].split(" ")
            return Head(int(count), bytes.fromhex(digest)), bytes.fromhex(prev)
        except ValueError:
            raise Damaged("The memory file's recorded digest is unreadable; "
                          "restore this store from a backup.") from None

    def _verified_head(self) -> Head:
        """The recorded head, after checking it against the end of the log:
        the log must hold exactly ``count`` rows and its last row must chain
        from the recorded previous digest to the recorded head. That is two
        indexed reads and one hash, so every open can afford it; the whole
        chain is recomputed by ``stash verify``. A format-1 file gets its
        chain computed here once."""
        self.conn.execute("BEGIN")  # one snapshot: a writer may append meanwhile
        try:
            stored = self._stored_head()
            T = self.count()
            last = self.conn.execute("SELECT sealed FROM log WHERE id = ?", (T - 1,)).fetchone() if T else None
        finally:
            self.conn.execute("COMMIT")
        if stored is None:
            fmt = self.conn.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()
            if fmt is not None and fmt[0] != "1":
                raise Damaged(DIGEST_GONE)  # only a format-1 file is computed and written here
            return self._migrate()
        head, prev = stored
        if head.count > T:
            raise RolledBack(ROLLED_BACK)
        if head.count < T:
            raise Damaged("The log holds memories past its recorded digest; restore this store from a backup.")
        assert last is not None or not T  # read in the same snapshot as T
        expected = chain.step(self._chain_key, prev, T - 1, last[0]) if T and last else chain.genesis(self._chain_key,
                                                                                             self.user_id)
        if not chain.same(expected, head.digest):
            raise Damaged("The last memory of the log disagrees with its recorded digest; "
                          "restore this store from a backup.")
        return head

    def _migrate(self) -> Head:
        """Record the running digest of a file written before it existed. If
        the file cannot be written (a read-only folder) the head is still
        computed for this request, and recorded by a later one."""
        try:
            with write_transaction(self.conn):
                if self._stored_head() is None:
                    head, prev = self.recompute_head()
                    self.conn.execute("INSERT INTO meta(name, value) VALUES (?, ?)",
                                      (HEAD_META, self._head_text(head, prev)))
                    self.conn.execute("UPDATE meta SET value = ? WHERE name = 'format'", (FORMAT,))
        except Exception as exc:
            if isinstance(exc, Damaged):
                raise
            return self.recompute_head()[0]
        return self._verified_head()

    def recompute_head(self) -> tuple[Head, bytes]:
        """The head from the whole log, and the digest before it: O(T)."""
        key = self._chain_key
        digest = prev = chain.genesis(key, self.user_id)
        i = 0
        for i_row, sealed in self.conn.execute("SELECT id, sealed FROM log ORDER BY id"):
            if i_row != i:
                raise Damaged("The log has a gap; restore this store from a backup.")
            prev, digest = digest, chain.step(key, digest, i, sealed)
            i += 1
        return Head(i, digest), prev

    def current_head(self) -> Head:
        """The head as recorded now (it changes in the same transaction as the
        log, so its count is the log's size in this snapshot)."""
        stored = self._stored_head()
        return self.head if stored is None else stored[0]

    def extends(self, older: Head, newer: Head) -> bool:
        """True if ``newer`` is ``older`` plus rows of this log: run the chain
        from ``older`` over rows ``older.count .. newer.count - 1``."""
        if older.count > newer.count:
            return False
        rows = self.conn.execute("SELECT sealed FROM log WHERE id >= ? AND id < ? ORDER BY id",
                                 (older.count, newer.count))
        count, digest = chain.extend(self._chain_key, older.digest, older.count, (r[0] for r in rows))
        return count == newer.count and chain.same(digest, newer.digest)

    def check_copy(self, copy: Head | None) -> None:
        """Refuse this file if the head copy kept outside it (in the key ring)
        is ahead of it or on another history. The copy is written after the
        file commits, so it may lag (a crash in between): a lagging copy is
        accepted when this log extends it."""
        if copy is None or (copy.count == self.head.count and chain.same(copy.digest, self.head.digest)):
            return
        if copy.count >= self.head.count or not self.extends(copy, self.head):
            raise RolledBack(ROLLED_BACK)

    def pinned_head(self, *, current: bool = False) -> Head:
        """The head a client pins: the log's, with the file's state version
        (``current``: both as recorded now, which another writer may have
        moved since this file was opened)."""
        if not current:
            state = self._stored_state()  # inside a write: the version it commits, or nothing is answered
            return Head(self.head.count, self.head.digest, self.state_version if state is None else state[0])
        head, state = self.current_head(), self._stored_state()
        return Head(head.count, head.digest, self.state_version if state is None else state[0])

    def check_pin(self, pin: Head) -> None:
        """Refuse unless this log is the one a client pinned, or grew from it,
        and the whole state is at least as far as the pinned version (versions
        only grow, so an older one is a rollback of every file together)."""
        if pin.state is not None and pin.state > self.state_version:
            raise PinMismatch(
                f"This memory was rolled back: its state is older than the one you pinned (version "
                f"{self.state_version}, you saw {pin.state}), so every file of it was put back from an older copy "
                "and a later memory, summary, setting or erasure may be undone. Nothing was served or written; "
                "tell the operator to run `stash verify` and restore from a backup, or drop the pin to read what "
                "is there now.",
            )
        if not self.extends(pin, self.head):
            raise PinMismatch(
                f"This memory's log does not continue the head you pinned ({plural(pin.count, 'memory')}): "
                "it was rolled "
                "back or replaced. Nothing was served or written; tell the operator to run `stash verify` and "
                "restore from a backup, or drop the pin to read what is there now.",
            )

    # ------------------------------------------------------------ sealing

    def _aad(self, table: str, position: str | int) -> bytes:
        return f"stash/v1|{self.user_id}|{table}|{position}".encode()

    def _open(self, key: bytes, sealed: bytes, table: str, position: str | int) -> bytes:
        try:
            return aead.open_sealed(key, sealed, self._aad(table, position))
        except aead.Unsealable:
            raise Damaged(
                f"Stored {table} data at {position} failed its integrity check and was not served; "
                "restore this store from a backup."
            ) from None

    # ------------------------------------------------------------ memory keys

    def _chunk(self, c: int, *, create: bool = False) -> bytes | None:
        if c in self._chunks:
            return self._chunks[c]
        row = self.conn.execute("SELECT sealed FROM memory_keys WHERE chunk = ?", (c,)).fetchone()
        if row is None:
            if not create:
                return None
            plain = os.urandom(CHUNK_BYTES)
            self.conn.execute(
                "INSERT INTO memory_keys(chunk, sealed) VALUES (?, ?)",
                (c, aead.seal(self._rows_key, plain, self._aad("memory_keys", c))),
            )
        else:
            plain = self._open(self._rows_key, row[0], "memory_keys", c)
            if len(plain) != CHUNK_BYTES:
                raise Damaged("A memory key chunk has the wrong size; restore this store from a backup.")
        self._chunks[c] = plain
        return plain

    def _memory_key(self, i: int, *, create: bool = False) -> bytes | None:
        chunk = self._chunk(i // KEYS_PER_CHUNK, create=create)
        if chunk is None:
            raise Damaged(f"The key of memory #{i} is missing; restore this store from a backup.")
        k = (i % KEYS_PER_CHUNK) * aead.KEY_BYTES
        key = chunk[k : k + aead.KEY_BYTES]
        return None if key == ERASED_KEY else key

    # ------------------------------------------------------------ log

    def count(self) -> int:
        """T: how many memories the log holds (ids are dense from 0)."""
        return int(self.conn.execute("SELECT COALESCE(MAX(id) + 1, 0) FROM log").fetchone()[0])

    def append(self, items: list[tuple[str, str]], *, check: Callable[[int, str | None], None] | None = None) -> int:
        """Append ``(date, text)`` memories as one transaction; returns the
        first id. Ids are taken inside the write lock, so concurrent writers
        (threads or processes) never share one. ``check(T, newest_date)`` runs
        inside the lock before anything is written and may refuse."""
        with write_transaction(self.conn):
            self._chunks.clear()  # another writer may have created chunks
            base = self.count()
            stored = self._stored_head()
            if stored is None:
                head, prev = self.recompute_head()
            else:
                head, prev = stored
            if head.count != base:
                raise RolledBack(ROLLED_BACK)
            if check is not None:
                check(base, self.newest_date(base))
            digest = head.digest
            touched: dict[int, bytearray] = {}
            for k, (date, text) in enumerate(items):
                i = base + k
                c = i // KEYS_PER_CHUNK
                if c not in touched:
                    existing = self._chunk(c)
                    touched[c] = bytearray(existing if existing is not None else os.urandom(CHUNK_BYTES))
                # Drawn now, not when the chunk was made: two histories grown
                # from one copy of this file give memory #i different keys,
                # so a row spliced in from the other one does not open here.
                key = os.urandom(aead.KEY_BYTES)
                slot = (i % KEYS_PER_CHUNK) * aead.KEY_BYTES
                touched[c][slot:slot + aead.KEY_BYTES] = key
                plain = (aead.pad(f"{date} {text}".encode(), MEMORY_PLAINTEXT_BYTES - WRITER_BYTES)
                         + self.writer.to_bytes(WRITER_BYTES, "big"))
                sealed = aead.seal(key, plain, self._aad("log", i))
                self.conn.execute("INSERT INTO log(id, sealed) VALUES (?, ?)", (i, sealed))
                prev, digest = digest, chain.step(self._chain_key, digest, i, sealed)
            for c, plain_chunk in touched.items():
                self.conn.execute(
                    "INSERT INTO memory_keys(chunk, sealed) VALUES (?, ?) "
                    "ON CONFLICT(chunk) DO UPDATE SET sealed = excluded.sealed",
                    (c, aead.seal(self._rows_key, bytes(plain_chunk), self._aad("memory_keys", c))))
                self._chunks[c] = bytes(plain_chunk)
            head = Head(base + len(items), digest)
            self.conn.execute("INSERT INTO meta(name, value) VALUES (?, ?) "
                              "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                              (HEAD_META, self._head_text(head, prev)))
            self._write_state()
        self.head = head
        return base

    def _decode(self, i: int, plain: bytes) -> tuple[str, str]:
        try:
            line = aead.unpad(plain).decode()
        except (aead.Unsealable, UnicodeDecodeError):
            raise Damaged(f"Memory #{i} is unreadable; restore this store from a backup.") from None
        return line[:10], line[11:]

    def _erased_date(self, i: int) -> str:
        rows = self._rows(self._tables(), "erased", "SELECT sealed FROM erased WHERE id = ?", (i,))
        row = rows[0] if rows else None
        if row is None:
            raise Damaged(f"Memory #{i} has no key and no erasure record; restore this store from a backup.")
        return self._open(self._rows_key, row[0], "erased", i).decode()

    @property
    def erased_ids(self) -> frozenset[int]:
        """The erased memories, as the authenticated head of this file covers them."""
        return self._erased_ids

    def erased_keys_back(self) -> list[int]:
        """Erased memories whose key slot holds a key again: a key chunk (or
        its page) from before the erasure was put back. They are still served
        as erased; erasing them again shreds the key."""
        self._chunks.clear()
        try:
            return [i for i in sorted(self._erased_ids) if self._memory_key(i) is not None]
        finally:
            self._chunks.clear()

    def erased_count(self) -> int:
        rows = self._rows(self._tables(), "erased", "SELECT COUNT(*) FROM erased")
        return int(rows[0][0]) if rows else 0

    def memories(self, lo: int, hi: int) -> list[tuple[int, str, str]]:
        """``(id, date, text)`` for memories ``[lo, hi)``; an erased one has
        text ``[erased]``."""
        out = []
        # A chunk gains a key with every memory written into it (by any
        # writer), so a chunk cached by an earlier call may be stale; within
        # this call the open cursor keeps one snapshot.
        self._chunks.clear()
        rows = self.conn.execute("SELECT id, sealed FROM log WHERE id >= ? AND id < ? ORDER BY id", (lo, hi))
        for i, sealed in rows:
            key = self._memory_key(i)
            if key is None or i in self._erased_ids:
                # The erasure record wins over a key: a key chunk put back
                # from before the erasure does not bring the text back.
                out.append((i, self._erased_date(i), ERASED))
                continue
            out.append((i, *self._decode(i, self._open(key, sealed, "log", i))))
        if len(out) != max(0, hi - lo) or any(r[0] != lo + k for k, r in enumerate(out)):
            raise Damaged("The log has a gap; restore this store from a backup.")
        return out

    def memory(self, i: int) -> tuple[int, str, str]:
        return self.memories(i, i + 1)[0]

    def memory_writer(self, i: int) -> int | None:
        """The grant that wrote memory #i (0: not recorded); None once it is
        erased, since its key, and so the record, is gone."""
        self._chunks.clear()
        row = self.conn.execute("SELECT sealed FROM log WHERE id = ?", (i,)).fetchone()
        if row is None:
            raise ValueError(f"no memory #{i} in this log")
        key = self._memory_key(i)
        if key is None or i in self._erased_ids:
            return None
        plain = self._open(key, row[0], "log", i)
        return int.from_bytes(plain[-WRITER_BYTES:], "big")

    def summary_writer(self, lo: int, hi: int) -> int | None:
        """The grant that wrote the summary of ``[lo, hi)`` (0: not
        recorded), or None when there is none."""
        size = hi - lo
        row = self.conn.execute("SELECT sealed FROM summaries WHERE size = ? AND idx = ?",
                                (size, lo // size)).fetchone()
        if row is None:
            return None
        plain = self._open(self._rows_key, row[0], "summaries", f"{size}|{lo // size}")
        return int.from_bytes(plain[-WRITER_BYTES:], "big")

    def newest_date(self, T: int | None = None) -> str | None:
        T = self.count() if T is None else T
        return self.memory(T - 1)[1] if T else None

    def scan(self, T: int, start: int = 0) -> Iterator[list[str]]:
        """Every memory in ``[start, T)`` rendered as ``#i DATE TEXT``, in
        batches, oldest first (``start`` a multiple of SCAN_BATCH). Streams: a
        million memories are never held at once.

        Rows are read without their ids: each is opened with associated data
        naming the position it should be at, so a missing, extra or moved row
        fails to authenticate and is reported as damage."""
        opener = aead.BulkOpener(LARGEST_MEMORY_PLAINTEXT)
        open_padded = opener.open_padded
        prefix = f"stash/v1|{self.user_id}|log|".encode()
        if start % SCAN_BATCH:
            raise ValueError("a scan starts on a batch boundary")
        cur = self.conn.execute("SELECT sealed FROM log WHERE id >= ? AND id < ? ORDER BY id", (start, T))
        width = aead.KEY_BYTES
        chunk = b""
        erased = self._erased_ids
        i = start
        while i < T:
            rows = cur.fetchmany(SCAN_BATCH)
            if not rows:
                break
            batch: list[str] = []
            append = batch.append
            # The hot loop of a recall: per row one key slice and one open.
            for (sealed,) in rows:
                slot = i % KEYS_PER_CHUNK
                if not slot:  # batches start on a chunk boundary
                    self._chunks.clear()
                    chunk = self._chunk(i // KEYS_PER_CHUNK) or b""
                key = chunk[slot * width : slot * width + width]
                if key == ERASED_KEY or len(key) != width or i in erased:
                    append(self._render_unkeyed(i, key))
                else:
                    try:
                        append(f"#{i} {open_padded(key, sealed, b'%s%d' % (prefix, i)).decode()}")
                    except aead.Unsealable:
                        raise Damaged(
                            f"Stored log data at {i} failed its integrity check and was not served; "
                            "restore this store from a backup."
                        ) from None
                    except UnicodeDecodeError:
                        raise Damaged(f"Memory #{i} is unreadable; restore this store from a backup.") from None
                i += 1
            yield batch
        self._chunks.clear()
        if i != T:
            raise Damaged("The log has a gap; restore this store from a backup.")

    def _render_unkeyed(self, i: int, key: bytes) -> str:
        if len(key) != aead.KEY_BYTES and i not in self._erased_ids:
            raise Damaged(f"The key of memory #{i} is missing; restore this store from a backup.")
        return f"#{i} {self._erased_date(i)} {ERASED}"

    # ------------------------------------------------------------ summaries

    def settled(self, T: int) -> Settled:
        """Each level's frontier up to ``T`` and its holes (blocks an erasure
        dropped below the frontier, docs/DESIGN.md, "Erase")."""
        out = Settled(holes=self._holes())
        for size in levels(T):
            top = self.conn.execute("SELECT MAX(idx) FROM summaries WHERE size = ?", (size,)).fetchone()[0]
            out[size] = 0 if top is None else top + 1
        return out

    def _holes(self) -> dict[int, list[int]]:
        row = self.conn.execute("SELECT value FROM meta WHERE name = ?", (HOLES_META,)).fetchone()
        if row is None:
            return {}
        try:
            return {int(size): sorted(int(k) for k in ks) for size, ks in json.loads(row[0]).items()}
        except (ValueError, TypeError, AttributeError):
            raise Damaged("The memory file's record of erased summaries is unreadable; "
                          "restore this store from a backup.") from None

    def _save_holes(self, holes: dict[int, list[int]]) -> None:
        """Record ``holes``, keeping only those still below their level's
        frontier (a hole at or past it is just a block not written yet)."""
        kept = {}
        for size, ks in holes.items():
            top = self.conn.execute("SELECT MAX(idx) FROM summaries WHERE size = ?", (size,)).fetchone()[0]
            below = sorted({k for k in ks if top is not None and k < top})
            if below:
                kept[str(size)] = below
        if kept:
            self.conn.execute("INSERT INTO meta(name, value) VALUES (?, ?) "
                              "ON CONFLICT(name) DO UPDATE SET value = excluded.value", (HOLES_META, json.dumps(kept)))
        else:
            self.conn.execute("DELETE FROM meta WHERE name = ?", (HOLES_META,))

    def summaries_of(self, size: int, first: int, end: int) -> dict[int, str]:
        """The summaries of level ``size`` with index in ``[first, end)``, each
        opened and checked as :meth:`summary` does, in one query; an index
        without a summary is absent."""
        rows = self.conn.execute("SELECT idx, sealed FROM summaries WHERE size = ? AND idx >= ? AND idx < ?",
                                 (size, first, end))
        return {idx: self._summary_text(size, idx, sealed) for idx, sealed in rows}

    def summary(self, lo: int, hi: int) -> str | None:
        size = hi - lo
        row = self.conn.execute(
            "SELECT sealed FROM summaries WHERE size = ? AND idx = ?", (size, lo // size)
        ).fetchone()
        if row is None:
            return None
        return self._summary_text(size, lo // size, row[0])

    def _summary_text(self, size: int, idx: int, sealed: bytes) -> str:
        """Open one summary and check it is current: written after the last
        drop of its block (:meth:`_summary_valid`). Plaintexts written before
        the state head existed carry no version (0)."""
        plain = self._open(self._rows_key, sealed, "summaries", f"{size}|{idx}")
        written = 0
        if len(plain) == SUMMARY_VERSION_BYTES + SUMMARY_PLAINTEXT_BYTES:
            written, plain = int.from_bytes(plain[:SUMMARY_VERSION_BYTES], "big"), plain[SUMMARY_VERSION_BYTES:]
        lo = idx * size
        if not self._summary_valid(size, idx, written):
            raise RolledBack(f"The summary of {lo}-{lo + size - 1} is an older copy of one that was dropped "
                             "(forgotten, or erased over); it was not served. The operator should run `stash "
                             "verify` and restore this store from a backup.")
        try:
            return aead.unpad(plain).decode()
        except (aead.Unsealable, UnicodeDecodeError):
            raise Damaged(f"The summary of {lo}-{lo + size - 1} is unreadable; forget it and nap again.") from None

    def put_summary(self, lo: int, hi: int, text: str) -> bool:
        """Settle block ``[lo, hi)`` if it is still the next one of its level
        or one of its holes and, above size 2, both its halves are still
        settled. False if another writer got there first, or a forget dropped
        a half meanwhile."""
        size = hi - lo
        idx = lo // size
        with write_transaction(self.conn):
            version = self._next_version()
            sealed = aead.seal(self._rows_key,
                               version.to_bytes(SUMMARY_VERSION_BYTES, "big")
                               + aead.pad(text.encode(), SUMMARY_PLAINTEXT_BYTES - WRITER_BYTES)
                               + self.writer.to_bytes(WRITER_BYTES, "big"),
                               self._aad("summaries", f"{size}|{idx}"))
            top = self.conn.execute("SELECT MAX(idx) FROM summaries WHERE size = ?", (size,)).fetchone()[0]
            holes = self._holes()
            hole = idx in holes.get(size, ()) and top is not None and idx < top
            if (0 if top is None else top + 1) != idx and not hole:
                return False
            if size > 2:
                halves = self.conn.execute(
                    "SELECT COUNT(*) FROM summaries WHERE size = ? AND idx IN (?, ?)", (size // 2, 2 * idx, 2 * idx + 1)
                ).fetchone()[0]
                if halves != 2:
                    return False
            self.conn.execute("INSERT INTO summaries(size, idx, sealed) VALUES (?, ?, ?)", (size, idx, sealed))
            if hole:
                holes[size].remove(idx)
                self._save_holes(holes)
            self._write_state()
        return True

    def put_summaries(self, items: list[tuple[int, int, str]]) -> bool:
        """Settle several blocks at once, in the given order, each under
        exactly :meth:`put_summary`'s conditions; all or nothing: False (and
        nothing written) if any one of them would be refused. A savepoint
        keeps it whole inside a caller's transaction too."""
        with write_transaction(self.conn):
            self.conn.execute("SAVEPOINT summaries_batch")
            for lo, hi, text in items:
                if not self.put_summary(lo, hi, text):
                    self.conn.execute("ROLLBACK TO summaries_batch")
                    self.conn.execute("RELEASE summaries_batch")
                    return False
            self.conn.execute("RELEASE summaries_batch")
        return True

    def drop_summaries_from(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Drop block ``[lo, hi)``, the block containing it at each larger
        size, and every later block of each of those sizes (docs/DESIGN.md,
        "Forget"). Returns the dropped blocks, smallest first."""
        with write_transaction(self.conn):
            gone = self._drop_from(lo, hi)
            if gone:
                version = self._next_version()
                drops = self._read_drops()
                for size in sorted({b - a for a, b in gone}):
                    # A later suffix record from an earlier start supersedes the ones it covers.
                    start = lo // size
                    drops["s"][size] = [r for r in drops["s"].get(size, []) if r[0] < start] + [(start, version)]
                self._save_drops(drops)
                self._write_state()
            return gone

    def _drop_from(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Delete what :func:`blocks.forget_span` says forget drops."""
        top_size = self.conn.execute("SELECT MAX(size) FROM summaries").fetchone()[0] or 0
        settled = self.settled(top_size)
        gone = forget_span(lo, hi, settled, top_size)
        for size in sorted({b - a for a, b in gone}):
            self.conn.execute("DELETE FROM summaries WHERE size = ? AND idx >= ?", (size, lo // size))
        if settled.holes:
            self._save_holes(settled.holes)  # holes past the new frontiers are gone with them
        return gone

    # ------------------------------------------------------------ config

    def config(self) -> dict[str, int]:
        out = {}
        for name, sealed in self._rows(self._tables(), "config", "SELECT name, sealed FROM config"):
            out[name] = int(self._open(self._rows_key, sealed, "config", name).decode())
        return out

    def set_config(self, changes: dict[str, int | None]) -> None:
        with write_transaction(self.conn):
            self._ensure_table("config")
            for name, value in changes.items():
                if value is None:
                    self.conn.execute("DELETE FROM config WHERE name = ?", (name,))
                else:
                    sealed = aead.seal(self._rows_key, str(value).encode(), self._aad("config", name))
                    self.conn.execute(
                        "INSERT INTO config(name, sealed) VALUES (?, ?) "
                        "ON CONFLICT(name) DO UPDATE SET sealed = excluded.sealed",
                        (name, sealed),
                    )
            self._write_state()

    # ------------------------------------------------------------ erasure

    def flush(self) -> bool:
        """Fold the WAL into the file and truncate it, so a page that held a
        destroyed key survives in neither (freed pages are zeroed by
        secure_delete): :func:`files.flush`. False when it could not be done
        yet; every later close of the file tries again."""
        return flush(self.conn)

    def erase(self, ids: list[int], at: str) -> tuple[int, list[int], list[tuple[int, int]]]:
        """Shred memories: record each one's date, zero its key slot, drop
        only the summaries that contain it — the blocks on its path to the
        root, at most ⌊log2 T⌋ (docs/DESIGN.md, "Erase") — recorded as holes that the next
        naps fill. The log rows are not touched. Returns (receipt id, newly
        erased ids, dropped blocks). Cost: O(log T) per erased memory."""
        with write_transaction(self.conn):
            self._ensure_table("erased")
            self._ensure_table("erasures")
            self._chunks.clear()
            T = self.count()
            fresh: list[int] = []
            shredded: list[int] = []
            for i in sorted(set(ids)):
                if i >= T:
                    continue
                if self._memory_key(i) is None:
                    continue
                # Erased already, yet its key is back: a key chunk from
                # before the erasure was put back. Shred it again; the
                # record stays as it is.
                again = i in self._erased_ids
                if not again:
                    _, date, _ = self.memory(i)
                    self.conn.execute(
                        "INSERT INTO erased(id, sealed) VALUES (?, ?)",
                        (i, aead.seal(self._rows_key, date.encode(), self._aad("erased", i))),
                    )
                c = i // KEYS_PER_CHUNK
                sealed_chunk = self._chunk(c)
                assert sealed_chunk is not None  # memory i has its key, so its chunk exists
                chunk = bytearray(sealed_chunk)
                k = (i % KEYS_PER_CHUNK) * aead.KEY_BYTES
                chunk[k : k + aead.KEY_BYTES] = ERASED_KEY
                self._chunks[c] = bytes(chunk)
                self.conn.execute(
                    "UPDATE memory_keys SET sealed = ? WHERE chunk = ?",
                    (aead.seal(self._rows_key, bytes(chunk), self._aad("memory_keys", c)), c),
                )
                (shredded if again else fresh).append(i)
            # The recall cache holds these memories' rendered text: its pieces
            # go while this transaction holds the write lock (scancache.py).
            scancache.invalidate(self._fk.path.parent, fresh + shredded)
            gone: list[tuple[int, int]] = []
            version = self._next_version()
            if fresh and T >= 2:
                settled = self.settled(T)
                drops = self._read_drops()
                for i in fresh:
                    for a, b in erase_span(i, T, settled):
                        size = b - a
                        self.conn.execute("DELETE FROM summaries WHERE size = ? AND idx = ?", (size, a // size))
                        settled.holes.setdefault(size, []).append(a // size)
                        drops["p"].setdefault(size, {})[a // size] = version
                        gone.append((a, b))
                gone.sort(key=lambda blk: (blk[1] - blk[0], blk[0]))
                self._save_holes(settled.holes)
                self._save_drops(drops)
            if fresh:
                # A recorded idempotent answer may quote an erased memory (a
                # nap's source lines); it must not outlive the memory's key.
                if "idempotency" in self._tables():
                    self.conn.execute("DELETE FROM idempotency")
            receipt = {"ids": sorted(set(ids)), "erased": fresh, "dropped": len(gone), "at": at}
            cur = self.conn.execute("INSERT INTO erasures(sealed) VALUES (?)", (b"",))
            rid = int(cur.lastrowid or 0)
            self.conn.execute(
                "UPDATE erasures SET sealed = ? WHERE id = ?",
                (aead.seal(self._rows_key, json.dumps(receipt).encode(), self._aad("erasures", rid)), rid),
            )
            self._write_state()
        self._chunks.clear()
        return rid, fresh, gone

    def receipts(self) -> list[dict[str, Any]]:
        out = []
        for rid, sealed in self._rows(self._tables(), "erasures", "SELECT id, sealed FROM erasures ORDER BY id"):
            out.append({"receipt": rid, **json.loads(self._open(self._rows_key, sealed, "erasures", rid))})
        return out

    def level(self, size: int) -> Iterator[str]:
        """The summaries of one level up to its first hole, in order (OptMem's
        levels are dense: an export writes each up to its first hole; docs/DESIGN.md, "Erase")."""
        rows = self.conn.execute("SELECT idx, sealed FROM summaries WHERE size = ? ORDER BY idx", (size,))
        for expected, (idx, sealed) in enumerate(rows):
            if idx != expected:
                return
            yield self._summary_text(size, idx, sealed)

    def level_sizes(self) -> list[int]:
        return [r[0] for r in self.conn.execute("SELECT DISTINCT size FROM summaries ORDER BY size")]
