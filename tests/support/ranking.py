"""What the tests of the words rankings share: random pieces of memories,
the brute-force ranking of every memory, and a walk over every page."""

from __future__ import annotations

import random

from stash.core import words_top


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
    pieces: list[words_top.Piece] = []
    base = 0
    for size in (37, 512, 300, 1000):
        lengths = bytes(rng.randint(1, 12) for _ in range(size))
        counts = [
            bytes(min(most, int(rng.random() < p) * rng.choice((1, 1, 1, 2, 3))) for _ in range(size))
            for p in (0.6, 0.3, 0.05, 0.5, 0.2, 0.7, 0.1, 0.4, 0.25, 0.02, 0.35, 0.15, 0.45, 0.08, 0.3, 0.5)[:k]
        ]
        pieces.append((base, [words_top.layers(c) for c in counts], lengths))
        base += size + rng.randint(0, 50)
    return pieces[::-1]
