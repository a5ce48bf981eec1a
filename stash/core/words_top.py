"""The best matches of a words search, counted in bytes, not one by one
(docs/DESIGN.md, "Word search"). Nothing here reads a file.

When a query holds at most 8 words and none of them prefixes two words of
one memory, a memory's score depends only on which query words it holds
(its *mask*, bit ``j`` for query word ``j``) and on its length
(:func:`stash.core.words.score`). A piece of memories is then two byte
strings of one byte per memory: its masks (:func:`masks`, made from each
query word's bitmap) and its lengths (each below 256). :func:`top` visits
the masks best first, by what a memory holding exactly those words could
score at most (its score at length 0: a score only falls as the length
grows, since BM25's length norm grows with it). For each mask it takes,
piece by piece, the lengths of the memories holding exactly that mask (one
``bytes.translate`` and one integer AND), counts them by length, and stops
as soon as the page's ``n`` matches are among the masks seen: what is left
can score no higher. Only the page's ids are ever listed, found by
``bytes.find``; the hundreds of thousands of other matches are counted,
never listed.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

MAX_WORDS = 8
"""The most query words :func:`top` ranks (its masks: 255 at most)."""

_FF = [bytes(0xFF if v >> bit & 1 else 0 for v in range(256)) for bit in range(8)]
"""``_FF[bit]`` maps a bitmap byte to 0xFF when its bit ``bit`` is set, else 0."""


def spread(bits: int, size: int) -> bytes:
    """One byte per memory ``k < size``: 0xFF when bit ``k`` of ``bits`` is set, else 0."""
    nbytes = (size + 7) // 8
    data = bits.to_bytes(nbytes, "little")
    out = bytearray(8 * nbytes)
    for bit in range(8):
        out[bit::8] = data.translate(_FF[bit])
    return bytes(out[:size])


Piece = tuple[int, Sequence[int], bytes]
"""A piece's first memory id, each query word's bitmap over its memories
(bit ``k``: memory ``first + k`` holds the word), and its memories' lengths,
one byte each."""


def top(pieces: Sequence[Piece], k: int, score: Callable[[int, int], int], after: tuple[int, int] | None,
        n: int, check: Callable[[], None] = lambda: None) -> list[tuple[int, int]]:
    """The best ``n`` ``(score, id)`` strictly after ``after`` in the order
    (score descending, id descending), best first, of the memories of
    ``pieces`` (newest first, not overlapping) that hold a query word;
    ``score(mask, length)`` their score, never rising with the length.
    ``check`` is called between steps (a deadline)."""
    if k > MAX_WORDS:
        raise ValueError("at most 8 words are ranked by mask")
    lengths = [int.from_bytes(ln, "little") for _, _, ln in pieces]
    heap = [(-score(m, 0), m) for m in range(1, 1 << k)]
    heapq.heapify(heap)
    of_mask: dict[int, list[tuple[int, bytes]]] = {}  # a mask's pieces: (first id, its memories' lengths or 0)
    found: dict[tuple[int, int], tuple[int, int]] = {}  # (mask, length): (score, how many lie after `after`)
    while heap:
        reach = -heap[0][0]
        if sum(c for s, c in found.values() if s > reach) >= n:
            break  # the masks not seen score at most reach: n seen matches beat them
        _, m = heapq.heappop(heap)
        check()
        held = []
        for (base, bits, ln), ln_int in zip(pieces, lengths):
            inside, outside = -1, 0
            for j, b in enumerate(bits):
                if m >> j & 1:
                    inside &= b
                else:
                    outside |= b
            exact = inside & ~outside
            if exact:
                held.append((base, (ln_int & int.from_bytes(spread(exact, len(ln)), "little")).to_bytes(
                    len(ln), "little")))
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


def _page(found: dict[tuple[int, int], tuple[int, int]], of_mask: dict[int, list[tuple[int, bytes]]],
          after: tuple[int, int] | None, n: int, check: Callable[[], None]) -> list[tuple[int, int]]:
    """The best ``n`` after ``after`` of the counted ``found``: every
    (mask, length) of the scores that fit whole, read in one pass over each
    mask's pieces; then the newest of the score that fits in part."""
    by_score: dict[int, list[tuple[int, int]]] = {}
    for key, (s, count) in found.items():
        if count and s:
            by_score.setdefault(s, []).append(key)
    whole: dict[int, set[int]] = {}  # mask: its lengths whose every match is on the page
    parts: list[tuple[int, list[tuple[int, int]], int, int | None]] = []  # (score, keys, how many, below which id)
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
    return sum(e.count(one) if base + len(e) <= limit else e.count(one, 0, limit - base) if base < limit else 0
               for base, e in held)


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
