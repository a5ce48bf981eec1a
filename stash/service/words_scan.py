"""A words recall over the whole log (docs/DESIGN.md, "Word search").

The log ``[0, T)`` is read as word-index pieces (:mod:`stash.core.word_piece`)
of 4,096 memories, then of 512 after the last of those: from the sealed word
index (:mod:`stash.storage.wordcache`) when it is on and a piece opens, else
built from the log (and written back when the index is on); the fewer than
512 memories after the last complete piece are built from the log on the
spot. Two passes:

1. every piece, each query word: the postings slice of the words it
   prefixes. This gives each word's document frequency over ``[0, T)``, the
   number of matches and the statistics of :class:`stash.core.words.Stats`.
2. scoring, rarest word first: the memories holding the rarest words are
   scored exactly (:func:`stash.core.words.score`); a memory holding only
   more common words cannot score above what those words alone can reach,
   so once enough memories beat that bound for a full page, the rest is
   never scored. Otherwise every match is scored.

Then the page: the best matches after the cursor (:class:`Cursor`), best
first, their lines read from the log, as many as fit in ``part_bytes``.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from ..core import word_piece, words
from ..core.words import Cursor, Query, Stats
from ..storage.memfile import KEYS_PER_CHUNK, SCAN_BATCH, MemoryFile
from ..storage.scancache import PIECE, WRITE_PIECES
from ..storage.wordcache import WordCache, WordTail

MIN_LINE_COST = len("#0 2026-01-01 x\n")
"""The fewest bytes a rendered memory line costs, newline included."""


_INDEX = [True]  # the server's --word-index, set once at start-up by use_index()


def use_index(on: bool) -> None:
    """Whether searches keep and read the sealed word index (``--word-index``)."""
    _INDEX[0] = on


class TooSlow(Exception):
    """The search ran past its deadline."""


@dataclass
class Found:
    lines: list[str]
    scores: list[int]
    total: int
    more: Cursor | None
    cut: bool = False  # a match was left out because its line alone is longer than the page


def _check(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise TooSlow


def _texts(mf: MemoryFile, lines: list[str], first: int) -> list[str | None]:
    erased = mf.erased_ids
    return [None if first + k in erased else line.split(" ", 2)[2] for k, line in enumerate(lines)]


def _from_log(mf: MemoryFile, lo: int, hi: int) -> bytes:
    if lo % SCAN_BATCH:
        erased = mf.erased_ids
        return word_piece.build([None if i in erased else text for i, _, text in mf.memories(lo, hi)])
    lines = [line for batch in mf.scan(hi, lo) for line in batch]
    return word_piece.build(_texts(mf, lines, lo))


def _pieces(mf: MemoryFile, kind: type[WordCache], stop: int, start: int, cached: bool,
            deadline: float) -> Iterator[tuple[int, bytes]]:
    """``(first memory, word piece bytes)`` for the pieces of ``kind``'s size
    numbered ``stop - 1`` down to ``start``: from the word index when
    ``cached`` and a piece opens, else built from the log (and then written
    back when ``cached``)."""
    size = kind.size
    if not cached:
        for piece in range(stop - 1, start - 1, -1):
            _check(deadline)
            yield piece * size, _from_log(mf, piece * size, (piece + 1) * size)
        return
    fk = mf.file_keys()
    cache = kind(mf.conn, fk.path.parent, mf.user_id, fk.rows_key, KEYS_PER_CHUNK, mf.erased_ids)
    built: dict[int, bytes] = {}
    try:
        for piece, plain in cache.pieces(stop, start):
            _check(deadline)
            if plain is None:
                plain = built[piece] = _from_log(mf, piece * size, (piece + 1) * size)
                if len(built) >= WRITE_PIECES:
                    cache.store(built)
                    built.clear()
            yield piece * size, plain
        cache.store(built)
        built.clear()
        if isinstance(cache, WordTail):
            cache.drop_below(start)
    finally:
        if built:  # a deadline cut the walk: keep what was built for the next search
            cache.store(built)
        cache.close()


def search(mf: MemoryFile, query: Query, part_bytes: int, deadline: float, cursor: Cursor | None = None,
           *, cached: bool | None = None) -> Found:
    """The page of the words search ``query`` after ``cursor`` (default: the
    first page, over the whole log). Raises TooSlow past ``deadline``."""
    cached = _INDEX[0] if cached is None else cached
    T = mf.count() if cursor is None else cursor.T
    k = len(query.words)
    keys = [w.encode("utf-8") for w in query.words]
    # Pass 1: each piece's postings slices, the document frequencies, the matches.
    pieces = T // PIECE
    found: list[tuple[int, word_piece.PieceIndex, list[tuple[int, int]]]] = []
    dfs = [0] * k
    n = length = total = 0
    # Newest first: the last < WORD_TAIL memories from the log, then the tail pieces, then the pieces.
    tails = T // WordTail.size
    rest = tails * WordTail.size
    sources = [(rest, _from_log(mf, rest, T))] if rest < T else []
    walks = itertools.chain(sources, _pieces(mf, WordTail, tails, pieces * PIECE // WordTail.size, cached, deadline),
                            _pieces(mf, WordCache, pieces, 0, cached, deadline))
    for base, data in walks:
        idx = word_piece.PieceIndex(data)
        spans = [idx.span(key) for key in keys]
        held: set[int] = set()
        for j, (a, b) in enumerate(spans):
            if b > a:
                ids = set(idx.postings[a:b])
                dfs[j] += len(ids)
                held |= ids
        total += len(held)
        n += len(idx.lengths) - idx.lengths.count(0)
        length += sum(idx.lengths)
        if held:
            found.append((base, idx, spans))
    stats = cursor.stats if cursor is not None else Stats(n, length, tuple(dfs))
    weights = stats.weights()
    # Pass 2: score, rarest words first, until no unscored memory can reach the page.
    order = sorted(range(k), key=lambda j: -weights[j])
    whole = sum(weights)
    after = None if cursor is None else (cursor.score, cursor.id)
    room = part_bytes // MIN_LINE_COST + 1  # no page holds more lines
    scored: dict[int, int] = {}
    for done in range(1, k + 1):
        _check(deadline)
        rare = order[:done]
        for base, idx, spans in found:
            tfs_of = [Counter(idx.postings[a:b]) for a, b in spans]
            for j in rare:
                for off in tfs_of[j]:
                    i = base + off
                    if i in scored:
                        continue
                    scored[i] = words.score(stats, weights, [c.get(off, 0) for c in tfs_of], idx.lengths[off])
        # What a memory holding none of the words scored so far could reach (below 1: it misses some).
        reach = sum(weights[j] for j in order[done:]) / whole * words.SCALE if whole else 0.0
        if done < k:
            ahead = sum(1 for i, s in scored.items() if s > reach and (after is None or (s, i) < after))
            if ahead >= room:
                break
    ranked = sorted(((s, i) for i, s in scored.items() if s and (after is None or (s, i) < after)), reverse=True)
    lines: list[str] = []
    scores: list[int] = []
    used = 0
    for s, i in ranked:
        _, date, text = mf.memory(i)
        line = f"#{i} {date} {text}"
        cost = len(line.encode("utf-8")) + 1
        if used + cost > part_bytes:
            break
        lines.append(line)
        scores.append(s)
        used += cost
    more = None
    if len(lines) < len(ranked) and lines:
        more = Cursor(T, stats, scores[-1], ranked[len(lines) - 1][1])
    return Found(lines, scores, total, more, cut=bool(ranked) and not lines)
