"""The service's word search over a real store (stash/service/words_scan.py)
ranks exactly as the reference ranking of stash/core/words.py over the same
texts: across a complete piece of 4,096 memories, tail pieces of 512 and the
memories after them, from a cold index and a warm one, page by page, with
erased memories left out."""

from __future__ import annotations

import functools
import operator
import random
from pathlib import Path
from typing import Any

import pytest

from stash.core import words
from stash.service import words_scan
from stash.service.access import Vault
from tests.support.api import CHEAP_KDF

VOCAB = [
    "deploy",
    "deployed",
    "dependency",
    "green",
    "the",
    "a",
    "zebra",
    "café",
    "CAFE",
    "İstanbul",
    "istanbul",
    "straße",
    "priya",
    "harbor",
    "review",
    "!!",
    "x1",
    "x12",
]


def walk(mf, query: words.Query, part: int) -> list[tuple[int, int]]:
    got: list[tuple[int, int]] = []
    cursor = None
    while True:
        found = words_scan.search(mf, query, part, float("inf"), cursor)
        got += [(s, int(line.split(" ", 1)[0][1:])) for s, line in zip(found.scores, found.lines)]
        if found.more is None:
            return got
        cursor = found.more


def store(folder: Path, texts: list[str], erased: list[int]):
    """A real store of ``texts``, memories ``erased`` erased: its vault and owner."""
    vault = Vault(folder, CHEAP_KDF)
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        s.open_memory().mf.append([("2024-01-02", t) for t in texts])
        s.open_memory().mf.erase(erased, "2024-01-03")
    return vault, ident


@pytest.mark.slow
def test_the_store_ranks_as_the_reference_does(tmp_path: Path) -> None:
    rng = random.Random(3)
    texts = [" ".join(rng.choices(VOCAB, k=rng.randint(1, 7))) for _ in range(4096 + 512 + 300)]
    vault, ident = store(tmp_path, texts, [7, 4500])
    live = [(i, t) for i, t in enumerate(texts) if i not in (7, 4500)]
    for n, q in enumerate(("zebra x1", "cafe istanbul", "priya harbor review", "strasse a dep")):
        query = words.parse_query(q)
        want = words.rank(query, live)
        assert len(want) > 300
        for attempt in ("cold", "warm")[: 2 if n == 0 else 1]:
            with vault.session(ident.token, "read") as s:
                assert walk(s.open_memory().mf, query, 40_000) == want, (q, attempt)
    with vault.session(ident.token, "read") as s:
        assert (tmp_path / "users" / ident.user_id / "recall.db").exists()
        words_scan.use_index(False)
        try:
            off = walk(s.open_memory().mf, words.parse_query("the zebra"), 100_000)
        finally:
            words_scan.use_index(True)
    assert off == words.rank(words.parse_query("the zebra"), live)


def test_a_piece_built_before_an_erasure_is_not_written_after_it(tmp_path: Path) -> None:
    """The race the write lock closes: a search builds a piece, an erasure of
    one of its memories commits, then the search stores what it built — it
    must write nothing (the piece holds the erased memory's words)."""
    from stash.core import word_piece_write
    from stash.storage.memfile import KEYS_PER_CHUNK
    from stash.storage.recallcache.word_index import WordCache

    vault = Vault(tmp_path, CHEAP_KDF)
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        s.open_memory().mf.append([("2024-01-02", f"secretword{i}") for i in range(4096)])
    with vault.session(ident.token, "read") as a:
        mf = a.open_memory().mf
        fk = mf.file_keys()
        cache = WordCache(mf.conn, fk.path.parent, mf.user_id, fk.rows_key, KEYS_PER_CHUNK, mf.erased_ids)
        assert list(cache.segments(1, 0, [b"secretword"])) == [(0, None)]
        built = {0: word_piece_write.build([f"secretword{i}" for i in range(4096)])}
        with vault.session(ident.token, "owner") as b:
            b.open_memory().mf.erase([5], "2024-01-03")
        cache.store(built)
        cache.close()
    import sqlite3

    with sqlite3.connect(tmp_path / "users" / ident.user_id / "recall.db") as db:
        assert db.execute("SELECT count(*) FROM word_segs").fetchone()[0] == 0


def test_a_search_past_its_time_bound_stops(tmp_path: Path) -> None:
    import time

    vault = Vault(tmp_path, CHEAP_KDF)
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        s.open_memory().mf.append([("2024-01-02", f"word {i}") for i in range(600)])
    with vault.session(ident.token, "read") as s:
        with pytest.raises(words_scan.TooSlow):
            words_scan.search(s.open_memory().mf, words.parse_query("word"), 1000, time.monotonic() - 1)


def test_a_split_piece_holds_every_words_postings() -> None:
    """word_piece_write.split: each prefix of each word finds, in its head's
    segment (a prefix of one character: in all of them), the memories the
    whole piece gives it, as bits and as positions, and those are the
    memories whose text holds such a word (common words kept as bitmaps,
    rare ones as lists); segment 0 keeps every length and the piece's counts."""
    from stash.core import word_piece, word_piece_write

    rng = random.Random(8)
    texts = [
        None
        if rng.random() < 0.05
        else " ".join(
            rng.choices(VOCAB, k=rng.randint(0, 6))
            + [  # r<n>: rare
                f"r{rng.randrange(300)}"
            ]
            * rng.randint(0, 1)
        )
        for _ in range(700)
    ]
    whole = word_piece.PieceIndex(word_piece_write.build(texts))
    bucket: dict[bytes, int] = {}

    def of(ch: bytes) -> int:
        return bucket.setdefault(ch, rng.randrange(5))

    *parts, chars = [word_piece.PieceIndex(p) for p in word_piece_write.split(word_piece_write.build(texts), of, 5)]
    stats = parts[0]
    assert (stats.held, stats.words, list(stats.lengths)) == (whole.held, whole.words, list(whole.lengths))
    assert sum(len(p.at) for p in parts[1:]) == len(whole.at) and not any(len(p.lengths) for p in parts[1:])
    asked = {w[:n] for text in texts if text for w in words.words(text) for n in range(1, len(w) + 1)}
    forms = set()
    held = [set(words.words(t)) if t else set() for t in texts]
    for w in sorted(asked) + ["q", "zz", "é"]:
        key = w.encode()
        holders = [{m for m in ws if m.startswith(w)} for ws in held]
        want = (sum(1 << k for k, h in enumerate(holders) if h), sum(len(h) for h in holders))
        assert whole.bits(key) == want, w
        assert sorted(whole.positions(key)) == [k for k, h in enumerate(holders) for _ in h], w
        if word_piece.one_char(key):  # the last segment: layer t - 1 holds the memories of t or more such words
            most = max(map(len, holders))
            assert chars.char_layers(key) == [
                sum(1 << k for k, h in enumerate(holders) if len(h) >= t) for t in range(1, most + 1)
            ], w
        looked = parts[1:] if word_piece.one_char(key) else [parts[1 + of(word_piece.head(key))]]
        got = [p.bits(key) for p in looked]
        assert (functools.reduce(operator.or_, (b for b, _ in got)), sum(n for _, n in got)) == want, w
        lo, hi = whole.run(key)
        forms |= {whole.starts[i + 1] - whole.starts[i] == whole.units for i in range(lo, hi)}
    assert forms == {True, False}  # both forms of postings were read


@pytest.fixture(scope="module")
def life(tmp_path_factory: pytest.TempPathFactory):
    """A random life of a complete piece, a tail piece and 150 memories after
    them, two of them erased."""
    tmp = tmp_path_factory.mktemp("life")
    rng = random.Random(29)
    vocab = VOCAB + [f"w{n}" for n in range(60)]
    texts = [" ".join(rng.choices(vocab, k=rng.randint(1, 9))) for _ in range(4096 + 512 + 150)]
    vault, ident = store(tmp, texts, [11, 4200])
    return vault, ident, tmp / "users" / ident.user_id / "recall.db"


def pages(mf, q: str, part: int, cached: bool, most: int = 10**9) -> list[tuple[list[str], list[int], int, str | None]]:
    """Every page of a words search (or the first ``most``): lines, scores, total and the cursor."""
    query, cursor, out = words.parse_query(q), None, list[tuple[Any, ...]]()
    while len(out) < most:
        f = words_scan.search(mf, query, part, float("inf"), cursor, cached=cached)
        out.append((f.lines, f.scores, f.total, f.more.text() if f.more else None))
        if f.more is None:
            return out
        cursor = f.more
    return out


LIFE_QUERIES = ("w1 the", "d", "İ x1 harbor w33")


@pytest.mark.slow
def test_the_index_answers_byte_for_byte_as_the_log_does(life) -> None:
    """The sealed segments (cold: built and written; warm: opened) give the
    same pages as `--word-index off`, which builds every piece from the log."""
    vault, ident, db = life
    with vault.session(ident.token, "read") as s:
        mf = s.open_memory().mf
        for q in LIFE_QUERIES:
            off = pages(mf, q, 20_000, cached=False)
            assert len(off) > 1, q
            assert pages(mf, q, 20_000, cached=True) == off, q
            assert pages(mf, q, 20_000, cached=True) == off, q
        # pages of a few lines: the memories holding both words fill the first ones alone
        off = pages(mf, "the a", 150, cached=False, most=4)
        assert len(off) == 4 and all(len(lines) > 1 for lines, *_ in off)
        assert pages(mf, "the a", 150, cached=True, most=4) == off
    import sqlite3

    from stash.storage.recallcache.word_index import CHARS

    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM word_segs").fetchone()[0] == CHARS + 1
        assert conn.execute("SELECT count(*) FROM word_tail_segs").fetchone()[0] == CHARS + 1


def test_a_search_opens_only_its_words_segments(life) -> None:
    """With every other word segment deleted, a search is still served from
    the index (nothing is rebuilt); a segment moved to another number does
    not open, and its piece is rebuilt from the log, answering the same."""
    import sqlite3

    from stash.storage.memfile import KEYS_PER_CHUNK
    from stash.storage.recallcache.word_index import CHARS, WordCache

    vault, ident, db = life
    with vault.session(ident.token, "read") as s:
        mf = s.open_memory().mf
        fk = mf.file_keys()
        cache = WordCache(mf.conn, fk.path.parent, mf.user_id, fk.rows_key, KEYS_PER_CHUNK, mf.erased_ids)
        keep = {0, cache.bucket(b"w1"), cache.bucket(b"the")}  # the heads "w1" and "th"
        # a word of another segment (the segments are keyed by the file's own key)
        word = next(
            w
            for w in ("zebra", "priya", "harbor", "review", "a", "deploy", "green")
            if cache.bucket(w.encode()) not in keep
        )
        other = cache.bucket(word.encode())
        want = {q: pages(mf, q, 20_000, cached=False) for q in ("w1 the", word)}
        assert pages(mf, "w1 the", 20_000, cached=True) == want["w1 the"]  # the index is there
        with sqlite3.connect(db) as conn:
            marks = ",".join("?" * len(keep))
            conn.execute(f"DELETE FROM word_segs WHERE seg NOT IN ({marks})", sorted(keep))
        assert pages(mf, "w1 the", 20_000, cached=True) == want["w1 the"]
        with sqlite3.connect(db) as conn:
            assert {r[0] for r in conn.execute("SELECT seg FROM word_segs")} == keep  # nothing rebuilt
            # the word's segment: the one of w1, moved into its number
            sealed = conn.execute("SELECT sealed FROM word_segs WHERE seg = ?", (cache.bucket(b"w1"),)).fetchone()[0]
            conn.execute("INSERT INTO word_segs VALUES (0, ?, ?)", (other, sealed))
        assert pages(mf, word, 20_000, cached=True) == want[word]
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM word_segs").fetchone()[0] == CHARS + 1  # rebuilt whole
            assert conn.execute("SELECT sealed FROM word_segs WHERE seg = ?", (other,)).fetchone()[0] != sealed
        assert pages(mf, "w1 the", 20_000, cached=True) == want["w1 the"]
        # one character: served by segment 0, the segment of first characters and that of its stem "w"
        want_w = pages(mf, "w", 20_000, cached=False)
        kept = {0, CHARS, cache.bucket(b"w")}
        with sqlite3.connect(db) as conn:
            conn.execute("DELETE FROM word_segs WHERE seg NOT IN (?, ?, ?)", (0, CHARS, cache.bucket(b"w")))
        assert pages(mf, "w", 20_000, cached=True) == want_w
        with sqlite3.connect(db) as conn:
            assert {r[0] for r in conn.execute("SELECT seg FROM word_segs")} == kept  # nothing rebuilt


def test_first_characters_are_not_kept_when_they_outweigh_the_piece() -> None:
    """Memories crafted to hold many words of many first characters would
    make the segment of first characters (a bitmap of the piece per layer)
    far larger than the piece: it keeps none then (held 0), and is kept
    (held 1, each layer as the definition gives it) for ordinary text."""
    from stash.core import word_piece, word_piece_write

    crafted = [" ".join(chr(0x4E00 + m) + chr(0x61 + i % 26) + str(i) for i in range(40)) for m in range(64)]
    texts = crafted + [None] * 4032
    chars = word_piece.PieceIndex(word_piece_write.split(word_piece_write.build(texts), lambda ch: 0, 1)[-1])
    assert (chars.held, len(chars.at)) == (0, 0)
    plain = ["deploy green docs", "docs dog", None, "green"]
    chars = word_piece.PieceIndex(word_piece_write.split(word_piece_write.build(plain), lambda ch: 0, 1)[-1])
    assert chars.held == 1
    assert chars.char_layers(b"d") == [0b11, 0b11] and chars.char_layers(b"g") == [0b1001]
