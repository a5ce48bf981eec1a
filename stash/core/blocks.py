"""Block arithmetic of the OptMem model: pure functions, no I/O.

A block is an aligned power-of-two range ``[lo, hi)`` of memory positions with
``hi - lo >= 2``; a single memory is the degenerate range ``(i, i + 1)``. Ids are
written inclusive at both ends (``"4-7"``) because that is how an agent copies
them out of a wake or a nap prompt.

These functions are the contract of docs/DESIGN.md, "Blocks and the tree" and "The
cover", and must agree with OptMem
for every input: an agent moving between the two wakes to the same document.
"""

from __future__ import annotations

import functools
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator

Block = tuple[int, int]

RAW_MAX = 16
"""Blocks of at most this many memories are compressed from the raw log; larger
ones from their two halves' summaries (docs/DESIGN.md, "Nap")."""

BISECTION_STEPS = 60

_BLOCK_ID = re.compile(r"([0-9]{1,19})-([0-9]{1,19})")  # 19 digits: any int64; the echo stays under 40 chars


class BlockIdError(ValueError):
    """A block id that is malformed or not an aligned power-of-two block."""


def is_block(lo: int, hi: int) -> bool:
    """True for an aligned power-of-two range of at least two memories."""
    size = hi - lo
    return lo >= 0 and size >= 2 and size & (size - 1) == 0 and lo % size == 0


def parse_block(text: str) -> Block:
    """``"lo-hi"`` (inclusive) to ``(lo, hi)`` (exclusive), refusing anything
    that is not a real block: without the shape check ``4-5`` and ``5-6`` would
    name the same summary."""
    m = _BLOCK_ID.fullmatch(text)
    if not m:
        raise BlockIdError(f"'{text[:40]}' is not a block id (two numbers, low-high).")
    lo, last = int(m.group(1)), int(m.group(2))
    if last < lo:
        raise BlockIdError(f"{lo}-{last} runs backwards; a block id is written low-high.")
    if not is_block(lo, last + 1):
        raise BlockIdError(f"{lo}-{last} is not an aligned power-of-two block.")
    return lo, last + 1


def block_id(lo: int, hi: int) -> str:
    """The inclusive written form of ``[lo, hi)``."""
    return f"{lo}-{hi - 1}"


def _kept_runs(T: int, alpha: float) -> list[tuple[int, int, int]]:
    """``tile(T, alpha)`` level by level, as ``(size, first lo, end lo)`` runs.

    The split test ``hi > T or size > alpha * (T - lo)`` only turns from false
    to true as ``lo`` grows (the float product is monotone in ``T - lo``), and
    the children of a level's split blocks are one contiguous run of the next
    level. So each level keeps a prefix of the run it is given and hands the
    rest down: a binary search per level finds the boundary, with the very same
    float expression the definition uses, and no block is visited one by one.
    """
    size = 1
    while size < T:
        size *= 2
    start = 0
    runs = []
    while True:
        n = -(-(T - start) // size)  # blocks of this level that start below T
        if size == 1:
            runs.append((1, start, start + n))
            return runs
        lo_k, hi_k = 0, n
        while lo_k < hi_k:
            k = (lo_k + hi_k) // 2
            lo = start + k * size
            if lo + size > T or size > alpha * (T - lo):
                hi_k = k
            else:
                lo_k = k + 1
        split = start + lo_k * size
        runs.append((size, start, split))
        if lo_k == n:
            return runs
        start = split
        size //= 2


def tile(T: int, alpha: float) -> list[Block]:
    """Step 2 of the cover (docs/DESIGN.md, "The cover"): tile ``[0, T)`` keeping a block whole iff it ends by
    ``T`` and its size is at most ``alpha`` times its age; oldest first."""
    if T <= 0:
        return []
    return [(lo, lo + size) for size, first, end in _kept_runs(T, alpha) for lo in range(first, end, size)]


def tile_count(T: int, alpha: float) -> int:
    """``len(tile(T, alpha))`` in O(log² T)."""
    if T <= 0:
        return 0
    return sum((end - first) // size for size, first, end in _kept_runs(T, alpha))


def cover(T: int, budget: int) -> list[Block]:
    """The blocks a wake shows, oldest first: at most ``budget`` of them,
    spanning ``[0, T)`` without gap or overlap, coarse in the past and fine near
    the present (docs/DESIGN.md, "The cover"). Every block in it is complete (``hi <= T``)."""
    return list(_cover(T, budget))


@functools.lru_cache(maxsize=256)
def _cover(T: int, budget: int) -> tuple[Block, ...]:
    """:func:`cover`, remembered: a pure function of two integers that every
    wake and zoom of a log of that length asks again (about 60 tilings each).
    At most 256 covers of at most 1,000 blocks (/shape's cap) are kept."""
    if T <= 0:
        return ()
    if T <= budget:
        return tuple((i, i + 1) for i in range(T))
    lo, hi = 0.0, 1.0
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        if tile_count(T, mid) > budget:
            lo = mid
        else:
            hi = mid
    out = tile(T, hi)
    while len(out) < budget:
        newest = next((k for k in range(len(out) - 1, -1, -1) if out[k][1] - out[k][0] > 1), None)
        if newest is None:
            break
        a, b = out[newest]
        m = (a + b) // 2
        out[newest : newest + 1] = [(a, m), (m, b)]
    return tuple(out)


def levels(T: int) -> Iterator[int]:
    """Block sizes that can have complete blocks at ``T``: 2, 4, … ≤ T."""
    size = 2
    while size <= T:
        yield size
        size *= 2


class Erased:
    """The erased memory positions, as maximal runs ``[start, end)``, and
    which blocks they cover whole (docs/DESIGN.md, "Erase": a block whose
    every memory is erased needs no summary).

    Runs are maximal, so the memory just past a run is not erased: a block
    that reaches past a run's end holds a live memory. That makes every
    question a binary search over the runs, and a level's count of wholly
    erased blocks one over its own prefix sums (made once per level asked)."""

    def __init__(self, ids: Iterable[int] = ()) -> None:
        starts: list[int] = []
        ends: list[int] = []
        for i in sorted(set(ids)):
            if ends and ends[-1] == i:
                ends[-1] = i + 1
            else:
                starts.append(i)
                ends.append(i + 1)
        self.starts, self.ends = starts, ends
        self._levels: dict[int, tuple[list[int], list[int], list[int]]] = {}

    @classmethod
    def from_runs(cls, runs: Iterable[tuple[int, int]]) -> Erased:
        """From sorted, maximal, disjoint runs ``[start, end)`` as they are
        (a memory file's erasure record keeps them so), without a set."""
        out = cls()
        for start, end in runs:
            out.starts.append(start)
            out.ends.append(end)
        return out

    def __bool__(self) -> bool:
        return bool(self.starts)

    def __len__(self) -> int:
        return sum(e - s for s, e in zip(self.starts, self.ends))

    def covers(self, lo: int, hi: int) -> bool:
        """Every memory of ``[lo, hi)`` is erased."""
        j = bisect_right(self.starts, lo) - 1
        return j >= 0 and self.ends[j] >= hi

    def next_live(self, size: int, k: int) -> int:
        """The first index ``>= k`` of level ``size`` whose block holds a
        memory that is not erased."""
        j = bisect_right(self.starts, k * size) - 1
        if j >= 0 and self.ends[j] >= (k + 1) * size:
            return self.ends[j] // size  # that block reaches past the run, to a live memory
        return k

    def _level(self, size: int) -> tuple[list[int], list[int], list[int]]:
        if size not in self._levels:
            first: list[int] = []
            end: list[int] = []
            cum = [0]
            for s, e in zip(self.starts, self.ends):
                a, b = -(-s // size), e // size
                if a < b:
                    first.append(a)
                    end.append(b)
                    cum.append(cum[-1] + b - a)
            self._levels[size] = (first, end, cum)
        return self._levels[size]

    def whole_blocks(self, size: int, first: int, end: int) -> int:
        """How many blocks of level ``size`` with index in ``[first, end)``
        are wholly erased."""
        if first >= end:
            return 0
        bfirst, bend, cum = self._level(size)
        j0 = bisect_right(bend, first)
        j1 = bisect_left(bfirst, end)
        if j0 >= j1:
            return 0
        return cum[j1] - cum[j0] - max(0, first - bfirst[j0]) - max(0, bend[j1 - 1] - end)


NO_ERASURE = Erased()


class Settled(dict[int, int]):
    """How far each level of the summary tree got, as :func:`pending` reads it.

    ``settled[size]`` is the level's *frontier*: one past its highest summary.
    Blocks settle strictly in order, so below the frontier every block has a
    summary except the ``holes`` and the wholly ``erased`` blocks:
    ``holes[size]`` lists, sorted, the indices below the frontier whose
    summary an erasure dropped (docs/DESIGN.md, "Erase": it drops only the
    blocks over the erased memory, so a level need not be a dense prefix);
    ``erased`` are the erased memories, and a block they cover whole is
    neither settled nor pending (it renders as erased). A plain dict is a
    tree without holes or erasures."""

    def __init__(
        self,
        counts: Iterable[tuple[int, int]] | dict[int, int] = (),
        holes: dict[int, list[int]] | None = None,
        erased: Erased | None = None,
    ) -> None:
        super().__init__(counts)
        self.holes: dict[int, list[int]] = holes or {}
        self.erased: Erased = erased or NO_ERASURE


def erased_of(settled: dict[int, int]) -> Erased:
    return getattr(settled, "erased", NO_ERASURE)


def is_erased(settled: dict[int, int], lo: int, hi: int) -> bool:
    """Every memory of ``[lo, hi)`` is erased: the block needs no summary."""
    return erased_of(settled).covers(lo, hi)


def holes_below(settled: dict[int, int], size: int, limit: int) -> list[int]:
    """The level's holes below ``limit`` (and below its frontier) that still
    hold a memory that is not erased."""
    top = min(settled.get(size, 0), limit)
    erased = erased_of(settled)
    return [
        k
        for k in getattr(settled, "holes", {}).get(size, ())
        if k < top and not erased.covers(k * size, (k + 1) * size)
    ]


def _in_sorted(ks: list[int], k: int) -> bool:
    j = bisect_left(ks, k)
    return j < len(ks) and ks[j] == k


def is_settled(settled: dict[int, int], lo: int, hi: int) -> bool:
    """Block ``[lo, hi)`` has a summary (a wholly erased block has none)."""
    size = hi - lo
    k = lo // size
    return (
        k < settled.get(size, 0)
        and not _in_sorted(getattr(settled, "holes", {}).get(size, []), k)
        and not is_erased(settled, lo, hi)
    )


def is_ready(settled: dict[int, int], lo: int, hi: int) -> bool:
    """Block ``[lo, hi)`` can stand in a larger block's source: it has a
    summary, or it is wholly erased and renders as such."""
    return is_settled(settled, lo, hi) or is_erased(settled, lo, hi)


def pending(T: int, settled: dict[int, int], limit: int | None = None) -> list[Block]:
    """Complete blocks without a summary that hold a memory not erased, in
    settling order (docs/DESIGN.md, "Blocks and the tree"): by size, then by
    position — a level's holes (below its frontier) come before the blocks
    past its frontier.

    ``settled`` is a :class:`Settled` (or a plain dict of frontiers for a
    tree without holes). Blocks are only ever settled in this order and
    forgotten from a point upward, so below the frontier only an erasure's
    holes (and wholly erased blocks, which are never due) are missing.
    """
    todo: list[Block] = []
    erased = erased_of(settled)
    for size in levels(T):
        n = T // size
        ks = holes_below(settled, size, n)
        k = erased.next_live(size, settled.get(size, 0))
        while k < n and (limit is None or len(ks) + len(todo) < limit):
            ks.append(k)
            k = erased.next_live(size, k + 1)
        for k in ks:
            todo.append((k * size, (k + 1) * size))
            if limit is not None and len(todo) >= limit:
                return todo
    return todo


def pending_count(T: int, settled: dict[int, int]) -> int:
    """``len(pending(T, settled))`` without listing. A level may hold more
    summaries than a past snapshot ``T`` needs, so each level is clamped at 0."""
    erased = erased_of(settled)
    return sum(
        max(0, T // size - settled.get(size, 0))
        - erased.whole_blocks(size, settled.get(size, 0), T // size)
        + len(holes_below(settled, size, T // size))
        for size in levels(T)
    )


def first_pending(T: int, settled: dict[int, int]) -> Block | None:
    todo = pending(T, settled, limit=1)
    return todo[0] if todo else None


def erase_span(i: int, T: int, settled: dict[int, int]) -> list[Block]:
    """What erasing memory ``#i`` drops (docs/DESIGN.md, "Erase"), smallest first: the
    summarised blocks on its path to the root, at most one per level, so at
    most ⌊log2 T⌋ of them. Every other summary stays."""
    return [
        (i // size * size, (i // size + 1) * size)
        for size in levels(T)
        if is_settled(settled, i // size * size, (i // size + 1) * size)
    ]


BATCH_MAX = 256
"""Most blocks one batch lists or one ``{"summaries": [...]}`` settles."""


def batch(T: int, settled: dict[int, int], limit: int) -> list[Block]:
    """The batch (docs/DESIGN.md, "Blocks and the tree"): the longest run, up to ``limit``, of the first
    pending blocks whose sources are settled already (a wholly erased half is a
    source as it is: it renders as erased), so every one of them can
    be written at once, by one agent or by parallel subagents.

    A block of at most :data:`RAW_MAX` memories is written from the raw log,
    which is always there, so it never ends a run. A larger one is written
    from its halves' summaries: the run stops at the first such block whose
    halves are not both settled before the batch (the batch's own blocks do
    not count: their texts are not known while the batch is being written).
    Settling the run in its order is settling each block as single naps would.
    """
    out: list[Block] = []
    for lo, hi in pending(T, settled, limit):
        size = hi - lo
        mid = lo + size // 2
        if size > RAW_MAX and not (is_ready(settled, lo, mid) and is_ready(settled, mid, hi)):
            break
        out.append((lo, hi))
    return out


def halves(lo: int, hi: int) -> tuple[Block, Block]:
    mid = (lo + hi) // 2
    return (lo, mid), (mid, hi)


def forget_span(lo: int, hi: int, settled: dict[int, int], T: int) -> list[Block]:
    """What ``forget lo-hi`` drops (docs/DESIGN.md, "Forget"), smallest first: at each size
    from ``hi - lo`` upward, the block containing ``lo`` and every later block
    of that level, so each level stays a dense prefix."""
    gone: list[Block] = []
    size = hi - lo
    while size <= max(T, hi - lo):
        k = lo // size
        n = settled.get(size, 0)
        gone.extend((i * size, (i + 1) * size) for i in range(k, n) if is_settled(settled, i * size, (i + 1) * size))
        size *= 2
    return gone
