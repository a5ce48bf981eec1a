"""A user's memory file: the sealed log, summary tree and config.

Opened for one request with the master key, closed at its end. Every value is
sealed with associated data naming its user, table and position, and any value
that fails to open raises :class:`Damaged` — it is never served.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..core.blocks import forget_span, levels
from ..core.errors import Conflict, Damaged, PinMismatch, RolledBack, Unavailable
from ..crypto import aead, chain, keys
from ..crypto.chain import Head
from . import scancache
from .files import SQLCIPHER_OPEN_CLOSE, MissingFile, checkpoint, connect, storage_error, write_transaction
from .idempotency import Records
from .schema import sections

MEMORY_PLAINTEXT_BYTES = 320  # 2-byte length + "YYYY-MM-DD " + up to 280 bytes, padded
SUMMARY_PLAINTEXT_BYTES = 288
KEYS_PER_CHUNK = 128
CHUNK_BYTES = KEYS_PER_CHUNK * aead.KEY_BYTES
ERASED_KEY = bytes(aead.KEY_BYTES)
SCAN_BATCH = 32 * KEYS_PER_CHUNK  # whole chunks, so a batch starts on a chunk boundary

ERASED = "[erased]"


def _raise_if_unavailable(exc: Exception) -> None:
    """A file that cannot be opened for a reason outside its bytes (a full
    disk, a read-only folder) is reported as that, not as damage."""
    err = storage_error(exc)
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

    @classmethod
    def derive(cls, path: Path, user_id: str, master: bytes, cipher: str) -> FileKeys:
        file_key = keys.subkey(master, b"file") if cipher == "sqlcipher" else None
        return cls(Path(path), user_id, cipher, keys.subkey(master, b"rows"), file_key, keys.subkey(master, b"chain"))


HEAD_META = "log_head"
FORMAT = "2"  # 1: no running digest; opening a format-1 file computes it once

ROLLED_BACK = ("The end of this memory's log disagrees with its recorded digest: the file was cut short or "
               "replaced with an older copy. Nothing was served; the operator should run `stash verify` and "
               "restore this store from a backup.")


class MemoryFile:
    def __init__(self, path: Path, user_id: str, master: bytes, cipher: str, *, create: bool = False) -> None:
        self._setup(FileKeys.derive(path, user_id, master, cipher), create)

    @classmethod
    def reopen(cls, fk: FileKeys) -> MemoryFile:
        mf = cls.__new__(cls)
        mf._setup(fk, False)
        return mf

    def file_keys(self) -> FileKeys:
        return self._fk

    def _setup(self, fk: FileKeys, create: bool) -> None:
        self._fk = fk
        self.user_id = user_id = fk.user_id
        self._rows_key = fk.rows_key
        path, file_key, cipher = fk.path, fk.file_key, fk.cipher
        try:
            self.conn = connect(path, file_key=file_key, cipher=cipher, create=create)
        except MissingFile:
            raise
        except Exception as exc:
            _raise_if_unavailable(exc)
            raise Damaged(
                "The memory file cannot be opened: it is damaged or was replaced; restore it from a backup."
            ) from None
        self._chain_key = fk.chain_key
        self._chunks: dict[int, bytes] = {}
        try:
            if create:
                self.conn.executescript(sections()["memory"])
                self.conn.executescript(sections()["idempotency"])
                self.head = Head(0, chain.genesis(self._chain_key, user_id))
                self.conn.execute(
                    "INSERT INTO meta(name, value) VALUES ('user_id', ?), ('format', ?), (?, ?)",
                    (user_id, FORMAT, HEAD_META, self._head_text(self.head, b"")),
                )
            else:
                row = self.conn.execute("SELECT value FROM meta WHERE name = 'user_id'").fetchone()
                if not row or row[0] != user_id:
                    raise Damaged("This memory file does not belong to this user; restore it from a backup.")
                self.head = self._verified_head()
        except Damaged:
            self.conn.close()
            raise
        except Exception as exc:
            self.conn.close()
            _raise_if_unavailable(exc)
            raise Damaged(
                "The memory file cannot be opened: it is damaged or was replaced; restore it from a backup."
            ) from None

    def idempotency_records(self) -> Records:
        return Records(self.conn)

    def close(self) -> None:
        self._chunks.clear()
        self._rows_key = b""
        self._chain_key = b""
        self._fk = None
        with SQLCIPHER_OPEN_CLOSE:
            self.conn.close()

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
            return self._migrate()
        head, prev = stored
        if head.count > T:
            raise RolledBack(ROLLED_BACK)
        if head.count < T:
            raise Damaged("The log holds memories past its recorded digest; restore this store from a backup.")
        expected = chain.step(self._chain_key, prev, T - 1, last[0]) if T else chain.genesis(self._chain_key,
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
            with self.conn:
                self.conn.execute("BEGIN IMMEDIATE")
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

    def check_pin(self, pin: Head) -> None:
        """Refuse unless this log is the one a client pinned, or grew from it."""
        if not self.extends(pin, self.head):
            raise PinMismatch(
                f"This memory's log does not continue the head you pinned ({pin.count} memories): it was rolled "
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
        return self.conn.execute("SELECT COALESCE(MAX(id) + 1, 0) FROM log").fetchone()[0]

    def append(self, items: list[tuple[str, str]], *, check=None) -> int:
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
            for k, (date, text) in enumerate(items):
                i = base + k
                key = self._memory_key(i, create=True)
                plain = aead.pad(f"{date} {text}".encode(), MEMORY_PLAINTEXT_BYTES)
                sealed = aead.seal(key, plain, self._aad("log", i))
                self.conn.execute("INSERT INTO log(id, sealed) VALUES (?, ?)", (i, sealed))
                prev, digest = digest, chain.step(self._chain_key, digest, i, sealed)
            head = Head(base + len(items), digest)
            self.conn.execute("INSERT INTO meta(name, value) VALUES (?, ?) "
                              "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                              (HEAD_META, self._head_text(head, prev)))
        self.head = head
        return base

    def _decode(self, i: int, plain: bytes) -> tuple[str, str]:
        try:
            line = aead.unpad(plain).decode()
        except (aead.Unsealable, UnicodeDecodeError):
            raise Damaged(f"Memory #{i} is unreadable; restore this store from a backup.") from None
        return line[:10], line[11:]

    def _erased_date(self, i: int) -> str:
        row = self.conn.execute("SELECT sealed FROM erased WHERE id = ?", (i,)).fetchone()
        if row is None:
            raise Damaged(f"Memory #{i} has no key and no erasure record; restore this store from a backup.")
        return self._open(self._rows_key, row[0], "erased", i).decode()

    def erased_count(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM erased").fetchone()[0]

    def memories(self, lo: int, hi: int) -> list[tuple[int, str, str]]:
        """``(id, date, text)`` for memories ``[lo, hi)``; an erased one has
        text ``[erased]``."""
        out = []
        rows = self.conn.execute("SELECT id, sealed FROM log WHERE id >= ? AND id < ? ORDER BY id", (lo, hi))
        for i, sealed in rows:
            key = self._memory_key(i)
            if key is None:
                out.append((i, self._erased_date(i), ERASED))
                continue
            out.append((i, *self._decode(i, self._open(key, sealed, "log", i))))
        if len(out) != max(0, hi - lo) or any(r[0] != lo + k for k, r in enumerate(out)):
            raise Damaged("The log has a gap; restore this store from a backup.")
        return out

    def memory(self, i: int) -> tuple[int, str, str]:
        return self.memories(i, i + 1)[0]

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
        opener = aead.BulkOpener(MEMORY_PLAINTEXT_BYTES)
        open_padded = opener.open_padded
        prefix = f"stash/v1|{self.user_id}|log|".encode()
        if start % SCAN_BATCH:
            raise ValueError("a scan starts on a batch boundary")
        cur = self.conn.execute("SELECT sealed FROM log WHERE id >= ? AND id < ? ORDER BY id", (start, T))
        width = aead.KEY_BYTES
        chunk = b""
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
                if key == ERASED_KEY or len(key) != width:
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
        if len(key) != aead.KEY_BYTES:
            raise Damaged(f"The key of memory #{i} is missing; restore this store from a backup.")
        return f"#{i} {self._erased_date(i)} {ERASED}"

    # ------------------------------------------------------------ summaries

    def settled(self, T: int) -> dict[int, int]:
        """How many summaries each level up to ``T`` holds (a dense prefix)."""
        out = {}
        for size in levels(T):
            top = self.conn.execute("SELECT MAX(idx) FROM summaries WHERE size = ?", (size,)).fetchone()[0]
            out[size] = 0 if top is None else top + 1
        return out

    def summary(self, lo: int, hi: int) -> str | None:
        size = hi - lo
        row = self.conn.execute(
            "SELECT sealed FROM summaries WHERE size = ? AND idx = ?", (size, lo // size)
        ).fetchone()
        if row is None:
            return None
        plain = self._open(self._rows_key, row[0], "summaries", f"{size}|{lo // size}")
        try:
            return aead.unpad(plain).decode()
        except (aead.Unsealable, UnicodeDecodeError):
            raise Damaged(f"The summary of {lo}-{hi - 1} is unreadable; forget it and nap again.") from None

    def put_summary(self, lo: int, hi: int, text: str) -> bool:
        """Settle block ``[lo, hi)`` if it is still the next one of its level
        (the level stays a dense prefix) and, above size 2, both its halves
        are still settled. False if another writer got there first, or a
        forget dropped a half meanwhile."""
        size = hi - lo
        idx = lo // size
        sealed = aead.seal(
            self._rows_key, aead.pad(text.encode(), SUMMARY_PLAINTEXT_BYTES), self._aad("summaries", f"{size}|{idx}")
        )
        with write_transaction(self.conn):
            top = self.conn.execute("SELECT MAX(idx) FROM summaries WHERE size = ?", (size,)).fetchone()[0]
            if (0 if top is None else top + 1) != idx:
                return False
            if size > 2:
                halves = self.conn.execute(
                    "SELECT COUNT(*) FROM summaries WHERE size = ? AND idx IN (?, ?)", (size // 2, 2 * idx, 2 * idx + 1)
                ).fetchone()[0]
                if halves != 2:
                    return False
            self.conn.execute("INSERT INTO summaries(size, idx, sealed) VALUES (?, ?, ?)", (size, idx, sealed))
        return True

    def drop_summaries_from(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Drop block ``[lo, hi)`` and everything built on it: at each size from
        ``hi - lo`` upward, the containing block and every later one of that
        level (SPEC §2.7). Returns the dropped blocks, smallest first."""
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            return self._drop_from(lo, hi)

    def _drop_from(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Delete what :func:`blocks.forget_span` says forget drops."""
        top_size = self.conn.execute("SELECT MAX(size) FROM summaries").fetchone()[0] or 0
        gone = forget_span(lo, hi, self.settled(top_size), top_size)
        for size in sorted({b - a for a, b in gone}):
            self.conn.execute("DELETE FROM summaries WHERE size = ? AND idx >= ?", (size, lo // size))
        return gone

    # ------------------------------------------------------------ config

    def config(self) -> dict[str, int]:
        out = {}
        for name, sealed in self.conn.execute("SELECT name, sealed FROM config"):
            out[name] = int(self._open(self._rows_key, sealed, "config", name).decode())
        return out

    def set_config(self, changes: dict[str, int | None]) -> None:
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
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

    # ------------------------------------------------------------ erasure

    def checkpoint(self) -> None:
        """Fold the WAL into the file and truncate it, so a page that held a
        destroyed key survives in neither (freed pages are zeroed by
        secure_delete)."""
        if not checkpoint(self.conn):
            raise Conflict("The store is busy and the erasure could not be flushed yet; retry the erase shortly.",
                       code="erase.busy")

    def erase(self, ids: list[int], at: str) -> tuple[int, list[int], list[tuple[int, int]]]:
        """Shred memories: record each one's date, zero its key slot, drop
        every summary built over it (as forget would from its size-2 block).
        The log rows are not touched. Returns (receipt id, newly erased ids,
        dropped blocks)."""
        self.idempotency_records().ensure()
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            self._chunks.clear()
            T = self.count()
            fresh = []
            for i in sorted(set(ids)):
                if i >= T:
                    continue
                if self._memory_key(i) is None:
                    continue
                _, date, _ = self.memory(i)
                self.conn.execute(
                    "INSERT INTO erased(id, sealed) VALUES (?, ?)",
                    (i, aead.seal(self._rows_key, date.encode(), self._aad("erased", i))),
                )
                c = i // KEYS_PER_CHUNK
                chunk = bytearray(self._chunk(c))
                k = (i % KEYS_PER_CHUNK) * aead.KEY_BYTES
                chunk[k : k + aead.KEY_BYTES] = ERASED_KEY
                self._chunks[c] = bytes(chunk)
                self.conn.execute(
                    "UPDATE memory_keys SET sealed = ? WHERE chunk = ?",
                    (aead.seal(self._rows_key, bytes(chunk), self._aad("memory_keys", c)), c),
                )
                fresh.append(i)
            # The recall cache holds these memories' rendered text: its pieces
            # go while this transaction holds the write lock (scancache.py).
            scancache.invalidate(self._fk.path.parent, fresh)
            gone: list[tuple[int, int]] = []
            if fresh and T >= 2:
                lo = fresh[0] - fresh[0] % 2
                gone = self._drop_from(lo, lo + 2)
            if fresh:
                # A recorded idempotent answer may quote an erased memory (a
                # nap's source lines); it must not outlive the memory's key.
                self.conn.execute("DELETE FROM idempotency")
            receipt = {"ids": sorted(set(ids)), "erased": fresh, "dropped": len(gone), "at": at}
            cur = self.conn.execute("INSERT INTO erasures(sealed) VALUES (?)", (b"",))
            rid = cur.lastrowid
            self.conn.execute(
                "UPDATE erasures SET sealed = ? WHERE id = ?",
                (aead.seal(self._rows_key, json.dumps(receipt).encode(), self._aad("erasures", rid)), rid),
            )
        self._chunks.clear()
        self.checkpoint()
        return rid, fresh, gone

    def receipts(self) -> list[dict]:
        out = []
        for rid, sealed in self.conn.execute("SELECT id, sealed FROM erasures ORDER BY id"):
            out.append({"receipt": rid, **json.loads(self._open(self._rows_key, sealed, "erasures", rid))})
        return out

    def level(self, size: int) -> Iterator[str]:
        """Every summary of one level, in order (the level is a dense prefix)."""
        rows = self.conn.execute("SELECT idx, sealed FROM summaries WHERE size = ? ORDER BY idx", (size,))
        for idx, sealed in rows:
            plain = self._open(self._rows_key, sealed, "summaries", f"{size}|{idx}")
            yield aead.unpad(plain).decode()

    def level_sizes(self) -> list[int]:
        return [r[0] for r in self.conn.execute("SELECT DISTINCT size FROM summaries ORDER BY size")]
