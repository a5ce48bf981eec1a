"""stash/core/words_top.py: the best matches counted from bitmaps are the
best matches of a brute-force ranking of every memory, page after page."""

from __future__ import annotations

import random

from stash.core import words, words_top


def brute(pieces, score) -> list[tuple[int, int]]:
    out = []
    for base, bits, lengths in pieces:
        for k, length in enumerate(lengths):
            mask = sum(1 << j for j, b in enumerate(bits) if b >> k & 1)
            if mask:
                out.append((score(mask, length), base + k))
    return sorted(out, reverse=True)


def life(rng: random.Random, k: int) -> list[words_top.Piece]:
    pieces, base = [], 0
    for size in (37, 512, 300, 1000):
        lengths = bytes(rng.randint(1, 12) for _ in range(size))
        bits = [sum(1 << i for i in range(size) if rng.random() < p) for p in (0.6, 0.3, 0.05, 0.5)[:k]]
        pieces.append((base, bits, lengths))
        base += size + rng.randint(0, 50)
    return pieces[::-1]  # newest first


def test_pages_of_the_best_are_the_brute_force_ranking() -> None:
    rng = random.Random(29)
    stats = words.Stats(2000, 12000, (1100, 600, 90, 1000))
    weights = stats.weights()
    scorers = {
        "bm25": lambda m, n: words.score(stats, weights[:4], [m >> j & 1 for j in range(4)], n),
        "ties": lambda m, n: 1 + 50 * bin(m).count("1") - n // 4,  # many ties, across masks and lengths
    }
    for k in (1, 2, 4):
        pieces = life(rng, k)
        for name, score in scorers.items():
            want = brute(pieces, score)
            for n in (1, 5000):  # the first page
                assert words_top.top(pieces, k, score, None, n) == want[:n], (k, name, n)
            got, after = [], None
            while True:  # every page, each after the last one shown
                page = words_top.top(pieces, k, score, after, 151)
                assert page == [x for x in want if after is None or x < after][:151], (k, name)
                got += page
                if len(page) < 151:
                    break
                after = page[-1]
            assert got == want, (k, name)


def test_spread_gives_one_byte_a_memory() -> None:
    bits = 0b1011 | 1 << 70
    assert words_top.spread(bits, 75) == bytes(0xFF if bits >> i & 1 else 0 for i in range(75))
