"""stash/core/words_best.py: the pages scored from the memories that can
reach them are the pages of a brute-force ranking of every memory."""

from __future__ import annotations

import random

import pytest

from stash.core import words, words_best
from tests.support.ranking import brute, every_page, life

DFS = (1100, 600, 90, 1000, 400, 1300, 200, 800, 500, 40, 700, 300)


def _bm25(dfs: tuple[int, ...]):
    from stash.service.words_scan import _Scorer

    stats = words.Stats(2000, 12000, dfs)
    scorer = _Scorer(stats, stats.weights())
    return scorer.of_class, scorer.reach


def test_the_reach_of_fewer_words_bounds_every_score_below_it() -> None:
    """_Scorer.reach, the bound top_pruned leans on, against words.score of
    random memories holding at most that many words, at most that often,
    of at least that length."""
    rng = random.Random(7)
    score, reach = _bm25((1100, 600, 90, 1000, 400, 1300, 200, 800, 500))
    for _ in range(3000):
        tops = [rng.randint(0, 3) for _ in range(9)]
        held, length = rng.randint(1, 8), rng.randint(1, 40)
        tfs = [rng.randint(1, t) if t else 0 for t in tops]
        for j in rng.sample(range(9), 9)[held:]:
            tfs[j] = 0
        if any(tfs):
            assert score(tuple(tfs), length + rng.randint(0, 20)) <= reach(held, length, tops)
        assert reach(held, length, tops) < words.SCALE


@pytest.mark.parametrize(("k", "most"), [(5, 1), (9, 1), (12, 1), (6, 3)])
def test_pages_scored_from_the_memories_holding_most_words_are_the_brute_force_ranking(k: int, most: int) -> None:
    """top_pruned against the brute-force ranking: first pages small (which
    it prunes most) and large, the first pages of 41 each after the last,
    and every page of 301."""
    rng = random.Random(33 + k)
    score, reach = _bm25(DFS[:k])
    ties = (
        lambda tfs, n: 1 + 50 * sum(tfs) - n // 4,  # many ties, across classes and lengths
        lambda h, n, tops: 1 + 50 * sum(sorted(tops, reverse=True)[:h]) - n // 4,
    )
    pieces = life(rng, k, most)
    for sc, re in ((score, reach), ties):
        want = brute(pieces, sc)
        for n in (1, 7, 60, 5000):
            assert words_best.top_pruned(pieces, k, sc, re, None, n) == want[:n], (k, n)
        after = None
        for _ in range(6):
            page = words_best.top_pruned(pieces, k, sc, re, after, 41)
            assert page == [x for x in want if after is None or x < after][:41]
            after = page[-1]
        every_page(
            lambda p, kk, s, after, n, re=re: words_best.top_pruned(p, kk, s, re, after, n), pieces, k, sc, want, 301
        )


def test_a_page_that_needs_too_many_memories_is_counted_whole(monkeypatch) -> None:
    """Past PRUNED_MOST memories to score, top_pruned gives up and best()
    gives the same answer through top_coded."""
    monkeypatch.setattr(words_best, "PRUNED_MOST", 10)
    score, reach = _bm25(DFS[:9])
    pieces = life(random.Random(9), 9, 1)
    want = brute(pieces, score)
    assert words_best.top_pruned(pieces, 9, score, reach, None, 60) is None
    assert words_best.best(pieces, 9, score, None, 60, reach=reach) == want[:60]


def test_count_planes_count_the_words_each_memory_holds() -> None:
    rng = random.Random(5)
    for k in (1, 3, 7, 16):
        size = 300
        held = [[rng.random() < 0.4 for _ in range(size)] for _ in range(k)]
        word_layers = [[sum(1 << i for i, h in enumerate(row) if h)] for row in held]
        planes = words_best._count_planes(word_layers)
        full = (1 << size) - 1
        for i in range(size):
            count = sum(row[i] for row in held)
            assert sum((p >> i & 1) << b for b, p in enumerate(planes)) == count
            for c in range(k + 2):
                assert (words_best._holding(planes, c, full) >> i & 1) == (count >= c), (k, i, c)
