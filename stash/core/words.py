"""Word search, the pure part (docs/DESIGN.md, "Word search"): folding,
words, matching, scoring and the paging cursor. Nothing here reads a file.

Folding (:func:`fold`), applied to memory text and query alike:

1. NFKD (compatibility decomposition): full-width and other compatibility
   forms become their plain letters (``Ａ`` → ``A``, ``ﬁ`` → ``fi``,
   ``²`` → ``2``), precomposed accented letters become base + marks.
2. Unicode full case folding (``str.casefold``): ``ß`` → ``ss``, ``İ`` →
   ``i`` + a combining dot, ``Σ``/``ς`` → ``σ``.
3. NFKD again (case folding can yield composed letters), then every
   combining mark (general category M) is dropped: ``é`` → ``e``, the
   Vietnamese ``ệ`` (two stacked marks) → ``e``, ``İ`` → ``i``.
4. The few letters whose accent is not a mark in Unicode (they do not
   decompose) are mapped by :data:`EXTRA`: ``ı`` → ``i`` (so ``I ı İ i`` are
   one letter), ``đ`` → ``d``, ``ø`` → ``o``, ``ł`` → ``l``, ``ħ`` → ``h``,
   ``ŧ`` → ``t``, ``æ`` → ``ae``, ``œ`` → ``oe``, ``þ`` → ``th``.

Everything else is left alone: emoji, symbols and punctuation fold to
themselves (a variation selector, being a mark, is dropped). A **word** is a
maximal run of Unicode letters and digits of the folded text (general
categories L and N); everything else separates words.

A word's **form** is the word as written: the run of the text it folds from,
a maximal run of characters whose folding is letters and digits or nothing
(letters, digits and marks: ``Ağaçlar``, ``e`` + U+0301); a run that does
not fold to one word alone (``½`` folds to ``1⁄2``, ``℃`` to ``°c``) gives
each of its words itself as its form. A word's **stems** are, for each of its forms in the text
(one, mostly), the English and the Turkish Snowball stem of the form
lowered (:func:`stash.core.stems.lower`), each then folded
(:func:`stems_of`): ``Moving`` has the English stem ``move``, ``ağaçlar``
the Turkish stem ``agac`` (``ağaç`` folded). A stem folding to nothing is none.

Matching: a query word matches a memory word when its folded form is a
prefix of the memory word, or the two share a stem of one language (their
English stems equal, or their Turkish ones: a stem is never a prefix here).
A memory matches a query word when one of its words does; a memory matching
none of the query's words is not a match. :func:`matches` and
:func:`matches_all` are prefixes alone: erasure by words widens nothing.

Scoring (:func:`score`): BM25 (k1 = 1.2, b = 0.75) over the query's words,
a query word's term frequency in a memory being how many of its distinct
words it matches, each once however it matched (a word said twice counts
once; a prefix and a stem match of one word count once, and a stem match
weighs what a prefix match does), its document frequency how many memories it matches, with the
usual ``ln(1 + (N - df + 0.5) / (df + 0.5))`` weight, so a word most
memories hold weighs next to nothing. The BM25 sum is divided by the largest
sum the query could reach (each weight times ``k1 + 1``), a number in
``[0, 1)``, and 1 is added when the memory matches *every* query word: so
every memory matching all the words scores at least 1 and ranks above every
memory missing one, which scores below 1. Scores are kept as whole
millionths (:data:`SCALE`) so that ordering, ties and the paging cursor are
exact; ties rank newer (higher id) first.
"""

from __future__ import annotations

import math
import re
import sys
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from . import stems
from .lines import DELIMITER

MAX_QUERY_BYTES = 512
"""The longest words query, in UTF-8 bytes."""
MAX_WORDS = 16
"""The most distinct (folded) words one query may hold."""
MAX_CURSOR_BYTES = 400
K1 = 1.2
B = 0.75
SCALE = 1_000_000
"""Scores are whole multiples of 1/SCALE."""

EXTRA = {"ı": "i", "đ": "d", "ø": "o", "ł": "l", "ħ": "h", "ŧ": "t", "æ": "ae", "œ": "oe", "þ": "th", "ŀ": "l"}
"""Letters with an accent that Unicode does not decompose, as their folded
base letters (all lower case: they are applied after case folding)."""

_WORD = re.compile(r"[^\W_]+")  # str.isalnum() runs: letters and digits (categories L and N)


class BadWords(ValueError):
    """A words query that cannot be used; the message is one user-facing
    sentence that never holds the query."""


@lru_cache(maxsize=1)
def _strip_table() -> dict[int, str | None]:
    """Combining marks → nothing, and :data:`EXTRA`, for ``str.translate``."""
    # Marks live in planes 0-2 and in plane 14 (variation selectors); the planes between hold none.
    planes = (*range(0, 0x30000), *range(0xE0000, sys.maxunicode + 1))
    table: dict[int, str | None] = {cp: None for cp in planes if unicodedata.category(chr(cp))[0] == "M"}
    table.update({ord(k): v for k, v in EXTRA.items()})
    return table


def fold(text: str) -> str:
    """``text`` case- and accent-folded, as the module docstring says."""
    if text.isascii():
        return text.lower()  # case folding of ASCII; NFKD changes no ASCII
    text = unicodedata.normalize("NFKD", unicodedata.normalize("NFKD", text).casefold())
    return text.translate(_strip_table())


def words(text: str) -> list[str]:
    """The words of ``text``, folded, in order (repeats kept)."""
    return _WORD.findall(fold(text))


@lru_cache(maxsize=4096)
def _in_run(c: str) -> bool:
    """Does character ``c`` belong to a form: does it fold to letters or
    digits (among other things) or to nothing?"""
    folded = fold(c)
    return not folded or _WORD.search(folded) is not None


@lru_cache(maxsize=16384)
def _run_form(run: str) -> tuple[str, str] | None:
    """The word a run folds to and its form lowered (``("", "")`` for a run
    folding to nothing), or None when it folds to more than one word (or
    to something besides letters and digits). Text repeats its words, so
    each run is folded once while it stays in the cache."""
    folded = fold(run)
    if not folded:
        return "", ""
    return (folded, stems.lower(run)) if _WORD.fullmatch(folded) else None


def _run_forms(run: str, out: list[tuple[str, str]]) -> None:
    """Append the words of ``run`` with their forms lowered."""
    got = _run_form(run)
    if got is None:
        out.extend((w, w) for w in _WORD.findall(fold(run)))
    elif got[0]:
        out.append(got)


def forms(text: str) -> list[tuple[str, str]]:
    """The words of ``text`` (:func:`words`, in order, repeats kept), each
    with its form (the module docstring) as :func:`stash.core.stems.lower`
    gives it. Most text is runs of letters and digits, each folding to one
    word, between characters that belong to no form (spaces, punctuation):
    those runs are the forms, found by one regular expression. Other text
    (a combining mark written apart, ``℃``, ``½``) is read a character at
    a time."""
    if text.isascii():
        found = _WORD.findall(text.lower())
        return list(zip(found, found))
    got = [_run_form(run) for run in _WORD.findall(text)]
    if None not in got:
        between = _WORD.sub("", text)
        if between.isascii() or not any(map(_in_run, set(between))):
            return [g for g in got if g is not None and g[0]]
    out: list[tuple[str, str]] = []
    run: list[str] = []
    for c in text:
        if _in_run(c):
            run.append(c)
        elif run:
            _run_forms("".join(run), out)
            run = []
    if run:
        _run_forms("".join(run), out)
    return out


def stems_of(lowered: Sequence[str]) -> list[tuple[str, str]]:
    """The folded English and Turkish stems of each form of ``lowered``
    (as :func:`stash.core.stems.lower` gives them), in the order of
    :data:`stash.core.stems.LANGUAGES`; "" where a stem folds to nothing."""
    en, tr = stems.stem_words(lowered)
    return list(zip(_fold_each(en), _fold_each(tr)))


def _fold_each(texts: list[str]) -> list[str]:
    """:func:`fold` of each of ``texts``, by one folding of them joined by
    newlines: folding maps each character on its own, and a newline to
    itself (a piece folds thousands of stems)."""
    out = fold("\n".join(texts)).split("\n")
    return out if len(out) == len(texts) else [fold(t) for t in texts]


Stems = frozenset[tuple[str, str]]
"""A word's stems: ``(language code, folded stem)`` pairs
(:data:`stash.core.stems.LANGUAGES`), one a language for each of its forms."""


def stemmed(pairs: Iterable[tuple[str, str]]) -> dict[str, Stems]:
    """Each distinct word of ``pairs`` (:func:`forms`) with its stems, in
    the order first seen; each distinct form stemmed once."""
    by_word: dict[str, set[str]] = {}
    for w, low in pairs:
        by_word.setdefault(w, set()).add(low)
    lows = list(dict.fromkeys(low for got in by_word.values() for low in got))
    of = dict(zip(lows, stems_of(lows)))
    codes = tuple(stems.LANGUAGES)
    return {
        w: frozenset((code, st) for low in got for code, st in zip(codes, of[low]) if st) for w, got in by_word.items()
    }


@dataclass(frozen=True)
class Query:
    """A parsed words query: its distinct folded words, in the order typed,
    and each one's stems (:func:`stemmed`; none given: prefixes alone)."""

    words: tuple[str, ...]
    stems: tuple[Stems, ...] = ()


def parse_query(text: object) -> Query:
    """Validate and fold a words query; raise BadWords if it is unusable."""
    if not isinstance(text, str):
        raise BadWords("Send the words as the string words.")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadWords("The words are not valid Unicode text. Send them as UTF-8.") from None
    if size > MAX_QUERY_BYTES:
        raise BadWords(f"The words are {size} bytes; the limit is {MAX_QUERY_BYTES}. Send fewer words.")
    if text == DELIMITER:
        raise BadWords(
            f"{DELIMITER} alone is reserved: it closes the here-documents of printed commands; "
            f"search for {DELIMITER.replace('_', ' ')} instead."
        )
    pairs = forms(text)
    distinct = tuple(dict.fromkeys(w for w, _ in pairs))
    if not distinct:
        raise BadWords("The words hold no letter or digit. Send at least one word to search for.")
    if len(distinct) > MAX_WORDS:
        raise BadWords(
            f"The query holds {len(distinct)} different words; the limit is {MAX_WORDS}. "
            "Keep the words that matter most."
        )
    held = stemmed(pairs)
    return Query(distinct, tuple(held[w] for w in distinct))


def frequencies(query: Query, memory_words: Mapping[str, Stems]) -> list[int]:
    """For each query word, how many distinct words of a memory
    (``memory_words``: each with its stems, :func:`stemmed`) it matches,
    by prefix or by a stem, each once: its term frequency in that memory."""
    qstems = query.stems or tuple(frozenset() for _ in query.words)
    return [
        sum(1 for m, st in memory_words.items() if m.startswith(w) or not st.isdisjoint(q))
        for w, q in zip(query.words, qstems)
    ]


def matches(query: Query, text: str) -> bool:
    """Does some query word prefix one of the words of ``text`` (prefixes
    alone, as erasure matches)?"""
    ws = words(text)
    return any(m.startswith(w) for w in query.words for m in ws)


def matches_all(query: Query, text: str) -> bool:
    """Does every query word prefix one of the words of ``text`` (prefixes
    alone: erasure by words erases no memory that only a stem matches)?"""
    ws = words(text)
    return all(any(m.startswith(w) for m in ws) for w in query.words)


@dataclass(frozen=True)
class Stats:
    """What a score depends on beyond the memory itself: how many memories
    are searched (``n``), their words in all (``length``), and each query
    word's document frequency. A page's cursor carries them, so every page
    of one search is ranked alike (see :class:`Cursor`)."""

    n: int
    length: int
    dfs: tuple[int, ...]

    def weights(self) -> list[float]:
        return [math.log(1 + (self.n - df + 0.5) / (df + 0.5)) for df in self.dfs]


def score(stats: Stats, weights: Sequence[float], tfs: Sequence[int], length: int) -> int:
    """The score of a memory of ``length`` words whose term frequencies are
    ``tfs`` (one per query word), in millionths; 0 when it matches nothing."""
    if not any(tfs):
        return 0
    avg = stats.length / stats.n if stats.n and stats.length else 1.0
    norm = K1 * (1 - B + B * length / avg)
    total = bound = 0.0
    for w, tf in zip(weights, tfs):
        bound += w * (K1 + 1)
        if tf:
            total += w * tf * (K1 + 1) / (tf + norm)
    frac = total / bound if bound > 0 else 0.0
    # Below 1 by construction (tf/(tf+norm) < 1); min() keeps it so under rounding.
    part = min(SCALE - 1, max(1, int(frac * SCALE)))
    return (SCALE if all(tfs) else 0) + part


def rank(query: Query, memories: Iterable[tuple[int, str]]) -> list[tuple[int, int]]:
    """The reference ranking of a small collection: ``(score, id)`` of every
    matching memory of ``memories`` (``(id, text)`` pairs), best first, ties
    newer first, with statistics taken from the collection itself (``n``
    counts the memories holding at least one word). The
    service ranks a whole log the same way from its word index."""
    memories = list(memories)
    docs = [(i, words(text)) for i, text in memories]
    tfs = {i: frequencies(query, stemmed(forms(text))) for i, text in memories}
    stats = Stats(
        sum(1 for _, ws in docs if ws),
        sum(len(ws) for _, ws in docs),
        tuple(sum(1 for i, _ in docs if tfs[i][k]) for k in range(len(query.words))),
    )
    weights = stats.weights()
    out = [(score(stats, weights, tfs[i], len(ws)), i) for i, ws in docs]
    return sorted(((s, i) for s, i in out if s), reverse=True)


@dataclass(frozen=True)
class Cursor:
    """Where the next page of a words search starts: the memories searched
    (``[0, T)``), the :class:`Stats` the first page ranked them with, and the
    ``(score, id)`` of the last match shown. The next page is the matches
    strictly after that key in the order (score descending, id descending),
    ranked with the same statistics over the same ``[0, T)``. Every memory
    keeps its score from page to page (its score depends only on its own
    words and these statistics), the order is total, and each page starts
    strictly after the last key shown: so walking ``more`` shows every match
    once, none twice and none skipped, whatever is noted meanwhile (new
    memories lie at or past ``T``). A memory erased meanwhile is simply not
    shown. Written ``w1.T.n.length.df1-df2-….score.id``, all decimal."""

    T: int
    stats: Stats
    score: int
    id: int

    def text(self) -> str:
        dfs = "-".join(map(str, self.stats.dfs))
        return f"w1.{self.T}.{self.stats.n}.{self.stats.length}.{dfs}.{self.score}.{self.id}"


_CURSOR = re.compile(
    r"w1\.(\d{1,15})\.(\d{1,15})\.(\d{1,18})\.(\d{1,15}(?:-\d{1,15}){0,%s})\.(\d{1,8})\.(\d{1,15})".replace(
        "%s", str(MAX_WORDS - 1)
    )
)


def parse_cursor(text: object, query: Query) -> Cursor:
    """The cursor a previous page's ``more`` named; raise BadWords if it is
    not one, or was made for a query of another number of words."""
    bad = BadWords(
        "before is not the more of a previous page of this search. Send the more the last page "
        "answered, or leave before out for the first page."
    )
    if not isinstance(text, str) or len(text) > MAX_CURSOR_BYTES:
        raise bad
    m = _CURSOR.fullmatch(text)
    if m is None:
        raise bad
    T, n, length, dfs, sc, i = m.groups()
    df = tuple(int(x) for x in dfs.split("-"))
    if len(df) != len(query.words) or int(n) > int(T) or any(d > int(n) for d in df) or int(sc) >= 2 * SCALE:
        raise bad
    return Cursor(int(T), Stats(int(n), int(length), df), int(sc), int(i))
