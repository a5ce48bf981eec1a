"""The service's word search over a real store (stash/service/words_scan.py)
ranks exactly as the reference ranking of stash/core/words.py over the same
texts: across a complete piece of 4,096 memories, tail pieces of 512 and the
memories after them, from a cold index and a warm one, page by page, with
erased memories left out."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from stash.core import words
from stash.service import words_scan
from stash.service.access import Vault
from tests.helpers import CHEAP_KDF

VOCAB = ["deploy", "deployed", "dependency", "green", "the", "a", "zebra", "café", "CAFE", "İstanbul", "istanbul",
         "straße", "priya", "harbor", "review", "!!", "x1", "x12"]


def walk(mf, query: words.Query, part: int) -> list[tuple[int, int]]:
    got: list[tuple[int, int]] = []
    cursor = None
    while True:
        found = words_scan.search(mf, query, part, float("inf"), cursor)
        got += [(s, int(line.split(" ", 1)[0][1:])) for s, line in zip(found.scores, found.lines)]
        if found.more is None:
            return got
        cursor = found.more


@pytest.mark.slow
def test_the_store_ranks_as_the_reference_does(tmp_path: Path) -> None:
    rng = random.Random(3)
    texts = [" ".join(rng.choices(VOCAB, k=rng.randint(1, 7))) for _ in range(4096 + 512 + 300)]
    vault = Vault(tmp_path, CHEAP_KDF)
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        s.memory.mf.append([("2024-01-02", t) for t in texts])
        s.memory.mf.erase([7, 4500], "2024-01-03")
    live = [(i, t) for i, t in enumerate(texts) if i not in (7, 4500)]
    for n, q in enumerate(("zebra x1", "cafe istanbul", "priya harbor review", "strasse a dep")):
        query = words.parse_query(q)
        want = words.rank(query, live)
        assert len(want) > 300
        for attempt in ("cold", "warm")[: 2 if n == 0 else 1]:
            with vault.session(ident.token, "read") as s:
                assert walk(s.memory.mf, query, 40_000) == want, (q, attempt)
    with vault.session(ident.token, "read") as s:
        assert (tmp_path / "users" / ident.user_id / "recall.db").exists()
        words_scan.use_index(False)
        try:
            off = walk(s.memory.mf, words.parse_query("the zebra"), 100_000)
        finally:
            words_scan.use_index(True)
    assert off == words.rank(words.parse_query("the zebra"), live)


def test_a_piece_built_before_an_erasure_is_not_written_after_it(tmp_path: Path) -> None:
    """The race the write lock closes: a search builds a piece, an erasure of
    one of its memories commits, then the search stores what it built — it
    must write nothing (the piece holds the erased memory's words)."""
    from stash.core import word_piece
    from stash.storage.memfile import KEYS_PER_CHUNK
    from stash.storage.wordcache import WordCache

    vault = Vault(tmp_path, CHEAP_KDF)
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        s.memory.mf.append([("2024-01-02", f"secretword{i}") for i in range(4096)])
    with vault.session(ident.token, "read") as a:
        mf = a.memory.mf
        fk = mf.file_keys()
        cache = WordCache(mf.conn, fk.path.parent, mf.user_id, fk.rows_key, KEYS_PER_CHUNK, mf.erased_ids)
        assert list(cache.pieces(1)) == [(0, None)]
        built = {0: word_piece.build([f"secretword{i}" for i in range(4096)])}
        with vault.session(ident.token, "owner") as b:
            b.memory.mf.erase([5], "2024-01-03")
        cache.store(built)
        cache.close()
    import sqlite3
    with sqlite3.connect(tmp_path / "users" / ident.user_id / "recall.db") as db:
        assert db.execute("SELECT count(*) FROM word_cache").fetchone()[0] == 0


def test_a_search_past_its_time_bound_stops(tmp_path: Path) -> None:
    import time

    vault = Vault(tmp_path, CHEAP_KDF)
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        s.memory.mf.append([("2024-01-02", f"word {i}") for i in range(600)])
    with vault.session(ident.token, "read") as s:
        with pytest.raises(words_scan.TooSlow):
            words_scan.search(s.memory.mf, words.parse_query("word"), 1000, time.monotonic() - 1)
