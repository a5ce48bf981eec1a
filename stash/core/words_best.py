"""Which ranking a words search's page takes, and the one that scores only
the memories that can reach the page (docs/DESIGN.md, "Word search").
Nothing here reads a file; the pieces are :data:`stash.core.words_top.Piece`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from functools import lru_cache

from .words_top import _BIT, FEW_CLASSES, MAX_WORDS, Class, Piece, ones, top, top_coded

Reach = Callable[[int, int, Sequence[int]], int]
"""``reach(held, length, tops)``: the most a memory can score that holds at
most ``held`` of the query words (``held`` below their number), word ``j``
at most ``tops[j]`` times, and has at least ``length`` words."""


def best(
    pieces: Sequence[Piece],
    k: int,
    score: Callable[[Class, int], int],
    after: tuple[int, int] | None,
    n: int,
    check: Callable[[], None] = lambda: None,
    reach: Reach | None = None,
) -> list[tuple[int, int]] | None:
    """:func:`top`, :func:`top_pruned` or :func:`top_coded`, whichever is
    cheaper for the query's number of classes (the same answer); None when
    none ranks it. :func:`top_pruned` is tried first above
    :data:`FEW_CLASSES` when ``reach`` is given."""
    tops = [max((len(w[j]) for _, w, _ in pieces), default=0) for j in range(k)]
    if math.prod(t + 1 for t in tops) - 1 <= FEW_CLASSES:
        return top(pieces, k, score, after, n, check)
    got = None if reach is None else top_pruned(pieces, k, score, reach, after, n, check)
    return got if got is not None else top_coded(pieces, k, score, after, n, check)


PRUNED_MOST = 1 << 15
"""The most memories :func:`top_pruned` scores one by one; a query whose
page needs more is left to :func:`top_coded`, which counts them all."""


def _count_planes(word_layers: Sequence[Sequence[int]]) -> list[int]:
    """How many of the query words each memory holds, bit-sliced: bit ``k``
    of plane ``b`` is bit ``b`` of memory ``k``'s count (a ripple-carry
    addition of the words' first layers, a few integer operations a word)."""
    planes: list[int] = []
    for lay in word_layers:
        carry = lay[0] if lay else 0
        b = 0
        while carry:
            if b == len(planes):
                planes.append(carry)
                break
            planes[b], carry = planes[b] ^ carry, planes[b] & carry
            b += 1
    return planes


def _holding(planes: Sequence[int], c: int, full: int) -> int:
    """The bitmap of the memories whose count in ``planes`` is at least
    ``c`` (``full``: every memory of the piece), compared from the top bit."""
    if c <= 0:
        return full
    if c >> len(planes):
        return 0
    above, equal = 0, full
    for b in range(len(planes) - 1, -1, -1):
        if c >> b & 1:
            equal &= planes[b]
        else:
            above |= equal & planes[b]
            equal &= ~planes[b]
    return above | equal


@lru_cache(maxsize=256)
def _below_table(length: int) -> bytes:
    """A translate table: bytes below ``length`` to 0xFF, the others to 0."""
    return bytes(0xFF if v < length else 0 for v in range(256))


def _shorter(ln: bytes, length: int) -> int:
    """The bitmap of the memories of ``ln`` (one byte a memory) shorter than ``length``."""
    pad = ln + bytes(-len(ln) % 8)
    below = pad.translate(_below_table(length))
    bits = 0
    for bit in range(8):
        bits |= int.from_bytes(below[bit::8].translate(_BIT[bit]), "little")
    return bits


def top_pruned(
    pieces: Sequence[Piece],
    k: int,
    score: Callable[[Class, int], int],
    reach: Reach,
    after: tuple[int, int] | None,
    n: int,
    check: Callable[[], None] = lambda: None,
) -> list[tuple[int, int]] | None:
    """:func:`top`, scoring only the memories that may reach the page: the
    same answer, or None when that would mean scoring more than
    :data:`PRUNED_MOST` of them (or the query has more than
    :data:`MAX_WORDS` words).

    Each memory's count of query words held is added up bit-sliced
    (:func:`_count_planes`), so the memories holding at least ``h`` words
    are one comparison a piece (:func:`_holding`). First every memory
    holding at least ``c`` words is scored, ``c`` the most words that ``n``
    memories after ``after`` hold. Then, ``h`` falling from ``c - 1``, the
    memories holding exactly ``h`` words that are shorter than the first
    length at which ``reach(h, length)`` falls below the ``n``-th best score
    so far: a longer one, or one holding fewer words, cannot score that
    much, and that score only rises as more memories are scored, so none
    of the memories left out can reach the page. The work is a few integer
    operations a word and piece plus a constant a memory scored, and the
    memories scored are the few holding many of the words or few words in
    few others."""
    if k > MAX_WORDS:
        return None
    tops = [max((len(w[j]) for _, w, _ in pieces), default=0) for j in range(k)]
    prepared = []
    shortest = 255
    at_least = [0] * (k + 2)  # at_least[c]: the memories holding c words or more
    for base, word_layers, ln in pieces:
        check()
        planes = _count_planes(word_layers)
        full = (1 << len(ln)) - 1
        prepared.append((base, word_layers, ln, planes, full))
        shortest = next((v for v in range(1, shortest) if bytes((v,)) in ln), shortest)  # a memchr a length
        for c in range(k, 0, -1):
            got = _holding(planes, c, full).bit_count()
            if got:
                at_least[c] += got
                break
        else:
            continue
        for h in range(c - 1, 0, -1):
            at_least[h] += _holding(planes, h, full).bit_count()
    c = max((c for c in range(1, k + 1) if at_least[c] >= n), default=1)
    if at_least[c] > PRUNED_MOST:
        return None
    scored: list[tuple[int, int]] = []
    pool: list[tuple[int, int]] = []  # the scored after `after`
    scores: dict[tuple[Class, int], int] = {}
    seen = [0] * len(prepared)  # each piece's memories holding more words than the level at hand
    for h in range(c, 0, -1):
        check()
        limit = 256  # the level's memories scored: those shorter than this
        if h < c:
            if len(pool) < n:
                nth = 0
            else:
                nth = heapq.nlargest(n, pool)[-1][0]
            limit = next((ln for ln in range(shortest, 256) if reach(h, ln, tops) < nth), 256)
            if limit <= shortest:
                break  # no memory holding h words or fewer can reach the page
        for x, (base, word_layers, ln, planes, full) in enumerate(prepared):
            ge = _holding(planes, h, full)
            new = ge & ~seen[x]
            seen[x] = ge
            if limit < 256:
                new &= _shorter(ln, limit)
            if not new:
                continue
            tfs: dict[int, Class] = dict.fromkeys(ones(new), ())
            for lay in word_layers:
                for off in tfs:
                    t = 0
                    for bits in lay:
                        if not bits >> off & 1:
                            break
                        t += 1
                    tfs[off] += (t,)
            for off, tf in tfs.items():
                key = (tf, ln[off])
                s = scores.get(key)
                if s is None:
                    s = scores[key] = score(tf, ln[off])
                hit = (s, base + off)
                scored.append(hit)
                if after is None or hit < after:
                    pool.append(hit)
            if len(scored) > PRUNED_MOST:
                return None
    return heapq.nlargest(n, pool)
