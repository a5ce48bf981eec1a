"""The word index at rest: one sealed piece per recall-cache piece.

Each piece (:mod:`stash.core.word_piece`) lists the folded words of 4,096
memories and which memories hold them. It lives in the ``word_cache`` table of
the same ``recall.db`` as the recall cache and is kept exactly as a recall
cache piece is (:mod:`stash.storage.scancache`): padded to a multiple of
``PAD_BYTES``, sealed under the file's rows key with associated data naming
the user, the table, the range and the digest of the covering key chunks'
nonces and of the erased ids in the range; missing or unopenable pieces are
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

import sqlite3

from .scancache import LENGTH_BYTES, MAX_PADDED, WORD_TABLE, WORD_TAIL, WORD_TAIL_TABLE, ScanCache


class WordCache(ScanCache):
    table = WORD_TABLE

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
