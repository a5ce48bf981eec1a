"""Erasure: shredding memories by destroying their keys, the receipts that
record it, and flushing the pages that held a destroyed key.

The log rows stay; a memory's key slot is zeroed and its date kept in a
sealed erasure record, and only the summaries that contain it are dropped
(:meth:`SummaryTree.drop_erased`, tree.py).
"""

from __future__ import annotations

import json
from typing import Any

from ...core.errors import Damaged
from ...crypto import aead
from ..recallcache import rendered_log
from ..sqlite.transactions import flush, read_snapshot, write_transaction
from .base import ERASED_KEY, KEYS_PER_CHUNK, FileBase
from .bound import RECORD_MARKS, RowDigests
from .erasure_record import RECORD_META, UNREADABLE, from_tables
from .log import Log
from .row_tree import erased_slot, key_slot
from .rows import RowCodec
from .short_rows import tail_of
from .state import State
from .tree import SummaryTree


class Erasure:
    """Erasure in ``file``: keys shredded in ``log``'s key chunks, the
    summaries over them dropped from ``tree``, the rows it writes sealed by
    ``codec`` and bound by ``digests``, and ``state`` advanced."""

    def __init__(
        self, file: FileBase, codec: RowCodec, log: Log, tree: SummaryTree, digests: RowDigests, state: State
    ) -> None:
        self.file = file
        self.codec = codec
        self.log = log
        self.tree = tree
        self.digests = digests
        self.state = state

    def flush(self) -> bool:
        """Fold the WAL into the file and truncate it, so a page that held a
        destroyed key survives in neither (freed pages are zeroed by
        secure_delete): :func:`files.flush`. False when it could not be done
        yet; every later close of the file tries again."""
        return flush(self.file.conn)

    def erase(self, ids: list[int], at: str) -> tuple[int, list[int], list[tuple[int, int]]]:
        """Shred memories: record each one's date, zero its key slot, drop
        only the summaries that contain it (:meth:`SummaryTree.drop_erased`).
        The log rows are not touched. Returns (receipt id, newly erased ids,
        dropped blocks). Cost: O(log T) per erased memory."""
        with write_transaction(self.file.conn):
            self.file.ensure_table("erased")
            self.file.ensure_table("erasures")
            self.file.chunks.clear()
            T = self.file.count()
            # What is erased now, read under the write lock: another worker may
            # have erased since this handle opened, and the record this write
            # makes must name those too (else its runs and counts disagree).
            current = self.file.record_now() if self.file.format_mark() in RECORD_MARKS else None
            before = current.ids() if current is not None else self.file.erased_ids
            wanted = [i for i in sorted(set(ids)) if i < T]
            dates = self._dates_of(wanted)
            self.file.chunks.clear()  # _dates_of read the chunks as they are; the shredding starts from them afresh
            fresh: list[int] = []
            shredded: list[int] = []
            touched: dict[int, bytearray] = {}
            shorts = self.log.short_rows(wanted)
            for i in wanted:
                key = self.log.memory_key(i)
                if key is None:
                    continue
                if i in shorts:  # its key goes now: what the running digest needs of its row stays
                    self.log.ensure_tails()
                    self.file.conn.execute(
                        "INSERT OR IGNORE INTO log_tails(id, tail) VALUES (?, ?)", (i, tail_of(shorts[i], key))
                    )
                # Erased already, yet its key is back: a key chunk from
                # before the erasure was put back. Shred it again; the
                # record stays as it is.
                again = i in before
                if not again:
                    cols, marks, epoch = self.codec.epoch_of_write("erased")
                    sealed = aead.seal(self.file.rows_key, dates[i].encode(), self.codec.aad("erased", i))
                    self.file.conn.execute(
                        f"INSERT INTO erased(id, sealed{cols}) VALUES (?, ?{marks})", (i, sealed, *epoch)
                    )
                    self.digests.bind(erased_slot(i), sealed)
                c = i // KEYS_PER_CHUNK
                if c not in touched:
                    sealed_chunk = self.log.chunk(c)
                    assert sealed_chunk is not None  # memory i has its key, so its chunk exists
                    touched[c] = bytearray(sealed_chunk)
                k = (i % KEYS_PER_CHUNK) * aead.KEY_BYTES
                touched[c][k : k + aead.KEY_BYTES] = ERASED_KEY
                self.file.chunks[c] = bytes(touched[c])
                (shredded if again else fresh).append(i)
            # Each touched chunk re-sealed once, however many of its keys went.
            for c, chunk in touched.items():
                also, _, epoch = self.codec.epoch_of_write("memory_keys")
                sealed = aead.seal(self.file.rows_key, bytes(chunk), self.codec.aad("memory_keys", c))
                self.file.conn.execute(
                    f"UPDATE memory_keys SET sealed = ?{' , epoch = ?' if also else ''} WHERE chunk = ?",
                    (sealed, *epoch, c),
                )
                self.digests.bind(key_slot(c), sealed)
            # The recall cache holds these memories' rendered text: its pieces
            # go while this transaction holds the write lock (rendered_log.py).
            rendered_log.invalidate(self.file.fk.path.parent, fresh + shredded)
            version = self.file.next_version()
            gone = self.tree.drop_erased(fresh, T, version) if fresh and T >= 2 else []
            if fresh:
                # A recorded idempotent answer may quote an erased memory (a
                # nap's source lines); it must not outlive the memory's key.
                if "idempotency" in self.file.tables():
                    self.file.conn.execute("DELETE FROM idempotency")
            receipt = {"ids": sorted(set(ids)), "erased": fresh, "dropped": len(gone), "at": at}
            cur = self.file.conn.execute("INSERT INTO erasures(sealed) VALUES (?)", (b"",))
            rid = int(cur.lastrowid or 0)
            also, _, epoch = self.codec.epoch_of_write("erasures")
            self.file.conn.execute(
                f"UPDATE erasures SET sealed = ?{' , epoch = ?' if also else ''} WHERE id = ?",
                (
                    aead.seal(self.file.rows_key, json.dumps(receipt).encode(), self.codec.aad("erasures", rid)),
                    *epoch,
                    rid,
                ),
            )
            if self.file.format_mark() in RECORD_MARKS:
                # The record that stands for both tables in the state digest, rewritten whole (SQLite's work).
                record = from_tables(self.file.conn, self.file.tables(), before | set(fresh))
                self.file.put_meta(RECORD_META, record.text())
            self.state.write()
        self.file.chunks.clear()
        return rid, fresh, gone

    def _dates_of(self, ids: list[int]) -> dict[int, str]:
        """The dates of memories ``ids`` (sorted), read one run of
        consecutive ids at a time rather than one row each."""
        out: dict[int, str] = {}
        start = 0
        for k in range(1, len(ids) + 1):
            if k == len(ids) or ids[k] != ids[k - 1] + 1:
                for i, date, _ in self.log.memories(ids[start], ids[k - 1] + 1):
                    out[i] = date
                start = k
        return out

    def check_record(self) -> None:
        """The full check of the erasure record (``stash verify --token``,
        and each listing of the receipts): recomputed from both tables, ids,
        counts and every row's bytes, it must equal the authenticated one.
        Before mark 4 the state digest read every row at open already."""
        if self.file.format_mark() not in RECORD_MARKS:
            return
        with read_snapshot(self.file.conn):
            record, tables = self.file.record_now(), self.file.tables()
            found = from_tables(self.file.conn, tables)
        if record != found and not (record is None and (found.erased, found.receipts) == (0, 0)):
            raise Damaged(UNREADABLE)

    def receipts(self) -> list[dict[str, Any]]:
        """Every erasure receipt, opened; the erasure record is checked in
        full first (from mark 4 an open checks only its counts), so a receipt
        or erased row put back from a second history is refused here."""
        out = []
        ep = self.codec.epoch_sql("erasures")
        with read_snapshot(self.file.conn):
            self.check_record()
            rows = self.file.rows(self.file.tables(), "erasures", f"SELECT id, sealed, {ep} FROM erasures ORDER BY id")
        for rid, sealed, epoch in rows:
            out.append(
                {"receipt": rid, **json.loads(self.codec.open(self.codec.key_of(epoch), sealed, "erasures", rid))}
            )
        return out

    def erased_keys_back(self) -> list[int]:
        """Erased memories whose key slot holds a key again: a key chunk (or
        its page) from before the erasure was put back. They are still served
        as erased; erasing them again shreds the key."""
        self.file.chunks.clear()
        try:
            return [i for i in sorted(self.file.erased_ids) if self.log.memory_key(i) is not None]
        finally:
            self.file.chunks.clear()

    def erased_count(self) -> int:
        rows = self.file.rows(self.file.tables(), "erased", "SELECT COUNT(*) FROM erased")
        return int(rows[0][0]) if rows else 0
