"""One piece of the word index, as bytes (docs/DESIGN.md, "Word search").

A piece covers a run of at most 65,536 memories (the service uses the recall
cache's pieces of 4,096) and holds, for the folded words of their text
(:func:`stash.core.words.words`):

* the distinct words, sorted by their UTF-8 bytes and joined by ``\\n``;
* for each word, the memories that hold it (their offsets in the piece, or
  a bitmap of the piece: below), in one array, word after word;
* for each memory, how many words its text holds (0 for one erased or absent).

Words sorted by bytes put every word a query word prefixes in one run
(UTF-8 sorts as code points do, and no UTF-8 byte is 0xFF, so the run ends
before ``word + b"\\xff"``), and their postings are then one slice of the
array: :meth:`PieceIndex.run`.

The piece also keeps the words' stems (:func:`stash.core.words.stemmed`),
so that a query word finds the words sharing one of its stems without
stemming the memories again:

* for each word, one byte of flags: :data:`OWN` of a language when one of
  the word's stems in it is the word itself ("move" is its own English stem);
* for each other stem (a stem some word has that is not that word), under
  the key of its language code and the stem (``e`` + ``move``), the words
  that have it ("moved", "moving"), as indexes into the words, sorted like
  the words and joined the same way.

So the words sharing stem ``s`` of a language are the word ``s`` when its
flag says so, and the words the key of ``s`` lists (:meth:`PieceIndex.mates`).

Layout: ``b"WP5"``, the stemmers' :data:`stash.core.stems.TAG`, then nine
little-endian uint32 (word count, bytes of the joined words, postings
count, memories holding a word, words in all, the memories the piece
covers, stem keys, bytes of the joined stem keys, stem references), the
joined words (each preceded by ``\n``), ``word count`` uint32 offsets of
the words' ``\n`` in the joined words, ``word count + 1`` uint32 starts
into the postings, the postings as uint16, ``word count`` flag bytes, the
joined stem keys, their offsets and starts as the words' are, the
references as uint32, then one uint16 length per memory to the end. A
lookup never splits the words: the first and last word a prefix starts are
the first and last ``\n + prefix`` in the joined words (they are
contiguous), found by ``bytes.find`` and ``rfind``; a word or a stem key
alone is ``\n + key + \n`` (or the last).

A word's postings are one of two forms, told apart by their count alone: a
word held by fewer than :func:`bitmap_units` (one sixteenth of the piece's
memories) lists their offsets, sorted; a word held by more is that many
uint16 of a bitmap (bit ``k`` of the little-endian number: memory ``k``
holds the word), never longer than the list it replaces. A search then
takes a common word's memories as one integer (:meth:`PieceIndex.bits`) and
unions, intersects and counts them without touching one memory at a time.
``WP2`` (lists only), ``WP3`` (no segment of first characters), ``WP4`` (no
stems) and pieces of other stemmers (another :data:`stash.core.stems.TAG`)
are not read: the index is a cache, rebuilt.
"""

from __future__ import annotations

import itertools
import operator
import struct
import sys
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from typing import Union

from . import stems
from .words_top import layers, merge, ones

MAGIC = b"WP5"
_HEAD = struct.Struct("<3s4sIIIIIIIII")
MAX_MEMORIES = 1 << 16
OWN = {code: 1 << k for k, code in enumerate(stems.LANGUAGES)}
"""A word's flag bit of each language: one of its stems in it is the word itself."""


class BadPiece(ValueError):
    """Bytes that are not a word piece (never expected from a sealed piece)."""


Ints = Union["array[int]", "memoryview[int]"]
"""A piece's numbers as read back: on a little-endian machine a view of the
piece's own bytes (nothing copied: a search reads only the few it looks up)."""


def _le(values: Ints) -> bytes:
    if sys.byteorder == "big" and isinstance(values, array):
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def _from_le(typecode: str, data: memoryview) -> Ints:
    out = array(typecode)
    if len(data) % out.itemsize:
        raise BadPiece("truncated word piece")
    if sys.byteorder == "little":
        return data.cast("I") if typecode == "I" else data.cast("H")
    out.frombytes(data)
    out.byteswap()
    return out


def bitmap_units(memories: int) -> int:
    """The uint16 of a bitmap over ``memories`` memories: a word's postings
    of exactly this count are a bitmap, of fewer a list of offsets."""
    return (memories + 15) // 16


def _units_of(data: bytes) -> array[int]:
    """Little-endian bytes as uint16 values, which :func:`_le` writes back as such."""
    out = array("H")
    out.frombytes(data)
    if sys.byteorder == "big":
        out.byteswap()
    return out


def _char_end(word: bytes, pos: int) -> int:
    lead = word[pos]
    return pos + (1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4)


def one_char(word: bytes) -> bool:
    """Is ``word`` (UTF-8) a single character?"""
    return bool(word) and _char_end(word, 0) >= len(word)


def head(word: bytes) -> bytes:
    """The first two characters of a UTF-8 word (the word, when it has
    one): every word a query word of two or more characters prefixes
    starts with the query word's head. A query word of one character may
    prefix words of any head."""
    if not word:
        return word
    end = _char_end(word, 0)
    return word[: _char_end(word, end) if end < len(word) else end]


def _exact(joined: bytes, at: Ints, key: bytes) -> int:
    """The index of ``key`` itself among the keys joined in ``joined``
    (their offsets ``at``), or -1."""
    k = b"\n" + key
    pos = joined.find(k + b"\n")
    if pos < 0:
        if not joined.endswith(k):
            return -1
        pos = len(joined) - len(k)
    i = bisect_left(at, pos)
    if i >= len(at) or at[i] != pos:
        raise BadPiece("inconsistent word piece")
    return i


class PieceIndex:
    """A piece read back: look a query word up with :meth:`bits` (or
    :meth:`positions`). ``held`` is how many of its memories hold a word,
    ``words`` their words in all, ``memories`` how many it covers; ``raw``
    the postings as little-endian bytes, ``length_bytes`` the lengths so."""

    __slots__ = (
        "_stem_arrays",
        "_stem_keys",
        "_stem_view",
        "at",
        "flags",
        "held",
        "joined",
        "length_bytes",
        "lengths",
        "memories",
        "postings",
        "raw",
        "starts",
        "stem_joined",
        "units",
        "words",
    )

    def __init__(self, data: bytes) -> None:
        if len(data) < _HEAD.size:
            raise BadPiece("short word piece")
        magic, tag, n, joined, flat, self.held, self.words, self.memories, m, stem_joined, refs = _HEAD.unpack_from(
            data
        )
        if magic != MAGIC:
            raise BadPiece("not a word piece")
        if tag != stems.TAG:
            raise BadPiece("a word piece of other stemmers")
        pos = _HEAD.size
        view = memoryview(data)
        self.joined = data[pos : pos + joined]
        pos += joined
        self.at = _from_le("I", view[pos : pos + 4 * n])
        pos += 4 * n
        self.starts = _from_le("I", view[pos : pos + 4 * (n + 1)])
        pos += 4 * (n + 1)
        self.raw = view[pos : pos + 2 * flat]
        self.postings = _from_le("H", self.raw)
        pos += 2 * flat
        self.flags = view[pos : pos + n]
        pos += n
        self.stem_joined = data[pos : pos + stem_joined]
        pos += stem_joined
        # The stem keys' offsets, starts and references are read when a stem is first looked up (most
        # segments a search opens are never asked one); their sizes and ends are checked here.
        self._stem_view = view[pos : pos + 4 * (m + m + 1 + refs)]
        self._stem_keys = m
        self._stem_arrays: tuple[Ints, Ints, Ints] | None = None
        last_at = int.from_bytes(view[pos + 4 * (m - 1) : pos + 4 * m], "little") if m else 0
        last_start = int.from_bytes(view[pos + 8 * m : pos + 8 * m + 4], "little")
        pos += 4 * (m + m + 1 + refs)
        self.length_bytes = view[pos:]
        self.lengths = _from_le("H", self.length_bytes)
        self.units = bitmap_units(self.memories)
        if (
            len(self.joined) != joined
            or len(self.at) != n
            or len(self.starts) != n + 1
            or len(self.postings) != flat
            or self.starts[-1] != flat
            or (n and self.at[-1] >= joined)
            or len(self.flags) != n
            or len(self.stem_joined) != stem_joined
            or len(self._stem_view) != 4 * (m + m + 1 + refs)
            or last_start != refs
            or (m and last_at >= stem_joined)
            or len(self.lengths) not in (0, self.memories)
        ):
            raise BadPiece("inconsistent word piece")

    def stem_arrays(self) -> tuple[Ints, Ints, Ints]:
        """The stem keys' offsets in the joined keys, their starts into the
        references, and the references (word indexes)."""
        if self._stem_arrays is None:
            m, v = self._stem_keys, self._stem_view
            self._stem_arrays = (
                _from_le("I", v[: 4 * m]),
                _from_le("I", v[4 * m : 8 * m + 4]),
                _from_le("I", v[8 * m + 4 :]),
            )
        return self._stem_arrays

    def word(self, w: int) -> bytes:
        """Word ``w`` (folded, UTF-8)."""
        end = self.at[w + 1] if w + 1 < len(self.at) else len(self.joined)
        return self.joined[self.at[w] + 1 : end]

    def mates(self, code: str, stem: bytes, own: bool = True) -> list[int]:
        """The words that have ``stem`` (folded, UTF-8) as their stem of
        language ``code``: the word ``stem`` itself when its flag says so
        (not looked up when not ``own``), and those listed under the key of
        the stem."""
        out = []
        w = _exact(self.joined, self.at, stem) if own else -1
        if w >= 0 and self.flags[w] & OWN[code]:
            out.append(w)
        if not self._stem_keys:
            return out
        stem_at, stem_starts, refs = self.stem_arrays()
        e = _exact(self.stem_joined, stem_at, code.encode() + stem)
        if e >= 0:
            out.extend(refs[stem_starts[e] : stem_starts[e + 1]])
        return out

    def add_postings(self, w: int, bitmaps: list[int], lists: list[Ints]) -> None:
        """Append word ``w``'s postings, as :meth:`gather` appends a run's."""
        a, b = self.starts[w], self.starts[w + 1]
        if b - a == self.units:
            bitmaps.append(int.from_bytes(self.raw[2 * a : 2 * b], "little"))
        elif b > a:
            lists.append(self.postings[a:b])

    def run(self, word: bytes) -> tuple[int, int]:
        """The words ``[lo, hi)`` that ``word`` (folded, UTF-8) is a prefix of."""
        key = b"\n" + word
        first = self.joined.find(key)
        if first < 0:
            return 0, 0
        last = self.joined.rfind(key)
        lo = bisect_left(self.at, first)
        hi = bisect_left(self.at, last) + 1
        if lo >= len(self.at) or self.at[lo] != first or self.at[hi - 1] != last:
            raise BadPiece("inconsistent word piece")
        return lo, hi

    def gather(self, word: bytes, bitmaps: list[int], lists: list[Ints]) -> None:
        """Append the postings of the words ``word`` prefixes: each common
        word's bitmap to ``bitmaps``, the rare words' lists to ``lists`` as
        a few slices (the rare words between two common ones are one slice
        of the postings). The common words of the run are found by C-level
        maps over its starts, never a Python step per word: a one-character
        prefix runs over thousands of words of one memory each."""
        lo, hi = self.run(word)
        if lo == hi:
            return
        units, starts = self.units, self.starts
        st = starts[lo : hi + 1]
        common = itertools.compress(range(lo, hi), map(units.__eq__, map(operator.sub, st[1:], st[:-1])))
        at = starts[lo]
        for w in common:
            a, b = starts[w], starts[w + 1]
            if a > at:
                lists.append(self.postings[at:a])
            bitmaps.append(int.from_bytes(self.raw[2 * a : 2 * b], "little"))
            at = b
        if starts[hi] > at:
            lists.append(self.postings[at : starts[hi]])

    def char_layers(self, word: bytes) -> list[int]:
        """In a piece's last segment (:func:`split`), the layers of query word
        ``word`` of one character: bitmap ``t - 1`` holds the memories
        holding at least ``t`` words it prefixes."""
        lo, hi = self.run(word)
        units, raw = self.units, self.raw
        return [
            int.from_bytes(raw[2 * a : 2 * (a + units)], "little")
            for w in range(lo, hi)
            for a in range(self.starts[w], self.starts[w + 1], units)
        ]

    def bits(self, word: bytes) -> tuple[int, int]:
        """``(bitmap, held)``: bit ``k`` set when memory ``k`` holds a word
        ``word`` prefixes, and how many (memory, such word) pairs there are
        (above the bitmap's count when a memory holds two of them)."""
        lo, hi = self.run(word)
        units, starts, raw = self.units, self.starts, self.raw
        out = held = 0
        listed = bytearray()
        for w in range(lo, hi):
            a, b = starts[w], starts[w + 1]
            if b - a == units:
                got = int.from_bytes(raw[2 * a : 2 * b], "little")
                out |= got
                held += got.bit_count()
            elif b > a:
                if not listed:
                    listed = bytearray(2 * units)
                for k in self.postings[a:b]:
                    listed[k >> 3] |= 1 << (k & 7)
                held += b - a
        return (out | int.from_bytes(listed, "little")) if listed else out, held

    def layers(self, word: bytes) -> list[int]:
        """:func:`~stash.core.words_top.layers` of how many words ``word``
        prefixes each memory holds: bitmap ``t - 1`` holds the memories
        holding at least ``t``. A common word's bitmap is added as it is
        (a few integer operations); the rare words' lists are counted one
        byte a memory."""
        lo, hi = self.run(word)
        units, starts, raw = self.units, self.starts, self.raw
        out: list[int] = []
        listed = bytearray()
        for w in range(lo, hi):
            a, b = starts[w], starts[w + 1]
            if b - a == units:
                out = merge(out, [int.from_bytes(raw[2 * a : 2 * b], "little")])
            elif b > a:
                if not listed:
                    listed = bytearray(16 * units)
                for k in self.postings[a:b]:
                    listed[k] += 1
        return merge(out, layers(bytes(listed))) if listed else out

    def positions(self, word: bytes) -> list[int]:
        """The memories holding a word ``word`` prefixes, a memory once per
        such word, word by word (each word's sorted)."""
        lo, hi = self.run(word)
        out: list[int] = []
        for w in range(lo, hi):
            a, b = self.starts[w], self.starts[w + 1]
            if b - a == self.units:
                out.extend(ones(int.from_bytes(self.raw[2 * a : 2 * b], "little")))
            else:
                out.extend(self.postings[a:b])
        return out


def tally(memories: int, bitmaps: Sequence[int], lists: Sequence[Ints]) -> tuple[int, int, list[int]]:
    """``(bitmap, held, layers)`` of postings gathered by
    :meth:`PieceIndex.gather` over a piece of ``memories``: the memories
    holding one of the words, the (memory, word) pairs, and the
    :func:`~stash.core.words_top.layers` of each memory's count of such
    words. The lists are counted in C (``Counter``, then one byte a memory
    read from it by ``map``); when they name fewer than a sixteenth of the
    memories (a rare word: reading every memory's byte would cost more),
    or a count is above 255 (only a memory of 256 words or more), the
    layers are made from the counts instead."""
    held = sum(map(len, lists)) + sum(b.bit_count() for b in bitmaps)
    out: list[int] = []
    if lists:
        counts = Counter(itertools.chain.from_iterable(lists))
        most = max(counts.values())
        if most > 255 or 16 * len(counts) < memories:  # few memories, or one of 256 words: from the counts
            out = [sum(1 << k for k, c in counts.items() if c >= t) for t in range(1, most + 1)]
        else:
            out = layers(bytes(map(counts.get, range(memories), itertools.repeat(0, memories))))
    bits = out[0] if out else 0
    for b in bitmaps:
        bits |= b
    if held == bits.bit_count():
        return bits, held, [bits] if bits else []
    for b in bitmaps:
        out = merge(out, [b])
    return bits, held, out
