"""The log and its key chunks: appending memories, reading them back, the
scan a recall runs over the whole log, the walk of its running digest, and
its old rows stored short (short_rows.py) and rebuilt for every read.

Each memory is sealed under its own random key; the keys sit in chunks of
:data:`KEYS_PER_CHUNK`, each chunk sealed under the rows key. Ids are dense
from 0 and taken inside the write lock; a zeroed key slot is an erased
memory, and the erasure record (not the slot) decides what is served, so a
key chunk put back from before an erasure never brings a text back.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing

from ...core.errors import Damaged, RolledBack
from ...crypto import aead, chain
from ...crypto.chain import Head
from .. import formats
from ..sqlite.transactions import write_transaction
from .base import CHUNK_BYTES, ERASED_KEY, HEAD_META, KEYS_PER_CHUNK, ROLLED_BACK, FileBase
from .bound import RowDigests
from .row_tree import erased_slot, key_slot
from .rows import ERASED, LARGEST_MEMORY_PLAINTEXT, RowCodec
from .short_rows import FULL_SEALED, SHORT_OVERHEAD, expand, is_short, shorten
from .short_rows import expand as rebuild
from .state import State

SCAN_BATCH = 32 * KEYS_PER_CHUNK  # whole chunks, so a batch starts on a chunk boundary


class Log:
    """The log of ``file``: its rows, sealed by ``codec``, each under its own
    key from a key chunk that ``digests`` binds to the authenticated state
    (``state``, which each append advances and a read may authenticate afresh)."""

    def __init__(self, file: FileBase, codec: RowCodec, digests: RowDigests, state: State) -> None:
        self.file = file
        self.codec = codec
        self.digests = digests
        self.state = state

    def chunk(self, c: int, *, create: bool = False) -> bytes | None:
        if c in self.file.chunks:
            return self.file.chunks[c]
        row = (
            self.file.conn.execute(
                f"SELECT sealed, {self.codec.epoch_sql('memory_keys')} FROM memory_keys WHERE chunk = ?", (c,)
            ).fetchone()
            if self.file.made("memory_keys")
            else None
        )
        if row is None:
            if not create:
                return None
            self.file.ensure_table("memory_keys")
            plain = os.urandom(CHUNK_BYTES)
            cols, marks, epoch = self.codec.epoch_of_write("memory_keys")
            sealed = aead.seal(self.file.rows_key, plain, self.codec.aad("memory_keys", c))
            self.file.conn.execute(
                f"INSERT INTO memory_keys(chunk, sealed{cols}) VALUES (?, ?{marks})", (c, sealed, *epoch)
            )
            self.digests.bind(key_slot(c), sealed)
        else:
            plain = self.open_chunk(c, row[0], row[1])
        self.file.chunks[c] = plain
        return plain

    def open_chunk(self, c: int, sealed: bytes, epoch: int | None) -> bytes:
        plain = self.digests.open_bound(key_slot(c), sealed, epoch, c)
        if len(plain) != CHUNK_BYTES:
            raise Damaged("A memory key chunk has the wrong size; restore this store from a backup.")
        return plain

    def memory_key(self, i: int, *, create: bool = False) -> bytes | None:
        chunk = self.chunk(i // KEYS_PER_CHUNK, create=create)
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
        with write_transaction(self.file.conn):
            self.file.chunks.clear()  # another writer may have created chunks
            self.file.ensure_table("log")
            self.file.ensure_table("memory_keys")
            base = self.file.count()
            stored = self.file.stored_head()
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
                    existing = self.chunk(c)
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
                sealed = aead.seal(key, self.codec.memory_plain(date, text), self.codec.aad("log", i))
                self.file.conn.execute("INSERT INTO log(id, sealed) VALUES (?, ?)", (i, sealed))
                prev, digest = digest, chain.step(self.file.chain_key, digest, i, sealed)
            cols, marks, epoch = self.codec.epoch_of_write("memory_keys")
            also = ", epoch = excluded.epoch" if epoch else ""
            for c, plain_chunk in touched.items():
                sealed_chunk = aead.seal(self.file.rows_key, bytes(plain_chunk), self.codec.aad("memory_keys", c))
                self.file.conn.execute(
                    f"INSERT INTO memory_keys(chunk, sealed{cols}) VALUES (?, ?{marks}) "
                    f"ON CONFLICT(chunk) DO UPDATE SET sealed = excluded.sealed{also}",
                    (c, sealed_chunk, *epoch),
                )
                self.digests.bind(key_slot(c), sealed_chunk)
                self.file.chunks[c] = bytes(plain_chunk)
            head = Head(base + len(items), digest)
            self.file.put_meta(HEAD_META, self.file.head_text(head, prev))
            self.state.write()
        self.file.head = head
        return base

    def recompute_head(self) -> tuple[Head, bytes]:
        """The head from the whole log, and the digest before it: O(T)."""
        key = self.file.chain_key
        digest = prev = chain.genesis(key, self.file.user_id)
        i = 0
        if not self.file.made("log"):
            return Head(0, digest), prev
        with closing(self.file.conn.execute("SELECT id, sealed FROM log ORDER BY id")) as rows:

            def in_order() -> Iterator[tuple[int, bytes]]:
                for k, (i_row, stored) in enumerate(rows):
                    if i_row != k:
                        raise Damaged("The log has a gap; restore this store from a backup.")
                    yield i_row, stored

            for sealed in self.chain_rows(in_order()):
                prev, digest = digest, chain.step(key, digest, i, sealed)
                i += 1
        return Head(i, digest), prev

    def memories(self, lo: int, hi: int) -> list[tuple[int, str, str]]:
        """``(id, date, text)`` for memories ``[lo, hi)``; an erased one has
        text ``[erased]``."""
        # A chunk gains a key with every memory written into it (by any
        # writer), so a chunk cached by an earlier call may be stale; within
        # this call the open cursor keeps one snapshot (and a snapshot() all of its calls).
        self.file.fresh_chunks()
        with self.file.reading(
            "log", "SELECT id, sealed FROM log WHERE id >= ? AND id < ? ORDER BY id", (lo, hi)
        ) as rows:
            out = [self._row(i, sealed) for i, sealed in rows]
        if len(out) != max(0, hi - lo) or any(r[0] != lo + k for k, r in enumerate(out)):
            raise Damaged("The log has a gap; restore this store from a backup.")
        return out

    def memories_at(self, ids: list[int]) -> list[tuple[int, str, str]]:
        """As :meth:`memories`, for memories ``ids`` (sorted, distinct),
        read a few hundred to a statement: the key chunk of ids that share
        one is opened once, not once per id."""
        out: list[tuple[int, str, str]] = []
        self.file.fresh_chunks()  # as in memories(): fresh chunks for this call
        chunks = sorted({i // KEYS_PER_CHUNK for i in ids}) if self.file.made("memory_keys") else []
        for k in range(0, len(chunks), 500):  # the key chunks first, a statement for many
            part = chunks[k : k + 500]
            for c, sealed, epoch in self.file.conn.execute(
                f"SELECT chunk, sealed, {self.codec.epoch_sql('memory_keys')} FROM memory_keys "
                f"WHERE chunk IN ({', '.join('?' * len(part))})",
                part,
            ).fetchall():
                self.file.chunks[c] = self.open_chunk(c, sealed, epoch)
        for k in range(0, len(ids) if self.file.made("log") else 0, 500):
            part = ids[k : k + 500]
            rows = self.file.conn.execute(
                f"SELECT id, sealed FROM log WHERE id IN ({', '.join('?' * len(part))}) ORDER BY id", part
            ).fetchall()
            out += [self._row(i, sealed) for i, sealed in rows]
        if [r[0] for r in out] != ids:
            raise Damaged("The log has a gap; restore this store from a backup.")
        return out

    def _row(self, i: int, sealed: bytes) -> tuple[int, str, str]:
        key = self.memory_key(i)
        if key is None or self.file.is_erased(i):
            # The erasure record wins over a key: a key chunk put back
            # from before the erasure does not bring the text back. And
            # a key shredded is one the record names (_erased_row_date).
            return i, self._erased_row_date(i), ERASED
        return i, *self.codec.decode(i, self.open_row(i, key, sealed))

    def memory(self, i: int) -> tuple[int, str, str]:
        return self.memories(i, i + 1)[0]

    def memory_writer(self, i: int) -> int | None:
        """The grant that wrote memory #i (0: not recorded); None once it is
        erased, since its key, and so the record, is gone."""
        self.file.chunks.clear()
        row = (
            self.file.conn.execute("SELECT sealed FROM log WHERE id = ?", (i,)).fetchone()
            if self.file.made("log")
            else None
        )
        if row is None:
            raise ValueError(f"no memory #{i} in this log")
        key = self.memory_key(i)
        if key is None or self.file.is_erased(i):
            return None
        return self.codec.writer_of(self.open_row(i, key, row[0]))

    def writers(self, lo: int, hi: int) -> Iterator[tuple[int, int | None]]:
        """``(id, grant that wrote it)`` for memories ``[lo, hi)``, oldest
        first (0: not recorded); None for an erased memory. The writer is
        sealed inside the memory's own row, so only a capability that can
        read the memory can learn it."""
        self.file.fresh_chunks()
        with self.file.reading(
            "log", "SELECT id, sealed FROM log WHERE id >= ? AND id < ? ORDER BY id", (lo, hi)
        ) as rows:
            for i, sealed in rows:
                key = self.memory_key(i)
                if key is None or self.file.is_erased(i):
                    yield i, None
                else:
                    yield i, self.codec.writer_of(self.open_row(i, key, sealed))
        self.file.chunks.clear()

    def newest_date(self, T: int | None = None) -> str | None:
        T = self.file.count() if T is None else T
        return self.memory(T - 1)[1] if T else None

    def scan(self, T: int, start: int = 0) -> Iterator[list[str]]:
        """Every memory in ``[start, T)`` rendered as ``#i DATE TEXT``, in
        batches, oldest first (``start`` a multiple of SCAN_BATCH). Streams: a
        million memories are never held at once.

        Rows are read without their ids: each is opened with associated data
        naming the position it should be at, so a missing, extra or moved row
        fails to authenticate and is reported as damage."""
        open_padded = aead.BulkOpener(LARGEST_MEMORY_PLAINTEXT).open_padded
        prefix = f"stash/v1|{self.file.user_id}|log|".encode()
        if start % SCAN_BATCH:
            raise ValueError("a scan starts on a batch boundary")
        if not self.file.made("log"):
            if T > start:
                raise Damaged("The log has a gap; restore this store from a backup.")
            return
        with closing(
            self.file.conn.execute("SELECT sealed FROM log WHERE id >= ? AND id < ? ORDER BY id", (start, T))
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
        erased = self.file.erased_ids
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
                    self.file.chunks.clear()
                    chunk = self.chunk(i // KEYS_PER_CHUNK) or b""
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
        self.file.chunks.clear()
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
        if not self.file.is_erased(i):
            self.state.refresh()  # erased by another worker since this handle opened?
            if not self.file.is_erased(i):
                raise Damaged(f"The key of memory #{i} is missing; restore this store from a backup.")
        return self._erased_date(i)

    def _erased_date(self, i: int) -> str:
        rows = self.file.rows(
            self.file.tables(),
            "erased",
            f"SELECT sealed, {self.codec.epoch_sql('erased')} FROM erased WHERE id = ?",
            (i,),
        )
        row = rows[0] if rows else None
        if row is None:
            raise Damaged(f"Memory #{i} has no key and no erasure record; restore this store from a backup.")
        return self.digests.open_bound(erased_slot(i), row[0], row[1], i).decode()

    # Rows stored short (short_rows.py): rebuilt for every read and every walk
    # of the running digest, their tails recorded when their keys go.

    def open_row(self, i: int, key: bytes, stored: bytes) -> bytes:
        """Memory #i's padded plaintext from its row as stored, full or short."""
        return self.codec.open(key, expand(stored, key=key) if is_short(stored) else stored, "log", i)

    def _tail(self, i: int) -> bytes | None:
        """The tail recorded for short row #i when its key was erased."""
        if not self.file.made("log_tails"):
            return None
        row = self.file.conn.execute("SELECT tail FROM log_tails WHERE id = ?", (i,)).fetchone()
        return None if row is None else bytes(row[0])

    def chain_rows(self, rows: Iterable[tuple[int, bytes]]) -> Iterator[bytes]:
        """The sealed bytes the running digest covers, row by row, for
        ``(id, row as stored)``: a short row is rebuilt from its memory's key,
        or from its recorded tail once the key is erased. Each key chunk is
        read once and not kept, so a walk over a million rows holds one."""
        c_now, chunk = -1, b""
        for i, stored in rows:
            if not is_short(stored):
                yield stored
                continue
            c = i // KEYS_PER_CHUNK
            if c != c_now:
                self.file.chunks.pop(c_now, None)
                chunk = self.chunk(c) or b""
                c_now = c
            slot = (i % KEYS_PER_CHUNK) * aead.KEY_BYTES
            key: bytes | None = chunk[slot : slot + aead.KEY_BYTES]
            if key == ERASED_KEY or len(key or b"") != aead.KEY_BYTES:
                key = None
            yield expand(stored, key=key, tail=None if key is not None else self._tail(i))
        self.file.chunks.pop(c_now, None)

    def short_rows(self, ids: list[int]) -> dict[int, bytes]:
        """The rows of ``ids`` stored short (short_rows.py), as stored."""
        out: dict[int, bytes] = {}
        for k in range(0, len(ids) if self.file.made("log") else 0, 500):
            part = ids[k : k + 500]
            out.update(
                self.file.conn.execute(
                    f"SELECT id, sealed FROM log WHERE id IN ({', '.join('?' * len(part))}) "
                    f"AND length(sealed) % {formats.BUCKET_BYTES} = {SHORT_OVERHEAD % formats.BUCKET_BYTES}",
                    part,
                ).fetchall()
            )
        return out

    def ensure_tails(self) -> None:
        """Make the tails table (schema.sql, "memory_tails") inside the
        caller's write transaction, as :meth:`FileBase.ensure_table` makes the others."""
        if not self.file.made("log_tails"):
            self.file.made_here.add("log_tails")
            formats.make_on_use(self.file.conn, "memory_tails", "log_tails")

    def shorten_rows(self, start: int, limit: int) -> tuple[int, int]:
        """Store up to ``limit`` one-size memory rows from id ``start`` on
        short (short_rows.py), in one write transaction; returns the id to go
        on from (the log's size once every row was looked at) and how many
        were shortened. Each is checked to rebuild to the very bytes it
        replaces before it is written, so what every row opens to, the
        running digest and every pin stay as they were. A row whose key is
        erased, or whose text fills its bucket, stays whole. The log's
        append-only trigger on updates is lifted for this transaction only
        and put back as it was: the state digest covers its text."""
        if not self.file.made("log"):
            return start, 0
        with write_transaction(self.file.conn):
            rows = self.file.conn.execute(
                f"SELECT id, sealed FROM log WHERE id >= ? AND length(sealed) IN "
                f"({', '.join('?' * len(FULL_SEALED))}) ORDER BY id LIMIT ?",
                (start, *sorted(FULL_SEALED), limit),
            ).fetchall()
            if not rows:
                return self.file.count(), 0
            self.file.chunks.clear()
            moved: list[tuple[bytes, int]] = []
            for i, sealed in rows:
                key = self.memory_key(i)
                if key is None:
                    continue
                short = shorten(sealed, self.codec.open(key, sealed, "log", i))
                if short is not None and expand(short, key=key) == sealed:
                    moved.append((short, i))
            self.file.chunks.clear()
            if moved:
                (trigger,) = self.file.conn.execute(
                    "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = 'log_no_update'"
                ).fetchone()
                self.file.conn.execute("DROP TRIGGER log_no_update")
                self.file.conn.executemany("UPDATE log SET sealed = ? WHERE id = ?", moved)
                self.file.conn.execute(trigger)
        return rows[-1][0] + 1, len(moved)
