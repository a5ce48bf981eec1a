"""Stems in word search (stash/core/words.py, word_piece.py; docs/DESIGN.md,
"Word search"), against an oracle written here from the definition and
sharing no code with it but the folding (tested on its own in test_words.py)
and the Snowball stemmers themselves:

* a word's form is the run of the text it folds from (a maximal run of
  characters that fold to letters or digits, or to nothing), or the word
  itself when its run folds to several words;
* its stems: each stemmer on the form composed, lowercased with İ to i,
  the stem then folded;
* a query word matches a memory word when its folded form prefixes it or
  they have an equal stem of one language; a memory word counts once.
"""

from __future__ import annotations

import math
import random
import sys
import unicodedata

import pytest
import Stemmer

from stash.core import word_piece, word_piece_write, words

EN, TR = Stemmer.Stemmer("english"), Stemmer.Stemmer("turkish")


# ---------------------------------------------------------------- the oracle


def _alnum_runs(text: str) -> list[str]:
    out, cur = [], ""
    for c in text:
        if c.isalnum():
            cur += c
        else:
            if cur:
                out.append(cur)
            cur = ""
    return out + ([cur] if cur else [])


def oracle_forms(text: str) -> list[tuple[str, str]]:
    """(folded word, its form lowered), character by character."""
    runs, cur = [], ""
    for c in text:
        f = words.fold(c)
        if f == "" or any(x.isalnum() for x in f):
            cur += c
        else:
            if cur:
                runs.append(cur)
            cur = ""
    if cur:
        runs.append(cur)
    out = []
    for run in runs:
        folded = words.fold(run)
        ws = _alnum_runs(folded)
        if ws == [folded]:
            out.append((folded, unicodedata.normalize("NFC", run).lower().replace("i\u0307", "i")))
        else:
            out += [(w, w) for w in ws]
    return out


def oracle_stems(text: str) -> dict[str, set[tuple[str, str]]]:
    out: dict[str, set[tuple[str, str]]] = {}
    for w, low in oracle_forms(text):
        got = out.setdefault(w, set())
        for code, stemmer in (("e", EN), ("t", TR)):
            st = words.fold(stemmer.stemWord(low))
            if st:
                got.add((code, st))
    return out


def oracle_tf(query: str, text: str) -> list[int]:
    asked = oracle_stems(query)
    held = oracle_stems(text)
    return [sum(1 for m, st in held.items() if m.startswith(q) or st & qs) for q, qs in asked.items()]


# ---------------------------------------------------------------- forms


TRICKY = [
    "Ağaçlar",
    "İSTANBUL'da",
    "EVLERİMİZDEN",
    "e\u0301te\u0301",
    "café",
    "Straße",
    "ＦＵＬＬ",
    "ﬁne",
    "x²",
    "½",
    "a℃b",
    "ⓐb",
    "ﰠ",
    "\ufe70",
    "ﷺ",
    "😀",
    "moving",
    "Moved",
    "—",
    "_",
    " ",
    "\u0301",
    "ı",
    "ǅungla",
    "٣",
    "Tiếng",
    "Việt",
    "\ufe7e",
    "ab\u0345",
    "ﾞ",
]


def test_forms_follow_the_definition() -> None:
    rng = random.Random(11)
    texts = TRICKY + ["Caroline: we're moving next month", "Ayşe evlerimizden birini sattı"]
    texts += ["".join(rng.choice(TRICKY + [" ", "", "-"]) for _ in range(rng.randint(1, 8))) for _ in range(3000)]
    for text in texts:
        got = words.forms(text)
        assert got == oracle_forms(text), text
        assert [w for w, _ in got] == words.words(text), text


def test_every_character_of_empty_folding_is_a_letter_digit_or_mark() -> None:
    """What lets forms() take most text by one regular expression of
    letters, digits and marks: a character folding to nothing is one of
    those (so no such run is cut where a form is not)."""
    for cp in range(sys.maxunicode + 1):
        c = chr(cp)
        if not 0xD800 <= cp < 0xE000 and words.fold(c) == "":
            assert c.isalnum() or unicodedata.category(c)[0] == "M", hex(cp)


# ---------------------------------------------------------------- matching


MATCHES = [
    # (query, memory text, term frequency of each query word): hand-checked against the stemmers
    ("moved", "Caroline: we're moving next month", [1]),  # English stems: move, move
    ("adoption", "they adopted a cat", [1]),  # adopt, adopt
    ("researched", "still researching it", [1]),
    ("evlerimizden", "ev", [1]),  # Turkish stems: ev, ev
    ("ev", "evlerimizden", [1]),  # a prefix
    ("ağaçlar", "bir ağaç", [1]),  # stemmed unfolded: ağaç, ağaç
    ("EVLERİMİZDEN", "ev", [1]),  # İ lowercased to i: the suffixes come off
    ("kitabı", "KİTAPLARIMIZI okudu", [1]),  # kitap, kitap
    ("dying", "he dies", [1]),  # die, die: heads apart
    ("moving", "the movement", [0]),  # stems move / movement: a stem is not a prefix
    ("move", "it moves", [1]),  # prefix and stem: one word, once
    ("move", "moves moving moved moved", [3]),  # three words, each once
    ("moving", "Moving MOVED moving", [2]),
    ("arabalarımız", "araba", [0]),  # Turkish stems araba / arap: no match, nor a prefix
    ("moved adoption", "moving on", [1, 0]),
]


@pytest.mark.parametrize("query, text, tfs", MATCHES)
def test_matching_by_prefix_or_stem(query: str, text: str, tfs: list[int]) -> None:
    assert oracle_tf(query, text) == tfs  # the oracle agrees with the hand-checked table
    assert words.frequencies(words.parse_query(query), words.stemmed(words.forms(text))) == tfs


def test_erasure_matches_prefixes_alone() -> None:
    q = words.parse_query("moved")
    assert not words.matches(q, "we are moving") and not words.matches_all(q, "we are moving")
    assert words.matches_all(q, "she moved out")
    assert words.frequencies(q, words.stemmed(words.forms("we are moving"))) == [1]


VOCAB = [
    "move",
    "moved",
    "Moving",
    "moves",
    "movement",
    "adopt",
    "adopted",
    "adoption",
    "research",
    "researching",
    "dies",
    "dying",
    "died",
    "lie",
    "lying",
    "ev",
    "evi",
    "evlerimizden",
    "EVLERİMİZDEN",
    "ağaç",
    "ağaçlar",
    "agac",
    "kitap",
    "kitabı",
    "KİTAPLAR",
    "araba",
    "arabalarımız",
    "İstanbul",
    "istanbul'da",
    "the",
    "a",
    "café",
    "cafes",
    "Straße",
    "strasse",
    "½",
    "x1",
    "tests",
    "testing",
    "test",
]


def texts_of(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choices(VOCAB, k=rng.randint(1, 7))) for _ in range(n)]


def test_frequencies_agree_with_the_oracle() -> None:
    rng = random.Random(43)
    texts = texts_of(rng, 400)
    for _ in range(300):
        q = " ".join(rng.sample(VOCAB, rng.randint(1, 4)))
        query = words.parse_query(q)
        for text in rng.sample(texts, 20):
            assert words.frequencies(query, words.stemmed(words.forms(text))) == oracle_tf(q, text), (q, text)


def oracle_rank(query: str, texts: list[str]) -> dict[int, float]:
    """BM25 plus 1 for every word, a term being 'a distinct memory word the query word matches'."""
    docs = [words.words(t) for t in texts]
    tfs = [oracle_tf(query, t) for t in texts]
    k = len(tfs[0])
    n = sum(1 for d in docs if d)
    avg = sum(map(len, docs)) / n
    dfs = [sum(1 for tf in tfs if tf[j]) for j in range(k)]
    idf = [math.log(1 + (n - df + 0.5) / (df + 0.5)) for df in dfs]
    out = {}
    for d, tf in enumerate(tfs):
        if any(tf):
            norm = 1.2 * (1 - 0.75 + 0.75 * len(docs[d]) / avg)
            total = sum(w * t * 2.2 / (t + norm) for w, t in zip(idf, tf))
            out[d] = total / (sum(idf) * 2.2) + (1 if all(tf) else 0)
    return out


def test_the_reference_ranking_agrees_with_the_oracle() -> None:
    rng = random.Random(44)
    texts = texts_of(rng, 300)
    for q in ("moved", "dying adoption", "evlerimizden kitabı the", "ağaçlar Moving", "movement tests"):
        want = oracle_rank(q, texts)
        got = words.rank(words.parse_query(q), enumerate(texts))
        assert {i for _, i in got} == set(want), q
        for s, i in got:
            assert abs(s / words.SCALE - want[i]) < 2e-6, (q, i)


# ---------------------------------------------------------------- the ranking's order


def test_a_prefix_match_never_weighs_less_than_a_stem_match() -> None:
    """Two memories alike but for one word, the query's own form against
    another form of it: the first never scores less; and a word matched
    both ways counts once, as much as a word matched one way."""
    rng = random.Random(45)
    pairs = [
        ("moved", "moving"),
        ("adoption", "adopted"),
        ("evlerimizden", "evi"),
        ("kitabı", "kitaplar"),
        ("dying", "dies"),
    ]
    for asked, other in pairs:
        fill = texts_of(rng, 60)
        for extra in ("", " the research", " a café"):
            texts = fill + [asked + extra, other + extra]
            ranked = dict((i, s) for s, i in words.rank(words.parse_query(asked), enumerate(texts)))
            assert ranked[60] >= ranked[61] > 0, (asked, other, extra)
    texts = ["it moves", "moved along", "moves and moved"]
    ranked = dict((i, s) for s, i in words.rank(words.parse_query("move"), enumerate(texts)))
    assert ranked[0] == ranked[1] < ranked[2]  # "moves" by prefix and stem is one word, as "moved" is


def test_every_word_counts_with_stems_as_with_prefixes() -> None:
    texts = ["Caroline is moving house", "Caroline likes tea", "moving day", "house party"]
    ranked = words.rank(words.parse_query("when did caroline move houses"), enumerate(texts))
    assert [i for _, i in ranked][:1] == [0]
    assert all(s < words.SCALE for s, _ in ranked)  # none holds "when" or "did"
    ranked = words.rank(words.parse_query("caroline moved houses"), enumerate(texts))
    assert ranked[0][1] == 0 and ranked[0][0] >= words.SCALE > ranked[1][0]
    assert [s for s, _ in ranked] == sorted((s for s, _ in ranked), reverse=True)


# ---------------------------------------------------------------- the index piece


def piece_tf(idx: word_piece.PieceIndex, query: words.Query, j: int, n: int) -> list[int]:
    """Query word j's term frequency in each of n memories, read from a whole piece."""
    key = query.words[j].encode()
    counts = [0] * n
    seen = set()
    for w in range(*idx.run(key)):
        seen.add(idx.word(w))
    for code, st in query.stems[j]:
        for w in idx.mates(code, st.encode()):
            seen.add(idx.word(w))
    for word in seen:
        for k in _holders(idx, word):
            counts[k] += 1
    return counts


def _holders(idx: word_piece.PieceIndex, word: bytes) -> list[int]:
    w = next(i for i in range(*idx.run(word)) if idx.word(i) == word)
    bitmaps: list[int] = []
    lists: list = []
    idx.add_postings(w, bitmaps, lists)
    return [k for b in bitmaps for k in range(b.bit_length()) if b >> k & 1] + [k for got in lists for k in got]


def test_a_piece_and_its_segments_find_every_stem_mate() -> None:
    """In a whole piece, and in the segment of each stem's head after a
    split (a word whose head is in another segment copied there, as
    "dying" for "die"), the words having a stem are those the oracle says,
    with the same postings."""
    rng = random.Random(46)
    texts: list[str | None] = [None if rng.random() < 0.05 else t for t in texts_of(rng, 700)]
    whole = word_piece.PieceIndex(word_piece_write.build(texts))
    held = [oracle_stems(t) if t else {} for t in texts]
    asked = ["moved", "dying", "died", "evlerimizden", "kitabı", "ağaçlar", "adoption", "a", "lies", "cafe"]
    for q in asked:
        query = words.parse_query(q)
        want = [oracle_tf(q, t)[0] if t else 0 for t in texts]
        assert piece_tf(whole, query, 0, len(texts)) == want, q
    copied = 0
    for seed in range(3):
        pick = random.Random(seed)
        bucket: dict[bytes, int] = {}

        def of(ch: bytes, bucket=bucket, pick=pick) -> int:
            return bucket.setdefault(ch, pick.randrange(6))

        parts = [word_piece.PieceIndex(p) for p in word_piece_write.split(word_piece_write.build(texts), of, 6)]
        for q in asked:
            for code, st in words.parse_query(q).stems[0]:
                key = st.encode()
                seg = parts[1 + of(word_piece.head(key))]
                mates = {seg.word(w) for w in seg.mates(code, key)}
                assert mates == {w.encode() for k, got in enumerate(held) for w, s in got.items() if (code, st) in s}, (
                    q,
                    code,
                )
                assert mates == {whole.word(w) for w in whole.mates(code, key)}
                for word in mates:
                    assert sorted(_holders(seg, word)) == sorted(_holders(whole, word)), word
                    copied += of(word_piece.head(word)) != of(word_piece.head(key))
    assert copied, "no stem mate lived in another segment: the copies went untested"
