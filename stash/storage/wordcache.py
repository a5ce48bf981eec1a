"""The word index at rest: one sealed piece per recall-cache piece.

Each piece (:mod:`stash.core.word_piece`) lists the folded words of 4,096
memories and which memories hold them. It lives in the ``word_cache`` table of
the same ``recall.db`` as the recall cache and is kept exactly as a recall
cache piece is (:mod:`stash.storage.scancache`): padded to a multiple of
``PAD_BYTES``, sealed under the file's rows key with associated data naming
the user, the table, the range and a digest of the erased ids in the range
(not of the key chunks' nonces: see :meth:`WordCache._keys_digests`); missing or unopenable pieces are
rebuilt from the log; written only under the memory file's write lock after
the digests are read again; and deleted, with the WAL folded into the file,
by the same :func:`stash.storage.scancache.invalidate` an erasure calls.
The memories after the last complete piece are kept the same way in pieces
of 512 (:class:`WordTail`, table ``word_tail``). So
what it holds at rest is what the recall cache holds (the words of the text,
without their order), under the same key, and an erased memory's words
survive in no piece, nor does an old piece open again when an old key chunk
and an old ``recall.db`` are put back.
"""

from __future__ import annotations

import bisect
import hashlib
import sqlite3

from .scancache import LENGTH_BYTES, MAX_PADDED, WORD_TABLE, WORD_TAIL, WORD_TAIL_TABLE, ScanCache


class WordCache(ScanCache):
    table = WORD_TABLE

    def _keys_digests(self, start: int, stop: int) -> dict[int, bytes]:
        """For each piece in ``[start, stop)``, a digest of the erased ids in
        its range, bound into the piece's associated data in place of the
        recall cache's digest of key-chunk nonces (reading a million
        memories' key chunks costs more than the whole search). The erasure
        record is what makes a piece from before an erasure unopenable after
        it, old key chunks put back or not: the ids come from the memory
        file's authenticated erasure record when the pieces are read, and
        from its ``erased`` rows under the write lock when :meth:`store`
        checks again that no erasure landed meanwhile (a wrong row there can
        only stop a piece being written, or make one that never opens)."""
        size = self.size
        if self.conn.in_transaction:
            made = self.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'erased'")
            erased = sorted(r[0] for r in self.conn.execute(
                "SELECT id FROM erased WHERE id >= ? AND id < ?", (start * size, stop * size))) \
                if made.fetchone() else []  # made by the first erasure
        else:
            erased = self._erased
        out: dict[int, bytes] = {}
        for piece in range(start, stop):
            lo = bisect.bisect_left(erased, piece * size)
            hi = bisect.bisect_left(erased, (piece + 1) * size)
            h = hashlib.blake2b(b"|erased|" + ",".join(map(str, erased[lo:hi])).encode(), digest_size=32,
                                person=b"stash.wordindex")
            out[piece] = h.digest()
        return out

    def store(self, built: dict[int, bytes]) -> None:
        """As :meth:`ScanCache.store`; a piece too large to open again
        (only text built to defeat it gets there) is not written: it is
        rebuilt from the log by each search."""
        super().store({p: data for p, data in built.items() if len(data) + LENGTH_BYTES <= MAX_PADDED})


class WordTail(WordCache):
    """The pieces of ``WORD_TAIL`` memories after the last complete
    ``WordCache`` piece, so a search builds at most ``WORD_TAIL - 1`` memories
    from the log; each bound by its own key chunks as a piece is."""

    table = WORD_TAIL_TABLE
    size = WORD_TAIL

    def drop_below(self, piece: int) -> None:
        """Delete the tail pieces before ``piece``: their memories are in
        complete word index pieces now. Best effort, as writing them is."""
        if self.db is None:
            return
        try:
            self.db.execute(f"DELETE FROM {self.table} WHERE piece < ?", (piece,))
        except sqlite3.Error:
            pass
