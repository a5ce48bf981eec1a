"""The log and its key chunks: appending memories, reading them back, and
the scan a recall runs over the whole log.

Each memory is sealed under its own random key; the keys sit in chunks of
:data:`KEYS_PER_CHUNK`, each chunk sealed under the rows key. Ids are dense
from 0 and taken inside the write lock; a zeroed key slot is an erased
memory, and the erasure record (not the slot) decides what is served, so a
key chunk put back from before an erasure never brings a text back.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing

from ...core.errors import Damaged, RolledBack
from ...crypto import aead, chain
from ...crypto.chain import Head
from ..sqlite.transactions import write_transaction
from .base import HEAD_META, ROLLED_BACK
from .row_tree import erased_slot, key_slot
from .rows import ERASED, LARGEST_MEMORY_PLAINTEXT, RowCodec
from .short_rows import expand as rebuild
from .short_rows import is_short

KEYS_PER_CHUNK = 128
CHUNK_BYTES = KEYS_PER_CHUNK * aead.KEY_BYTES
ERASED_KEY = bytes(aead.KEY_BYTES)
SCAN_BATCH = 32 * KEYS_PER_CHUNK  # whole chunks, so a batch starts on a chunk boundary


class LogPart(RowCodec):
    def _chunk(self, c: int, *, create: bool = False) -> bytes | None:
        if c in self._chunks:
            return self._chunks[c]
        row = (
            self.conn.execute(
                f"SELECT sealed, {self._epoch_sql('memory_keys')} FROM memory_keys WHERE chunk = ?", (c,)
            ).fetchone()
            if self._made("memory_keys")
            else None
        )
        if row is None:
            if not create:
                return None
            self._ensure_table("memory_keys")
            plain = os.urandom(CHUNK_BYTES)
            cols, marks, epoch = self._epoch_of_write("memory_keys")
            sealed = aead.seal(self._rows_key, plain, self._aad("memory_keys", c))
            self.conn.execute(f"INSERT INTO memory_keys(chunk, sealed{cols}) VALUES (?, ?{marks})", (c, sealed, *epoch))
            self._bind(key_slot(c), sealed)
        else:
            plain = self._open_chunk(c, row[0], row[1])
        self._chunks[c] = plain
        return plain

    def _open_chunk(self, c: int, sealed: bytes, epoch: int | None) -> bytes:
        plain = self._open_bound(key_slot(c), sealed, epoch, c)
        if len(plain) != CHUNK_BYTES:
            raise Damaged("A memory key chunk has the wrong size; restore this store from a backup.")
        return plain

    def _memory_key(self, i: int, *, create: bool = False) -> bytes | None:
        chunk = self._chunk(i // KEYS_PER_CHUNK, create=create)
        if chunk is None:
            raise Damaged(f"The key of memory #{i} is missing; restore this store from a backup.")
        k = (i % KEYS_PER_CHUNK) * aead.KEY_BYTES
        key = chunk[k : k + aead.KEY_BYTES]
        return None if key == ERASED_KEY else key

    def append(self, items: list[tuple[str, str]], *, check: Callable[[int, str | None], None] | None = None) -> int:
        """Append ``(date, text)`` memories as one transaction; returns the
        first id. Ids are taken inside the write lock, so concurrent writers
        (threads or processes) never share one. ``check(T, newest_date)`` runs
        inside the lock before anything is written and may refuse."""
        with write_transaction(self.conn):
            self._chunks.clear()  # another writer may have created chunks
            self._ensure_table("log")
            self._ensure_table("memory_keys")
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
                    if existing is None and i % KEYS_PER_CHUNK:
                        # The keys of the memories before i in this chunk are
                        # gone (its row or the whole table deleted): fresh
                        # keys here would pass that off as a written chunk.
                        raise Damaged(f"The key of memory #{i - 1} is missing; restore this store from a backup.")
                    touched[c] = bytearray(existing if existing is not None else os.urandom(CHUNK_BYTES))
                # Drawn now, not when the chunk was made: two histories grown
                # from one copy of this file give memory #i different keys,
                # so a row spliced in from the other one does not open here.
                key = os.urandom(aead.KEY_BYTES)
                slot = (i % KEYS_PER_CHUNK) * aead.KEY_BYTES
                touched[c][slot : slot + aead.KEY_BYTES] = key
                sealed = aead.seal(key, self._memory_plain(date, text), self._aad("log", i))
                self.conn.execute("INSERT INTO log(id, sealed) VALUES (?, ?)", (i, sealed))
                prev, digest = digest, chain.step(self._chain_key, digest, i, sealed)
            cols, marks, epoch = self._epoch_of_write("memory_keys")
            also = ", epoch = excluded.epoch" if epoch else ""
            for c, plain_chunk in touched.items():
                sealed_chunk = aead.seal(self._rows_key, bytes(plain_chunk), self._aad("memory_keys", c))
                self.conn.execute(
                    f"INSERT INTO memory_keys(chunk, sealed{cols}) VALUES (?, ?{marks}) "
                    f"ON CONFLICT(chunk) DO UPDATE SET sealed = excluded.sealed{also}",
                    (c, sealed_chunk, *epoch),
                )
                self._bind(key_slot(c), sealed_chunk)
                self._chunks[c] = bytes(plain_chunk)
            head = Head(base + len(items), digest)
            self._put_meta(HEAD_META, self._head_text(head, prev))
            self._write_state()
        self.head = head
        return base

    def memories(self, lo: int, hi: int) -> list[tuple[int, str, str]]:
        """``(id, date, text)`` for memories ``[lo, hi)``; an erased one has
        text ``[erased]``."""
        # A chunk gains a key with every memory written into it (by any
        # writer), so a chunk cached by an earlier call may be stale; within
        # this call the open cursor keeps one snapshot (and a snapshot() all of its calls).
        self._fresh_chunks()
        with self._reading("log", "SELECT id, sealed FROM log WHERE id >= ? AND id < ? ORDER BY id", (lo, hi)) as rows:
            out = [self._row(i, sealed) for i, sealed in rows]
        if len(out) != max(0, hi - lo) or any(r[0] != lo + k for k, r in enumerate(out)):
            raise Damaged("The log has a gap; restore this store from a backup.")
        return out

    def memories_at(self, ids: list[int]) -> list[tuple[int, str, str]]:
        """As :meth:`memories`, for memories ``ids`` (sorted, distinct),
        read a few hundred to a statement: the key chunk of ids that share
        one is opened once, not once per id."""
        out: list[tuple[int, str, str]] = []
        self._fresh_chunks()  # as in memories(): fresh chunks for this call
        chunks = sorted({i // KEYS_PER_CHUNK for i in ids}) if self._made("memory_keys") else []
        for k in range(0, len(chunks), 500):  # the key chunks first, a statement for many
            part = chunks[k : k + 500]
            for c, sealed, epoch in self.conn.execute(
                f"SELECT chunk, sealed, {self._epoch_sql('memory_keys')} FROM memory_keys "
                f"WHERE chunk IN ({', '.join('?' * len(part))})",
                part,
            ).fetchall():
                self._chunks[c] = self._open_chunk(c, sealed, epoch)
        for k in range(0, len(ids) if self._made("log") else 0, 500):
            part = ids[k : k + 500]
            rows = self.conn.execute(
                f"SELECT id, sealed FROM log WHERE id IN ({', '.join('?' * len(part))}) ORDER BY id", part
            ).fetchall()
            out += [self._row(i, sealed) for i, sealed in rows]
        if [r[0] for r in out] != ids:
            raise Damaged("The log has a gap; restore this store from a backup.")
        return out

    def _row(self, i: int, sealed: bytes) -> tuple[int, str, str]:
        key = self._memory_key(i)
        if key is None or self._is_erased(i):
            # The erasure record wins over a key: a key chunk put back
            # from before the erasure does not bring the text back. And
            # a key shredded is one the record names (_erased_row_date).
            return i, self._erased_row_date(i), ERASED
        return i, *self._decode(i, self._open_row(i, key, sealed))

    def memory(self, i: int) -> tuple[int, str, str]:
        return self.memories(i, i + 1)[0]

    def memory_writer(self, i: int) -> int | None:
        """The grant that wrote memory #i (0: not recorded); None once it is
        erased, since its key, and so the record, is gone."""
        self._chunks.clear()
        row = self.conn.execute("SELECT sealed FROM log WHERE id = ?", (i,)).fetchone() if self._made("log") else None
        if row is None:
            raise ValueError(f"no memory #{i} in this log")
        key = self._memory_key(i)
        if key is None or self._is_erased(i):
            return None
        return self._writer_of(self._open_row(i, key, row[0]))

    def writers(self, lo: int, hi: int) -> Iterator[tuple[int, int | None]]:
        """``(id, grant that wrote it)`` for memories ``[lo, hi)``, oldest
        first (0: not recorded); None for an erased memory. The writer is
        sealed inside the memory's own row, so only a capability that can
        read the memory can learn it."""
        self._fresh_chunks()
        with self._reading("log", "SELECT id, sealed FROM log WHERE id >= ? AND id < ? ORDER BY id", (lo, hi)) as rows:
            for i, sealed in rows:
                key = self._memory_key(i)
                if key is None or self._is_erased(i):
                    yield i, None
                else:
                    yield i, self._writer_of(self._open_row(i, key, sealed))
        self._chunks.clear()

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
        open_padded = aead.BulkOpener(LARGEST_MEMORY_PLAINTEXT).open_padded
        prefix = f"stash/v1|{self.user_id}|log|".encode()
        if start % SCAN_BATCH:
            raise ValueError("a scan starts on a batch boundary")
        if not self._made("log"):
            if T > start:
                raise Damaged("The log has a gap; restore this store from a backup.")
            return
        with closing(
            self.conn.execute("SELECT sealed FROM log WHERE id >= ? AND id < ? ORDER BY id", (start, T))
        ) as cur:
            yield from self._scan_rows(cur, T, start, open_padded, prefix)

    def _scan_rows(
        self,
        cur: sqlite3.Cursor,
        T: int,
        start: int,
        open_padded: Callable[[bytes, bytes, bytes], bytes],
        prefix: bytes,
    ) -> Iterator[list[str]]:
        """:meth:`scan`'s batches from ``cur``, its statement over the log."""
        short, expand = is_short, rebuild
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
                    append(self._render_unkeyed(i))
                else:
                    if short(sealed):
                        sealed = expand(sealed, key=key)
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

    def _render_unkeyed(self, i: int) -> str:
        return f"#{i} {self._erased_row_date(i)} {ERASED}"

    def _erased_row_date(self, i: int) -> str:
        """An erased memory's date, or Damaged: a memory without its key (or
        with a shredded one) that the authenticated erased ids do not name,
        or one they name without its erasure row. Before the erasure record
        (format mark 4) the erased ids were the table's own, so the first
        case could not arise otherwise; from it, this is what refuses a
        shredded key or an erased row swapped in from another copy."""
        if not self._is_erased(i):
            self._refresh_state()  # erased by another worker since this handle opened?
            if not self._is_erased(i):
                raise Damaged(f"The key of memory #{i} is missing; restore this store from a backup.")
        return self._erased_date(i)

    def _erased_date(self, i: int) -> str:
        rows = self._rows(
            self._tables(), "erased", f"SELECT sealed, {self._epoch_sql('erased')} FROM erased WHERE id = ?", (i,)
        )
        row = rows[0] if rows else None
        if row is None:
            raise Damaged(f"Memory #{i} has no key and no erasure record; restore this store from a backup.")
        return self._open_bound(erased_slot(i), row[0], row[1], i).decode()

    @property
    def erased_ids(self) -> frozenset[int]:
        """The erased memories, as the authenticated head of this file covers them."""
        return self._erased_ids
