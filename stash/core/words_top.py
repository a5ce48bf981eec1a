"""The best matches of a words search, counted in bytes, not one by one
(docs/DESIGN.md, "Word search"). Nothing here reads a file.

A memory's score depends only on its term frequencies (for each query word,
how many of its words the query word prefixes) and its length
(:func:`stash.core.words.score`). So a piece of memories is given as, per
query word, its *layers* (bitmap ``t - 1``: the memories where the word's
frequency is at least ``t``; one layer when no memory holds two words it
prefixes) and its lengths, one byte a memory. :func:`top` visits the
*classes* (vectors of frequencies) best first, by what a memory of the
class could score at most (its score at length 0: a score only falls as the
length grows, since BM25's length norm grows with it). For each class it
takes, piece by piece, the lengths of the memories of exactly that class
(integer ANDs, :func:`spread` and one more AND), counts them by length,
and stops as soon as the page's ``n`` matches are among the classes seen:
what is left can score no higher. Only the page's ids are ever listed, found
by ``bytes.find``; the hundreds of thousands of other matches are counted,
never listed.
"""

from __future__ import annotations

import heapq
import itertools
import math
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

MAX_WORDS = 16
"""The most query words :func:`top` ranks (a query holds at most 16)."""
MAX_CLASSES = 1023
"""The most classes :func:`top` visits (10 words each held or not); a query
with more (more words, or words each prefixing several words of a memory)
is scored by the caller one memory at a time."""

_FF = [bytes(0xFF if v >> bit & 1 else 0 for v in range(256)) for bit in range(8)]
"""``_FF[bit]`` maps a bitmap byte to 0xFF when its bit ``bit`` is set, else 0."""


_ONE = [bytes(v >> bit & 1 for v in range(256)) for bit in range(8)]
_BIT = [bytes(1 << bit if v == 0xFF else 0 for v in range(256)) for bit in range(8)]


def spread(bits: int, size: int, value: int = 0xFF) -> bytes:
    """One byte per memory ``k < size``: ``value`` (0xFF or 1) when bit
    ``k`` of ``bits`` is set, else 0."""
    nbytes = (size + 7) // 8
    data = bits.to_bytes(nbytes, "little")
    out = bytearray(8 * nbytes)
    tables = _FF if value == 0xFF else _ONE
    for bit in range(8):
        out[bit::8] = data.translate(tables[bit])
    return bytes(out[:size])


def ones(bits: int) -> list[int]:
    """The set bits of ``bits``, lowest first (one byte a bit, then picked
    by ``itertools.compress``, or for a sparse bitmap found by ``bytes.find``:
    no Python step per bit that is not set)."""
    size = bits.bit_length()
    flags = spread(bits, size)
    if bits.bit_count() * 64 > size:
        return list(itertools.compress(range(size), flags))
    out = []  # few: found by memchr, not by a step over every byte
    at = flags.find(0xFF)
    while at >= 0:
        out.append(at)
        at = flags.find(0xFF, at + 1)
    return out


@lru_cache(maxsize=256)
def _at_least(t: int) -> bytes:
    """A translate table: bytes of ``t`` or more to 0xFF, the others to 0."""
    return bytes(0xFF if v >= t else 0 for v in range(256))


def layers(counts: bytes) -> list[int]:
    """The layers of a word's frequencies given one byte a memory: bitmap
    ``t - 1`` holds the memories whose count is at least ``t``."""
    out = []
    pad = counts + bytes(-len(counts) % 8)
    for t in range(1, 256):
        ge = pad.translate(_at_least(t))
        if ge.find(0xFF) < 0:
            break
        bits = 0
        for bit in range(8):
            bits |= int.from_bytes(ge[bit::8].translate(_BIT[bit]), "little")
        out.append(bits)
    return out


def merge(x: Sequence[int], y: Sequence[int]) -> list[int]:
    """The layers of the sum of two words' frequencies, given theirs: a
    memory's sum is at least ``t`` when one is at least ``i`` and the other
    at least ``t - i``, for some ``i``."""
    out = []
    for t in range(1, len(x) + len(y) + 1):
        acc = 0
        for i in range(t + 1):
            a = -1 if i == 0 else x[i - 1] if i <= len(x) else 0
            b = -1 if i == t else y[t - i - 1] if t - i <= len(y) else 0
            acc |= a & b
        if not acc:
            break
        out.append(acc)
    return out


Piece = tuple[int, Sequence[Sequence[int]], bytes]
"""A piece's first memory id, each query word's layers over its memories
(bit ``k`` of layer ``t - 1``: memory ``first + k`` holds at least ``t``
words the query word prefixes), and its memories' lengths, one byte each."""


Class = tuple[int, ...]
"""A vector of term frequencies, one per query word."""


FEW_CLASSES = 15
"""Up to this many classes (4 words each held or not) :func:`stash.core.words_best.best` visits
them one by one (:func:`top`: a few integer operations per class and
piece); above, it counts every memory's class at once (:func:`top_coded`:
a constant per memory, whatever the classes)."""


def top(
    pieces: Sequence[Piece],
    k: int,
    score: Callable[[Class, int], int],
    after: tuple[int, int] | None,
    n: int,
    check: Callable[[], None] = lambda: None,
) -> list[tuple[int, int]] | None:
    """The best ``n`` ``(score, id)`` strictly after ``after`` in the order
    (score descending, id descending), best first, of the memories of
    ``pieces`` (newest first, not overlapping) that hold a query word;
    ``score(frequencies, length)`` their score, never rising with the
    length. ``check`` is called between steps (a deadline). None when the
    query has more than :data:`MAX_WORDS` words or :data:`MAX_CLASSES` classes."""
    tops = [max((len(w[j]) for _, w, _ in pieces), default=0) for j in range(k)]
    if k > MAX_WORDS or math.prod(t + 1 for t in tops) - 1 > MAX_CLASSES:
        return None
    lengths = [int.from_bytes(ln, "little") for _, _, ln in pieces]
    heap = [(-score(c, 0), c) for c in itertools.product(*(range(t + 1) for t in tops)) if any(c)]
    heapq.heapify(heap)
    of_mask: dict[Class, list[tuple[int, bytes]]] = {}  # a class's pieces: (first id, its memories' lengths or 0)
    found: dict[tuple[Class, int], tuple[int, int]] = {}  # (class, length): (score, how many lie after `after`)
    while heap:
        reach = -heap[0][0]
        if sum(c for s, c in found.values() if s > reach) >= n:
            break  # the classes not seen score at most reach: n seen matches beat them
        _, m = heapq.heappop(heap)
        check()
        held = []
        for (base, word_layers, ln), ln_int in zip(pieces, lengths):
            exact = -1  # all memories, narrowed word by word
            for t, lay in zip(m, word_layers):
                if t > len(lay):
                    exact = 0
                    break
                if t:
                    exact &= lay[t - 1]
                if t < len(lay):
                    exact &= ~lay[t]
            if exact > 0:
                held.append(
                    (base, (ln_int & int.from_bytes(spread(exact, len(ln)), "little")).to_bytes(len(ln), "little"))
                )
        if not held:
            continue
        of_mask[m] = held
        members = b"".join([e.translate(None, b"\0") for _, e in held])
        for length in set(members):
            s = score(m, length)
            count = members.count(bytes([length]))
            if after is not None and s >= after[0]:
                count = 0 if s > after[0] else _below(held, length, after[1])
            found[m, length] = (s, count)
    return _page(found, of_mask, after, n, check)


def _page(
    found: dict[tuple[Class, int], tuple[int, int]],
    of_mask: dict[Class, list[tuple[int, bytes]]],
    after: tuple[int, int] | None,
    n: int,
    check: Callable[[], None],
) -> list[tuple[int, int]]:
    """The best ``n`` after ``after`` of the counted ``found``: every
    (mask, length) of the scores that fit whole, read in one pass over each
    mask's pieces; then the newest of the score that fits in part."""
    whole, parts = _plan(found, after, n)
    out: list[tuple[int, int]] = []
    for m, lns in whole.items():
        check()
        table = bytes(0xFF if v in lns else 0 for v in range(256))
        for base, e in of_mask[m]:
            hits = e.translate(table)
            at = hits.find(0xFF)
            while at >= 0:
                out.append((found[m, e[at]][0], base + at))
                at = hits.find(0xFF, at + 1)
    for s, keys, need, limit in parts:
        out.extend((s, i) for i in _newest([(of_mask[m], ln) for m, ln in keys], need, limit))
    out.sort(reverse=True)
    return out[:n]


def _below(held: list[tuple[int, bytes]], length: int, limit: int) -> int:
    """How many memories of ``length`` in ``held`` have an id below ``limit``."""
    one = bytes([length])
    return sum(
        e.count(one) if base + len(e) <= limit else e.count(one, 0, limit - base) if base < limit else 0
        for base, e in held
    )


def _newest(entries: list[tuple[list[tuple[int, bytes]], int]], need: int, limit: int | None) -> list[int]:
    """The ``need`` highest ids (below ``limit``) of the memories of the
    given lengths in the given pieces, highest first."""
    by_base: dict[int, list[tuple[bytes, int]]] = {}
    for held, length in entries:
        for base, e in held:
            by_base.setdefault(base, []).append((e, length))
    out: list[int] = []
    for base in sorted(by_base, reverse=True):
        if limit is not None and base >= limit:
            continue
        got: list[int] = []
        for e, length in by_base[base]:
            one = bytes([length])
            end = len(e) if limit is None else min(len(e), limit - base)
            for _ in range(need - len(out)):  # this length's newest, as many as may still be needed
                end = e.rfind(one, 0, end)
                if end < 0:
                    break
                got.append(base + end)
        out.extend(sorted(got, reverse=True)[: need - len(out)])
        if len(out) >= need:
            break
    return out


MAX_CODES = 1 << 16
"""The most classes (frequency vectors, the empty one included) that
:func:`top_coded` numbers: a class is one 16-bit code a memory."""


def _lanes(bits: int, size: int) -> int:
    """An integer of one 16-bit lane per memory ``k < size``: 1 where bit
    ``k`` of ``bits`` is set, else 0."""
    buf = bytearray(2 * size)
    buf[0::2] = spread(bits, size, 1)
    return int.from_bytes(buf, "little")


def top_coded(
    pieces: Sequence[Piece],
    k: int,
    score: Callable[[Class, int], int],
    after: tuple[int, int] | None,
    n: int,
    check: Callable[[], None] = lambda: None,
) -> list[tuple[int, int]] | None:
    """:func:`top`, for queries of many classes: the same answer, computed
    once per memory rather than once per class and piece. Each memory's
    class is numbered in mixed radix (word ``j``'s frequency times the
    product of the earlier words' ``top + 1``) by adding its words' layers
    as 16-bit lanes of one integer per piece (no carry crosses a lane, the
    code being below 65,536); beside its length it makes a 4-byte key,
    and one ``Counter`` over all pieces' keys counts every (class, length)
    in C. Then (class, length) are visited best first, each class by its
    shortest length not yet visited (a score only falls as the length
    grows), so only those that may reach the page are scored, and only the
    page's ids are listed, by one C-level pass over the keys. The work is
    a few integer operations per word and piece plus a constant per
    memory, whatever the number of classes. None when the classes number
    more than :data:`MAX_CODES` or a query more than :data:`MAX_WORDS`
    words."""
    tops = [max((len(w[j]) for _, w, _ in pieces), default=0) for j in range(k)]
    radix = [math.prod(t + 1 for t in tops[:j]) for j in range(k)]
    if k > MAX_WORDS or math.prod(t + 1 for t in tops) > MAX_CODES:
        return None
    keyed: list[tuple[int, bytes]] = []  # (first id, one 4-byte key a memory: code, length, 0)
    for base, word_layers, ln in pieces:
        check()
        size = len(ln)
        code = 0
        for r, lay in zip(radix, word_layers):
            for bits in lay:
                code += _lanes(bits, size) * r
        raw = code.to_bytes(2 * size, "little")
        packed = bytearray(4 * size)  # read back as native uint32: code | length << 16
        lo, hi, at = (0, 1, 2) if sys.byteorder == "little" else (3, 2, 1)
        packed[lo::4] = raw[0::2]
        packed[hi::4] = raw[1::2]
        packed[at::4] = ln
        keyed.append((base, bytes(packed)))
    counts = Counter(memoryview(b"".join(key for _, key in keyed)).cast("I"))
    below: Counter[int] = Counter()
    if after is not None:  # the ids under the cursor's, for the keys of the cursor's score
        limit = after[1]
        below = Counter(
            memoryview(b"".join(key[: 4 * max(0, min(len(key) // 4, limit - base))] for base, key in keyed)).cast("I")
        )
    by_class: dict[int, list[tuple[int, int]]] = {}  # code: (length, how many)
    for key4, c in counts.items():
        if key4 & 0xFFFF:
            by_class.setdefault(key4 & 0xFFFF, []).append((key4 >> 16, c))

    classes = {code: tuple(code // r % (t + 1) for r, t in zip(radix, tops)) for code in by_class}
    # One entry a class: its next (class, length) to count, shortest first, so it is the best left of the class.
    heap: list[tuple[int, int, int]] = []
    for code, lns in by_class.items():
        lns.sort()
        heap.append((-score(classes[code], lns[0][0]), code, 0))
    heapq.heapify(heap)
    found: dict[tuple[int, int], tuple[int, int]] = {}  # (code, length): (score, how many lie after `after`)
    pending: list[tuple[int, int]] = []  # (-score, how many) of found not yet known to beat what is left
    ahead = 0
    while heap:
        reach = -heap[0][0]
        while pending and -pending[0][0] > reach:
            ahead += heapq.heappop(pending)[1]
        if ahead >= n:
            break
        neg, code, at = heapq.heappop(heap)
        length, c = by_class[code][at]
        if after is not None and -neg >= after[0]:
            c = 0 if -neg > after[0] else below[code | length << 16]
        found[code, length] = (-neg, c)
        heapq.heappush(pending, (neg, c))
        if at + 1 < len(by_class[code]):
            heapq.heappush(heap, (-score(classes[code], by_class[code][at + 1][0]), code, at + 1))
    whole, parts = _plan(found, after, n)
    wanted = {code | length << 16: found[code, length][0] for code, lns in whole.items() for length in lns}
    partial = {code | length << 16: s for s, keys, _, _ in parts for code, length in keys}
    out: list[tuple[int, int]] = []
    got: list[tuple[int, int]] = []
    if wanted or partial:
        either = wanted.keys() | partial.keys()
        for base, key in keyed:
            check()
            mv = memoryview(key).cast("I")
            for off in itertools.compress(range(len(mv)), map(either.__contains__, mv)):
                key4 = mv[off]
                if key4 in wanted:
                    out.append((wanted[key4], base + off))
                else:
                    got.append((partial[key4], base + off))
    for s, _, need, limit in parts:
        ids = sorted((i for t, i in got if t == s and (limit is None or i < limit)), reverse=True)
        out.extend((s, i) for i in ids[:need])
    out.sort(reverse=True)
    return out[:n]


def _plan(found: Mapping[Any, tuple[int, int]], after: tuple[int, int] | None, n: int) -> Any:
    """Which counted (class, length) fill the page after ``after``: those
    of the scores that fit whole (class: its lengths), then for the score
    that fits in part ``(score, its keys, how many, below which id)``."""
    by_score: dict[int, list[Any]] = {}
    for key, (s, count) in found.items():
        if count and s:
            by_score.setdefault(s, []).append(key)
    whole: dict[Any, set[int]] = {}
    parts: list[tuple[int, list[Any], int, int | None]] = []
    taken = 0
    for s in sorted(by_score, reverse=True):
        if taken >= n:
            break
        count = sum(found[key][1] for key in by_score[s])
        limit = after[1] if after is not None and s == after[0] else None
        if taken + count > n or limit is not None:
            parts.append((s, by_score[s], min(count, n - taken), limit))
            taken += min(count, n - taken)
            continue
        for m, ln in by_score[s]:
            whole.setdefault(m, set()).add(ln)
        taken += count
    return whole, parts
