"""The word index at rest: sealed segments of one piece per recall-cache piece.

Each piece (:mod:`stash.core.word_piece`) lists the folded words of 4,096
memories and which memories hold them. It lives in
the same ``recall.db`` as the recall cache and is kept exactly as a recall
cache piece is (:mod:`stash.storage.recallcache.rendered_log`): padded to a multiple of
``PAD_BYTES``, sealed under the file's rows key with associated data naming
the user, the table, the range and a digest of the erased ids in the range
(not of the key chunks' nonces: see :meth:`WordCache._keys_digests`); missing or unopenable pieces are
rebuilt from the log; written only under the memory file's write lock after
the digests are read again; and deleted, with the WAL folded into the file,
by the same :func:`stash.storage.recallcache.rendered_log.invalidate` an erasure calls.
The memories after the last complete piece are kept the same way in pieces
of 512 (:class:`WordTail`).

Each piece is kept as :data:`SEGMENTS` + 1 sealed segments
(:func:`stash.core.word_piece_write.split`, tables ``word_segs`` and
``word_tail_segs``): segment 0 the lengths of its memories, segment ``1 + b``
the words whose head (first two characters) a hash keyed by the file's rows
key puts in bucket ``b``, and the stem keys whose stem's head it puts there.
A search opens segment 0, the segments of its own words' heads (for a word
of one character, segment ``SEGMENTS + 1``: it holds each first
character's layers) and those of their stems' heads, not the piece
(:meth:`WordCache.segments`). Each segment
is padded and sealed as a piece is, with its segment number added to the
associated data, so a segment moved to another number, piece or user does
not open; it is written, and deleted by an erasure, with every other segment
of its piece. The keyed hash keeps which heads share a segment unknown
without the key: a segment's padded size tells how many postings
its bucket holds, to within ``PAD_BYTES``, never which words. So
what it holds at rest is what the recall cache holds (the words of the text,
without their order), under the same key, and an erased memory's words
survive in no piece, nor does an old piece open again when an old key chunk
and an old ``recall.db`` are put back.
"""

from __future__ import annotations

import bisect
import hashlib
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

from ...core import word_piece, word_piece_write
from ...crypto import aead
from . import rendered_log as sc
from .rendered_log import LENGTH_BYTES, MAX_PADDED, WORD_TAIL, ScanCache

SEGMENTS = 16
"""Word segments per piece (besides segment 0, the lengths): a query of one
word opens about a sixteenth of the postings, and a piece's segments cost
``SEGMENTS`` half-pads more at rest (about 8 bytes a memory)."""


CHARS = SEGMENTS + 1
"""The segment of first characters (:func:`stash.core.word_piece_write.split`,
last): each one's layers, read by a query word of one character alone."""


class WordCache(ScanCache):
    table = sc.WORD_SEG_TABLE
    old_table = sc.WORD_TABLE  # the layout before segments: dropped by the first write
    _marks = "?, ?, ?"  # a row: (piece, seg, sealed)
    _bucket_key = b""
    _buckets: dict[bytes, int]

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._buckets = {}

    def bucket(self, word: bytes) -> int:
        """The segment (1 to :data:`SEGMENTS`) of the words whose
        :func:`~stash.core.word_piece.head` (first two characters) is that
        of ``word`` (folded, UTF-8): a BLAKE2b MAC of the head under a
        32-byte key derived from the file's rows key, so which heads share a
        segment is unknown without it."""
        ch = word_piece.head(word)
        got = self._buckets.get(ch)
        if got is None:
            if not self._buckets:
                self._bucket_key = hashlib.blake2b(
                    b"word segments", digest_size=32, key=self._key, person=b"stash.wordseg"
                ).digest()
            h = hashlib.blake2b(ch, digest_size=8, key=self._bucket_key, person=b"stash.wordseg")
            got = self._buckets[ch] = 1 + int.from_bytes(h.digest(), "big") % SEGMENTS
        return got

    def buckets(self, word: bytes) -> list[int]:
        """The segments besides segment 0 that hold every word query word
        ``word`` prefixes: its head's, or for a word of one character the
        segment of first characters (:data:`CHARS`), which holds its layers."""
        if word_piece.one_char(word):
            return [CHARS]
        return [self.bucket(word)]

    def _seg_aad(self, piece: int, seg: int, keys_digest: bytes) -> bytes:
        return self._aad(piece, keys_digest) + f"|segment {seg} of {SEGMENTS} by head".encode()

    def segments(
        self, count: int, start: int, words: Iterable[bytes], stems: Iterable[bytes] = ()
    ) -> Iterator[tuple[int, dict[int, word_piece.PieceIndex] | None]]:
        """``(piece, {segment: its index})`` for pieces ``count - 1`` down to
        ``start``: segment 0, the segments of ``words`` and those of the
        ``stems`` (each the bucket of its head, where its key and the words
        having it are), or None when one of them is missing or does not
        open (the caller rebuilds the piece from the log). Reads only those
        segments; each piece by its own statement, so :meth:`store` may
        write between two of them."""
        if count <= start:
            return
        digests, have = self._begin(count, start)
        wanted = sorted({0}.union(*(self.buckets(w) for w in words), (self.bucket(s) for s in stems)))
        marks = ", ".join("?" * len(wanted))
        opener = aead.BulkOpener(MAX_PADDED)
        for piece in range(count - 1, start - 1, -1):
            got: dict[int, word_piece.PieceIndex] | None = None
            if piece in have and piece in digests and self.db is not None:
                try:
                    rows = self.db.execute(
                        f"SELECT seg, sealed FROM {self.table} WHERE piece = ? AND seg IN ({marks})", (piece, *wanted)
                    ).fetchall()
                except sqlite3.Error:
                    rows = []
                got = {}
                for seg, sealed in rows:
                    try:
                        plain = sc._unpad(opener.open(self._key, sealed, self._seg_aad(piece, seg, digests[piece])))
                        if plain is not None:
                            got[seg] = word_piece.PieceIndex(plain)
                    except (aead.Unsealable, word_piece.BadPiece):
                        pass
                if len(got) != len(wanted):
                    got = None
            yield piece, got

    def pieces(self, count: int, start: int = 0) -> Iterator[tuple[int, bytes | None]]:
        """Not for the word index: its pieces are read by segments
        (:meth:`segments`), never whole."""
        raise TypeError("the word index is read by segments()")

    def _pack(self, plain: bytes) -> bytes:
        """A word piece is sealed as it is: its segments are read one by one."""
        return plain

    def _rows(self, piece: int, plain: bytes, keys_digest: bytes) -> list[tuple[int | bytes, ...]]:
        """Piece ``plain`` (a whole word piece) cut into its segments, each
        sealed under its own number."""
        parts = word_piece_write.split(plain, lambda ch: self.bucket(ch) - 1, SEGMENTS)
        return [
            (piece, seg, aead.seal(self._key, sc._pad(part), self._seg_aad(piece, seg, keys_digest)))
            for seg, part in enumerate(parts)
        ]

    def _prepare(self, db: sqlite3.Connection) -> None:
        """Make the table of segments, and drop the table of whole pieces
        an older server kept: a cache, rebuilt as segments."""
        db.executescript(f"DROP TABLE IF EXISTS {self.old_table};")
        super()._prepare(db)

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
            erased = (
                sorted(
                    r[0]
                    for r in self.conn.execute(
                        "SELECT id FROM erased WHERE id >= ? AND id < ?", (start * size, stop * size)
                    )
                )
                if made.fetchone()
                else []
            )  # made by the first erasure
        else:
            erased = self._erased
        out: dict[int, bytes] = {}
        for piece in range(start, stop):
            lo = bisect.bisect_left(erased, piece * size)
            hi = bisect.bisect_left(erased, (piece + 1) * size)
            h = hashlib.blake2b(
                b"|erased|" + ",".join(map(str, erased[lo:hi])).encode(), digest_size=32, person=b"stash.wordindex"
            )
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

    table = sc.WORD_TAIL_SEG_TABLE
    old_table = sc.WORD_TAIL_TABLE
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
