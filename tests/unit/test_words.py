"""The pure parts of word search (stash/core/words.py, word_piece.py).

The folding table below is written by hand from the Unicode rules the module
names (UnicodeData decompositions, CaseFolding.txt full foldings, general
categories), not produced by the code: each row says what a reader of those
tables expects."""

from __future__ import annotations

import math
import random

import pytest

from stash.core import word_piece, word_piece_write, words
from stash.core.lines import DELIMITER

FOLDING = [
    # Turkish: the four i's are one letter (İ = I + U+0307 under NFD; ı has no decomposition: the table maps it).
    ("İstanbul", "istanbul"),
    ("ISTANBUL", "istanbul"),
    ("ıspanak", "ispanak"),
    ("Iİıi", "iiii"),
    ("Ayşe Yılmaz", "ayse yilmaz"),  # ş = s + U+0327 cedilla
    ("ĞÜÇÖ", "guco"),
    # German: ß and ẞ fold to ss (CaseFolding F), umlauts are u/o/a + U+0308.
    ("Straße", "strasse"),
    ("GROẞ", "gross"),
    ("Übergrößenträger", "ubergrossentrager"),
    # French.
    ("Café crème à la française", "cafe creme a la francaise"),
    ("ŒUVRE œuvre", "oeuvre oeuvre"),  # œ does not decompose: the table maps it
    ("naïve Noël", "naive noel"),
    # Vietnamese: two marks stacked on one letter, and đ (no decomposition: the table maps it).
    ("Tiếng Việt", "tieng viet"),
    ("ệ Ệ ặ ở ữ", "e e a o u"),
    ("Đà Nẵng", "da nang"),
    # Full-width forms (compatibility decompositions <wide>) and the ideographic space (<wide> U+0020).
    ("ＦＵＬＬ　ｗｉｄｔｈ１２３", "full width123"),
    # Combining marks written apart from their letter are dropped the same way.
    ("e\u0301te\u0301", "ete"),
    ("a\u0308\u0301", "a"),
    # Ligatures and other compatibility forms.
    ("ﬁne ﬂow", "fine flow"),
    ("x²", "x2"),
    # Greek final sigma folds with the others; Greek accents are marks.
    ("ΣΟΦΊΑ σοφία σοφίας", "σοφια σοφια σοφιασ"),  # CaseFolding: 03C2 (ς) C 03C3 (σ)
    # Nordic and Polish letters that do not decompose.
    ("Øresund Łódź Ærø", "oresund lodz aero"),
    # Emoji, symbols and punctuation are left alone.
    ("😀🎉", "😀🎉"),
    ("👨‍👩‍👧", "👨‍👩‍👧"),
    ("a—b “c” ¿d?", "a—b “c” ¿d?"),
]


@pytest.mark.parametrize("text, folded", FOLDING)
def test_folding_follows_the_unicode_rules(text: str, folded: str) -> None:
    assert words.fold(text) == folded


WORDS = [
    ("deploy on Friday; Café-Noir!", ["deploy", "on", "friday", "cafe", "noir"]),
    ("x_y 12ab v2.3", ["x", "y", "12ab", "v2", "3"]),  # "_" and "." separate words
    ("日本語のメモ", ["日本語のメモ"]),  # letters with no spaces between are one word
    ("I ❤️ tea", ["i", "tea"]),  # emoji are not words
    ("", []),
    ("— !!! —", []),
    ("٣ apples", ["٣", "apples"]),  # digits of any script are word characters
]


@pytest.mark.parametrize("text, expected", WORDS)
def test_words_are_runs_of_letters_and_digits(text: str, expected: list[str]) -> None:
    assert words.words(text) == expected


def test_a_query_word_matches_as_a_prefix() -> None:
    q = words.parse_query("direct")
    assert words.matches(q, "the Directors met")
    assert not words.matches(q, "indirect route")  # inside a word is not a prefix
    assert not words.matches(q, "dir")
    q = words.parse_query("dep FRI")
    assert words.matches(q, "deploy on Friday") and words.matches_all(q, "deploy on Friday")
    assert words.matches(q, "deployed") and not words.matches_all(q, "deployed")
    assert not words.matches(q, "nothing at all")
    assert words.matches_all(words.parse_query("ayse istanbul"), "Ayşe flew to İSTANBUL")


def test_query_limits() -> None:
    assert words.parse_query("The the THE cafe Café").words == ("the", "cafe")
    for bad in ("", "!!!", "x" * 513, " ".join(f"w{i}" for i in range(17)), 12, DELIMITER):
        with pytest.raises(words.BadWords):
            words.parse_query(bad)
    assert len(words.parse_query(" ".join(f"w{i}" for i in range(16))).words) == 16


# ---------------------------------------------------------------- scoring, against BM25 written out


_DF: dict[tuple, int] = {}


def _df(query: tuple, w: str, docs: list[list[str]]) -> int:
    key = (query, w, len(docs))
    if key not in _DF:
        _DF[key] = sum(1 for x in docs if any(t.startswith(w) for t in x))
    return _DF[key]


def bm25_oracle(query: list[str], docs: list[list[str]], d: int) -> float:
    """Okapi BM25 of document d, a term being 'a query word prefixes a distinct word of the document'."""
    n = len(docs)
    avg = sum(len(x) for x in docs) / n
    total = bound = 0.0
    for w in query:
        df = _df(tuple(query), w, docs)
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        tf = sum(1 for t in set(docs[d]) if t.startswith(w))
        total += idf * tf * 2.2 / (tf + 1.2 * (1 - 0.75 + 0.75 * len(docs[d]) / avg))
        bound += idf * 2.2
    return total / bound


def test_scores_are_bm25_plus_one_for_every_word() -> None:
    rng = random.Random(5)
    vocab = ["harbor", "harbour", "review", "priya", "moved", "the", "a", "tea", "deploy", "friday"]
    texts = [" ".join(rng.choice(vocab) for _ in range(rng.randint(1, 9))) for _ in range(300)]
    docs = [text.split() for text in texts]
    for query in (["priya", "harbo"], ["the", "review", "fri"], ["tea"]):
        ranked = words.rank(words.parse_query(" ".join(query)), enumerate(texts))
        assert ranked == sorted(ranked, reverse=True)
        got = dict((i, s) for s, i in ranked)
        for d in range(len(texts)):
            held = [any(t.startswith(w) for t in docs[d]) for w in query]
            if not any(held):
                assert d not in got
                continue
            want = bm25_oracle(query, docs, d) + (1 if all(held) else 0)
            assert abs(got[d] / words.SCALE - want) < 2e-6, (query, d)
            assert (got[d] >= words.SCALE) == all(held)


def test_ties_rank_newer_first() -> None:
    ranked = words.rank(words.parse_query("same"), [(i, "same text") for i in range(5)])
    assert [i for _, i in ranked] == [4, 3, 2, 1, 0]


def test_cursor_round_trip_and_refusals() -> None:
    q = words.parse_query("a b")
    c = words.Cursor(100, words.Stats(90, 700, (3, 40)), 1_234_567, 42)
    assert words.parse_cursor(c.text(), q) == c
    for bad in (
        "w1.100.90.700.3.1234567.42",
        "w2.100.90.700.3-40.1234567.42",
        "x",
        5,
        None,
        "w1.100.90.700.3-91.1234567.42",
        "w1.100.101.700.3-40.1234567.42",
        "w1.100.90.700.3-40.2000000.42",
    ):
        with pytest.raises(words.BadWords):
            words.parse_cursor(bad, q)


# ---------------------------------------------------------------- the index piece, against a brute-force scan


def test_a_piece_finds_exactly_the_memories_a_prefix_matches() -> None:
    rng = random.Random(7)
    syllables = ["ka", "ré", "İs", "ß", "mo", "Ｆ", "ệ", "ta", "ı", "x1", "9"]
    texts: list[str | None] = [
        " ".join("".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(0, 6)))
        for _ in range(300)
    ]
    for k in range(0, 300, 37):
        texts[k] = None  # erased
    idx = word_piece.PieceIndex(word_piece_write.build(texts))
    assert list(idx.lengths) == [0 if t is None else len(words.words(t)) for t in texts]
    held = [set(words.words(t)) if t is not None else set() for t in texts]
    prefixes = {w[:n] for ws in held for w in ws for n in (1, 2, 3)} | {"zz", "kaka", "9"}
    for p in sorted(prefixes):
        got = sorted(idx.positions(p.encode()))
        want = sorted(k for k, ws in enumerate(held) for w in ws if w.startswith(p))
        assert got == want, p
        assert idx.bits(p.encode()) == (sum(1 << k for k in set(want)), len(want)), p


def test_a_damaged_piece_is_refused() -> None:
    data = word_piece_write.build(["alpha beta", "gamma"])
    for bad in (b"", b"XX" + data[2:], data[:-1] + b"", data[:20]):
        with pytest.raises(word_piece.BadPiece):
            word_piece.PieceIndex(bad)
