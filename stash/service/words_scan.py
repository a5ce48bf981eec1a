"""A words recall over the whole log (docs/DESIGN.md, "Word search").

The log ``[0, T)`` is read as word-index pieces (:mod:`stash.core.word_piece`)
of 4,096 memories, then of 512 after the last of those: from the sealed word
index (:mod:`stash.storage.recallcache.word_index`) when it is on and a piece opens, else
built from the log (and written back when the index is on); the fewer than
512 memories after the last complete piece are built from the log on the
spot. Two passes:

1. every piece, each query word: the bitmap of the memories holding a word
   it matches, by prefix or by a stem (:meth:`View.tally`). This gives
   each word's document frequency over ``[0, T)``, the number of matches
   and the statistics of :class:`stash.core.words.Stats`.
2. the best matches: from the bitmaps and the lengths, by the term
   frequencies each memory has (:func:`stash.core.words_top.top`), when
   they make at most 1,023 classes (10 words held or not, or fewer words
   some of which prefix several words of a memory) and every length fits a
   byte. Otherwise scoring, rarest word first: the
   memories holding the rarest words are scored exactly
   (:func:`stash.core.words.score`); a memory holding only more common words
   cannot score above what those words alone can reach, so once enough
   memories beat that bound for a full page, the rest is never scored.

Then the page: the best matches after the cursor (:class:`Cursor`), best
first, their lines read from the log, as many as fit in ``part_bytes``.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..core import word_piece, word_piece_write, words, words_best, words_top
from ..core.words import Cursor, Query, Stats
from ..storage.memfile import KEYS_PER_CHUNK, SCAN_BATCH, MemoryFile
from ..storage.recallcache.rendered_log import PIECE, WRITE_PIECES
from ..storage.recallcache.word_index import CHARS, WordCache, WordTail

MIN_LINE_COST = len("#0 2026-01-01 x\n")
"""The fewest bytes a rendered memory line costs, newline included."""


_INDEX = [True]  # the server's --word-index, set once at start-up by use_index()


def use_index(on: bool) -> None:
    """Whether searches keep and read the sealed word index (``--word-index``)."""
    _INDEX[0] = on


class TooSlow(Exception):
    """The search ran past its deadline."""


BUILD_SECONDS_PER_MEMORY = 100e-6
"""What building the word index of one memory from the log may add to a
search's time bound: the first search of a large log builds its index
(about 25 µs a memory on a quiet core), which the bound must not cut short
again and again; the rest of the search keeps the bound it was given."""


class Clock:
    """A search's deadline, extended by what building index pieces may take."""

    def __init__(self, deadline: float) -> None:
        self.end = deadline

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise TooSlow

    def built(self, memories: int) -> None:
        self.end += memories * BUILD_SECONDS_PER_MEMORY


@dataclass
class Found:
    lines: list[str]
    scores: list[int]
    total: int
    more: Cursor | None
    cut: bool = False  # a match was left out because its line alone is longer than the page


def _texts(mf: MemoryFile, lines: list[str], first: int) -> list[str | None]:
    erased = mf.erased_ids
    return [None if first + k in erased else line.split(" ", 2)[2] for k, line in enumerate(lines)]


def _from_log(mf: MemoryFile, lo: int, hi: int) -> bytes:
    if lo % SCAN_BATCH:
        erased = mf.erased_ids
        return word_piece_write.build([None if i in erased else text for i, _, text in mf.memories(lo, hi)])
    lines = [line for batch in mf.scan(hi, lo) for line in batch]
    return word_piece_write.build(_texts(mf, lines, lo))


Stem = tuple[str, bytes]
"""A query word's stem as a search looks it up: its language code and the
folded stem in UTF-8."""


class View:
    """A piece as a search reads it: ``stats`` gives its memories' lengths
    (and ``held``, ``words``, ``memories``), ``parts[j]`` the indexes that
    hold query word j's postings: the whole piece, or the word's segments of
    it; ``stem_parts[j]`` each of its stems with the index that holds the
    words having it (the whole piece, or the segment of the stem's head)."""

    __slots__ = ("chars", "held", "length_bytes", "lengths", "memories", "parts", "stem_parts", "words")

    def __init__(
        self,
        stats: word_piece.PieceIndex,
        parts: list[list[word_piece.PieceIndex]],
        stem_parts: list[list[tuple[word_piece.PieceIndex, Stem]]],
        chars: word_piece.PieceIndex | None = None,
    ) -> None:
        self.held, self.words, self.lengths, self.parts = stats.held, stats.words, stats.lengths, parts
        self.memories, self.length_bytes, self.chars = stats.memories, stats.length_bytes, chars
        self.stem_parts = stem_parts

    @classmethod
    def whole(cls, data: bytes, stems: list[list[Stem]]) -> View:
        idx = word_piece.PieceIndex(data)
        return cls(idx, [[idx]] * len(stems), [[(idx, st) for st in word] for word in stems])

    def _more(self, j: int, key: bytes) -> list[tuple[word_piece.PieceIndex, int]]:
        """The words that share a stem with query word ``j`` (``key``) and
        that it does not prefix (those its prefix finds already), each once
        however many of its stems it shares."""
        out: list[tuple[word_piece.PieceIndex, int]] = []
        seen: set[bytes] = set()
        for part, (code, stem) in self.stem_parts[j]:
            # The word that is the stem itself, when the query word prefixes it, is found by the prefix.
            for w in part.mates(code, stem, own=not stem.startswith(key)):
                word = part.word(w)
                if not word.startswith(key) and word not in seen:
                    seen.add(word)
                    out.append((part, w))
        return out

    def _char_layers(self, key: bytes) -> list[int] | None:
        """A one-character query word's layers from the segment of first
        characters, or None when the piece was not read as segments."""
        if self.chars is None or not word_piece.one_char(key):
            return None
        return self.chars.char_layers(key)

    def tally(self, j: int, key: bytes) -> tuple[int, list[int]]:
        """The bitmap and :func:`~stash.core.words_top.layers` of query
        word ``j`` (``key``): :func:`~stash.core.word_piece.tally` over all
        its parts and the words sharing its stems at once, or for one
        character the layers its segment keeps with those words' added."""
        bitmaps: list[int] = []
        lists: list[word_piece.Ints] = []
        for part, w in self._more(j, key):
            part.add_postings(w, bitmaps, lists)
        lay = self._char_layers(key)
        if lay is not None:
            if bitmaps or lists:
                lay = words_top.merge(lay, word_piece.tally(self.memories, bitmaps, lists)[2])
            return (lay[0] if lay else 0), lay
        for part in self.parts[j]:
            part.gather(key, bitmaps, lists)
        bits, _, lay = word_piece.tally(self.memories, bitmaps, lists)
        return bits, lay

    def postings(self, j: int, key: bytes) -> list[int]:
        """The memories holding a word query word ``j`` (``key``) matches,
        a memory once per such word, in no particular order."""
        out: list[int] = []
        for part, w in self._more(j, key):
            bitmaps: list[int] = []
            lists: list[word_piece.Ints] = []
            part.add_postings(w, bitmaps, lists)
            out.extend(k for bits in bitmaps for k in words_top.ones(bits))
            out.extend(k for got in lists for k in got)
        lay = self._char_layers(key)
        if lay is not None:  # a memory in layers 1 to t holds t such words: listed t times
            return out + [k for bits in lay for k in words_top.ones(bits)]
        for part in self.parts[j]:
            out.extend(part.positions(key))
        return out


def _pieces(
    mf: MemoryFile,
    kind: type[WordCache],
    stop: int,
    start: int,
    cached: bool,
    clock: Clock,
    keys: list[bytes],
    stems: list[list[Stem]],
) -> Iterator[tuple[int, View]]:
    """``(first memory, piece)`` for the pieces of ``kind``'s size numbered
    ``stop - 1`` down to ``start``: from the word index when ``cached`` and
    the segments of ``keys`` and their ``stems`` open, else built from the
    log (and then written back whole when ``cached``)."""
    size = kind.size
    if not cached:
        for piece in range(stop - 1, start - 1, -1):
            clock.check()
            clock.built(size)
            yield piece * size, View.whole(_from_log(mf, piece * size, (piece + 1) * size), stems)
        return
    fk = mf.file_keys()
    cache = kind(mf.conn, fk.path.parent, mf.user_id, fk.rows_key, KEYS_PER_CHUNK, mf.erased_ids)
    built: dict[int, bytes] = {}
    try:
        for piece, segs in cache.segments(stop, start, keys, (st for word in stems for _, st in word)):
            clock.check()
            if segs is not None and (CHARS not in segs or segs[CHARS].held):  # held 0: layers not kept
                yield (
                    piece * size,
                    View(
                        segs[0],
                        [[segs[b] for b in cache.buckets(key)] for key in keys],
                        [[(segs[cache.bucket(st[1])], st) for st in word] for word in stems],
                        segs.get(CHARS),
                    ),
                )
                continue
            clock.built(size)
            plain = built[piece] = _from_log(mf, piece * size, (piece + 1) * size)
            if len(built) >= WRITE_PIECES:
                cache.store(built)
                built.clear()
            yield piece * size, View.whole(plain, stems)
        cache.store(built)
        built.clear()
        if isinstance(cache, WordTail):
            cache.drop_below(start)
    finally:
        if built:  # a deadline cut the walk: keep what was built for the next search
            cache.store(built)
        cache.close()


def _lines(mf: MemoryFile, ids: list[int]) -> dict[int, str]:
    """The rendered lines of memories ``ids``, read together: the best
    matches lie all over the log, and reading each alone would open its
    key chunk once per line."""
    return {i: f"#{i} {date} {text}" for i, date, text in mf.memories_at(sorted(set(ids)))}


class _Scorer:
    """:func:`stash.core.words.score`, with the part that depends only on a
    memory's length computed once per length."""

    def __init__(self, stats: Stats, weights: list[float]) -> None:
        self.stats, self.weights = stats, weights
        self.avg = stats.length / stats.n if stats.n and stats.length else 1.0
        self.bound = sum(weights) * (words.K1 + 1)
        self._single: dict[tuple[object, int], int] = {}

    def of_class(self, tfs: tuple[int, ...], length: int) -> int:
        """The score of a memory of term frequencies ``tfs`` and ``length``."""
        key = (tfs, length)
        got = self._single.get(key)
        if got is None:
            got = self._single[key] = words.score(self.stats, self.weights, tfs, length)
        return got

    def reach(self, held: int, length: int, tops: Sequence[int]) -> int:
        """A :data:`stash.core.words_best.Reach`: what a memory holding at
        most ``held`` of the query words (word ``j`` at most ``tops[j]``
        times) and ``length`` words or more can score. The sum of its
        ``held`` best words' BM25 terms at their top frequency and at
        ``length`` (a term rises with its frequency and falls with the
        length), one more for the rounding of :func:`stash.core.words.score`;
        below SCALE, since it misses a word."""
        if held <= 0:
            return 0
        if self.bound <= 0:
            return words.SCALE - 1
        norm = words.K1 * (1 - words.B + words.B * length / self.avg)
        terms = sorted((w * t * (words.K1 + 1) / (t + norm) for w, t in zip(self.weights, tops) if t), reverse=True)
        return min(words.SCALE - 1, int(sum(terms[:held]) / self.bound * words.SCALE) + 1)

    def score(self, mask: int, tfs: list[int], length: int) -> int:
        """The score of a memory holding the words of ``mask`` (bit j: query
        word j), ``tfs`` their frequencies (all 1 may be passed as ``[]``)."""
        if not tfs:
            key = (mask, length)
            got = self._single.get(key)
            if got is None:
                ones = [1 if mask >> j & 1 else 0 for j in range(len(self.weights))]
                got = self._single[key] = words.score(self.stats, self.weights, ones, length)
            return got
        return words.score(self.stats, self.weights, tfs, length)


Found_ = tuple[int, View, list[list[int]], list[set[int]], set[int]]
"""A piece holding matches: its first memory, the piece, each query word's
postings slice, the set of its offsets, and the offsets holding any word."""


def _top(groups: dict[int, list[int]], after: tuple[int, int] | None, n: int) -> list[tuple[int, int]]:
    """The best ``n`` ``(score, id)`` below ``after`` of the ids of each
    score, best first (ties: the higher id first), scores of 0 left out."""
    out: list[tuple[int, int]] = []
    for s in sorted(groups, reverse=True):
        if not s or (after is not None and s > after[0]):
            continue
        ids = groups[s] if after is None or s != after[0] else [i for i in groups[s] if i < after[1]]
        need = n - len(out)
        out.extend((s, i) for i in (heapq.nlargest(need, ids) if len(ids) > need else sorted(ids, reverse=True)))
        if len(out) >= n:
            break
    return out


def _rank(
    found: list[Found_], stats: Stats, k: int, room: int, after: tuple[int, int] | None, clock: Clock
) -> dict[int, int]:
    """The scores, by id, of enough matches to fill a page after ``after``: all
    of the best ``room`` of them, in no order (no page holds ``room`` lines).

    First the memories holding every word (they outrank all others): set
    intersections, scored by length. If ``room`` of them lie after the
    cursor, nothing else can reach the page. Otherwise the others, rarest
    word first: once ``room`` scored memories beat what a memory holding only
    the words not yet looked at could reach, the rest is never scored."""
    weights = stats.weights()
    scorer = _Scorer(stats, weights)
    full = (1 << k) - 1
    whole = sum(weights)
    out: dict[int, int] = {}

    def ahead(limit: float) -> int:
        return sum(1 for i, s in out.items() if s > limit and (after is None or (s, i) < after))

    # The pieces' postings: each word's memories, and their frequencies only where a prefix names two words.
    sets: list[tuple[int, View, list[set[int]], list[Counter[int] | None]]] = []
    by_length: list[int] = []  # the score of a memory holding every word once, by its length
    for base, idx, plists, held, _ in found:
        clock.check()
        tfs = [Counter(p) if len(p) != len(h) else None for p, h in zip(plists, held)]
        sets.append((base, idx, held, tfs))
        every = set.intersection(*held)
        if not every:
            continue
        lengths = idx.lengths
        if any(c is not None for c in tfs):
            for off in every:
                tf = [c[off] if c is not None else 1 for c in tfs]
                out[base + off] = scorer.score(full, tf, lengths[off])
            continue
        top = max(lengths[off] for off in every)
        while len(by_length) <= top:
            by_length.append(scorer.score(full, [], len(by_length)))
        out.update({base + off: by_length[lengths[off]] for off in every})
    if ahead(words.SCALE - 1) >= room or k == 1:
        return out
    order = sorted(range(k), key=lambda j: -weights[j])
    for done in range(1, k + 1):
        clock.check()
        j = order[done - 1]
        for base, idx, held, tfs in sets:
            lengths = idx.lengths
            for off in held[j]:
                i = base + off
                if i in out:
                    continue
                mask = 0
                for m in range(k):
                    if off in held[m]:
                        mask |= 1 << m
                multi = any(tfs[m] is not None for m in range(k) if mask >> m & 1)
                tf = (
                    [
                        (tfs[m][off] if tfs[m] is not None else 1) if mask >> m & 1 else 0  # type: ignore[index]
                        for m in range(k)
                    ]
                    if multi
                    else []
                )
                out[i] = scorer.score(mask, tf, lengths[off])
        # What a memory holding none of the words looked at so far could reach (below 1: it misses some).
        reach = sum(weights[m] for m in order[done:]) / whole * words.SCALE if whole else 0.0
        if done < k and ahead(reach) >= room:
            break
    return out


def _low_lengths(found: list[tuple[int, View, list[list[int]]]]) -> list[bytes] | None:
    """Each piece's lengths, one byte a memory, or None when one is 256 or more."""
    out = []
    for _, view, _ in found:
        raw = bytes(view.length_bytes)  # little-endian uint16
        if raw[1::2].count(0) != len(raw) // 2:
            return None
        out.append(raw[0::2])
    return out


def search(
    mf: MemoryFile,
    query: Query,
    part_bytes: int,
    deadline: float,
    cursor: Cursor | None = None,
    *,
    cached: bool | None = None,
) -> Found:
    """The page of the words search ``query`` after ``cursor`` (default: the
    first page, over the whole log). Raises TooSlow past ``deadline``."""
    cached = _INDEX[0] if cached is None else cached
    clock = Clock(deadline)
    T = mf.count() if cursor is None else cursor.T
    k = len(query.words)
    keys = [w.encode("utf-8") for w in query.words]
    # Each query word's stems, looked up as they are kept (word_piece: a language code and the folded stem).
    stems = [sorted((code, st.encode("utf-8")) for code, st in got) for got in query.stems or [frozenset()] * k]
    # Pass 1: each piece's postings slices, the document frequencies, the matches.
    pieces = T // PIECE
    found: list[tuple[int, View, list[list[int]]]] = []  # a piece holding matches: its first id, itself, layers
    dfs = [0] * k
    n = length = total = 0
    # Newest first: the last < WORD_TAIL memories from the log, then the tail pieces, then the pieces.
    tails = T // WordTail.size
    rest = tails * WordTail.size
    sources = [(rest, View.whole(_from_log(mf, rest, T), stems))] if rest < T else []
    walks = itertools.chain(
        sources,
        _pieces(mf, WordTail, tails, pieces * PIECE // WordTail.size, cached, clock, keys, stems),
        _pieces(mf, WordCache, pieces, 0, cached, clock, keys, stems),
    )
    for base, idx in walks:
        layers = []
        anyone = 0
        for j, key in enumerate(keys):
            # A memory holding two words the query word prefixes counts them both (its frequency).
            b, lay = idx.tally(j, key)
            dfs[j] += b.bit_count()
            anyone |= b
            layers.append(lay)
        held = anyone.bit_count()
        total += held
        n += idx.held
        length += idx.words
        if held:
            found.append((base, idx, layers))
    stats = cursor.stats if cursor is not None else Stats(n, length, tuple(dfs))
    after = None if cursor is None else (cursor.score, cursor.id)
    room = part_bytes // MIN_LINE_COST + 1  # no page holds this many lines
    # Pass 2: a memory's score is that of its words and length (words_top), or, where a query word
    # prefixes two words of one memory or the lengths do not fit a byte, scored rarest word first.
    lows = _low_lengths(found)
    scorer = _Scorer(stats, stats.weights())
    got = (
        None
        if lows is None
        else words_best.best(
            [(base, layers, low) for (base, _, layers), low in zip(found, lows)],
            k,
            scorer.of_class,
            after,
            room + 1,
            clock.check,
            scorer.reach,
        )
    )
    if got is not None:
        ranked = got
    else:
        old: list[Found_] = []
        for base, view, _ in found:
            clock.check()
            plists = [view.postings(j, key) for j, key in enumerate(keys)]
            sets = [set(p) for p in plists]
            old.append((base, view, plists, sets, set().union(*sets)))
        groups: dict[int, list[int]] = {}
        for i, sc in _rank(old, stats, k, room, after, clock).items():
            groups.setdefault(sc, []).append(i)
        ranked = _top(groups, after, room + 1)
    lines: list[str] = []
    scores: list[int] = []
    used = 0
    rendered: dict[int, str] = {}
    for k, (s, i) in enumerate(ranked):
        if i not in rendered:
            # The next lines, as many as the room left seems to hold at the lines' mean cost so far (a few
            # more): a page is read, never the whole ranking, and hardly a line past it.
            mean = used / k if k else MIN_LINE_COST
            want = max(8, min(256, int((part_bytes - used) / mean * 1.1) + 4))
            rendered = _lines(mf, [j for _, j in ranked[k : k + want]])
        line = rendered[i]
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
