"""stash/core/words_top.py: the best matches counted from bitmaps are the
best matches of a brute-force ranking of every memory, page after page."""

from __future__ import annotations

import random

from stash.core import words, words_best, words_top
from tests.support.ranking import brute, every_page, life


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
                assert words_best.best(pieces, k, score, None, n) == want[:n], (k, name, n)
            every_page(words_top.top_coded, pieces, k, score, want, 301)
    assert words_top.top_coded(life(rng, 16, 2), 16, scorers["ties"], None, 5) is None  # 3**16 classes


def test_ones_lists_the_set_bits_of_sparse_and_dense_bitmaps() -> None:
    rng = random.Random(3)
    for _ in range(400):
        size, density = rng.randint(0, 5000), rng.random() ** 3
        bits = sum(1 << i for i in range(size) if rng.random() < density)
        assert words_top.ones(bits) == [i for i in range(bits.bit_length()) if bits >> i & 1]
