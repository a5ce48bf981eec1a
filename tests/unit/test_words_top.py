"""stash/core/words_top.py: the best matches counted from bitmaps are the
best matches of a brute-force ranking of every memory, page after page."""

from __future__ import annotations

import random

from stash.core import words, words_top


def brute(pieces, score) -> list[tuple[int, int]]:
    out = []
    for base, layers, lengths in pieces:
        for k, length in enumerate(lengths):
            tfs = tuple(sum(lay >> k & 1 for lay in word) for word in layers)
            if any(tfs):
                out.append((score(tfs, length), base + k))
    return sorted(out, reverse=True)


def every_page(rank, pieces, k, score, want, n) -> None:
    """Every page of ``n`` by ``rank``, each after the last one shown, is the brute-force ranking's."""
    got, after = [], None
    while True:
        page = rank(pieces, k, score, after, n)
        assert page == [x for x in want if after is None or x < after][:n], (k, n)
        got += page
        if len(page) < n:
            break
        after = page[-1]
    assert got == want, (k, n)


def life(rng: random.Random, k: int, most: int) -> list[words_top.Piece]:
    """Pieces of random frequencies (0 to ``most``) of ``k`` words, newest first."""
    pieces, base = [], 0
    for size in (37, 512, 300, 1000):
        lengths = bytes(rng.randint(1, 12) for _ in range(size))
        counts = [bytes(min(most, int(rng.random() < p) * rng.choice((1, 1, 1, 2, 3))) for _ in range(size))
                  for p in (0.6, 0.3, 0.05, 0.5, 0.2, 0.7, 0.1, 0.4, 0.25, 0.02, 0.35, 0.15, 0.45, 0.08, 0.3, 0.5)[:k]]
        pieces.append((base, [words_top.layers(c) for c in counts], lengths))
        base += size + rng.randint(0, 50)
    return pieces[::-1]


def test_pages_of_the_best_are_the_brute_force_ranking() -> None:
    rng = random.Random(29)
    stats = words.Stats(2000, 12000, (1100, 600, 90, 1000, 400, 1300, 200, 800, 500, 40))
    weights = stats.weights()
    scorers = {
        "bm25": lambda tfs, n: words.score(stats, weights[: len(tfs)], tfs, n),
        "ties": lambda tfs, n: 1 + 50 * sum(tfs) - n // 4,  # many ties, across classes and lengths
    }
    for k, most in ((1, 1), (2, 1), (4, 1), (3, 3), (10, 1)):
        pieces = life(rng, k, most)
        for name, score in scorers.items():
            want = brute(pieces, score)
            for n in (1, 5000):  # the first page
                assert words_top.top(pieces, k, score, None, n) == want[:n], (k, name, n)
            if k > 4:
                continue  # 1,023 classes: the first pages are enough
            every_page(words_top.top, pieces, k, score, want, 151)


def test_layers_and_spread_give_one_byte_a_memory() -> None:
    bits = 0b1011 | 1 << 70
    assert words_top.spread(bits, 75) == bytes(0xFF if bits >> i & 1 else 0 for i in range(75))
    counts = bytes([0, 3, 1, 0, 2] * 9)
    assert words_top.layers(counts) == [sum(1 << i for i, c in enumerate(counts) if c >= t) for t in (1, 2, 3)]
    more = bytes([2, 0, 1, 1, 4] * 9)
    summed = bytes(a + b for a, b in zip(counts, more))
    assert words_top.merge(words_top.layers(counts), words_top.layers(more)) == words_top.layers(summed)
    assert words_top.merge([], words_top.layers(more)) == words_top.layers(more)
    assert words_top.top([(0, [[1]] * 11, b"\x01")], 11, lambda tfs, n: 1, None, 5) is None  # too many classes


def test_classes_counted_at_once_are_the_brute_force_ranking() -> None:
    """top_coded, over many classes (12 words; 3 words of frequencies up to
    3), against the brute-force ranking: first pages and every page."""
    rng = random.Random(31)
    dfs = (1100, 600, 90, 1000, 400, 1300, 200, 800, 500, 40, 700, 300)
    stats = words.Stats(2000, 12000, dfs)
    weights = stats.weights()
    scorers = {
        "bm25": lambda tfs, n: words.score(stats, weights[: len(tfs)], tfs, n),
        "ties": lambda tfs, n: 1 + 50 * sum(tfs) - n // 4,
    }
    for k, most in ((2, 1), (3, 3), (5, 1), (12, 1)):
        pieces = life(rng, k, most)
        for name, score in scorers.items():
            want = brute(pieces, score)
            for n in (1, 5000):
                assert words_top.top_coded(pieces, k, score, None, n) == want[:n], (k, name, n)
                assert words_top.best(pieces, k, score, None, n) == want[:n], (k, name, n)
            every_page(words_top.top_coded, pieces, k, score, want, 301)
    assert words_top.top_coded(life(rng, 16, 2), 16, scorers["ties"], None, 5) is None  # 3**16 classes


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


def test_pages_scored_from_the_memories_holding_most_words_are_the_brute_force_ranking(monkeypatch) -> None:
    """top_pruned against the brute-force ranking, first pages and every
    page, small pages (which it prunes most) and large; when it gives up
    (a page that needs more memories than PRUNED_MOST), best() still gives
    the same answer through top_coded."""
    rng = random.Random(33)
    dfs = (1100, 600, 90, 1000, 400, 1300, 200, 800, 500, 40, 700, 300)
    for k, most in ((5, 1), (9, 1), (12, 1), (6, 3)):
        score, reach = _bm25(dfs[:k])
        ties = (lambda tfs, n: 1 + 50 * sum(tfs) - n // 4,
                lambda h, n, tops: 1 + 50 * sum(sorted(tops, reverse=True)[:h]) - n // 4)
        pieces = life(rng, k, most)
        for sc, re in ((score, reach), ties):
            want = brute(pieces, sc)
            for n in (1, 7, 60, 5000):
                assert words_top.top_pruned(pieces, k, sc, re, None, n) == want[:n], (k, n)
            every_page(lambda p, kk, s, after, n, re=re: words_top.top_pruned(p, kk, s, re, after, n), pieces, k, sc,
                       want, 41)
    monkeypatch.setattr(words_top, "PRUNED_MOST", 10)
    score, reach = _bm25(dfs[:9])
    pieces = life(rng, 9, 1)
    want = brute(pieces, score)
    assert words_top.top_pruned(pieces, 9, score, reach, None, 60) is None
    assert words_top.best(pieces, 9, score, None, 60, reach=reach) == want[:60]


def test_count_planes_count_the_words_each_memory_holds() -> None:
    rng = random.Random(5)
    for k in (1, 3, 7, 16):
        size = 300
        held = [[rng.random() < 0.4 for _ in range(size)] for _ in range(k)]
        word_layers = [[sum(1 << i for i, h in enumerate(row) if h)] for row in held]
        planes = words_top._count_planes(word_layers)
        full = (1 << size) - 1
        for i in range(size):
            count = sum(row[i] for row in held)
            assert sum((p >> i & 1) << b for b, p in enumerate(planes)) == count
            for c in range(k + 2):
                assert (words_top._holding(planes, c, full) >> i & 1) == (count >= c), (k, i, c)


def test_ones_lists_the_set_bits_of_sparse_and_dense_bitmaps() -> None:
    rng = random.Random(3)
    for _ in range(400):
        size, density = rng.randint(0, 5000), rng.random() ** 3
        bits = sum(1 << i for i in range(size) if rng.random() < density)
        assert words_top.ones(bits) == [i for i in range(bits.bit_length()) if bits >> i & 1]
