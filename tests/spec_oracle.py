"""SPEC §2.2 written out from its words alone, for tests of every kind to
compare against. Nothing here is imported from the code under test."""

from __future__ import annotations

import functools


def spec_tile(T: int, a: float) -> list[tuple[int, int]]:
    """SPEC §2.2 step 2, as a recursion over [0, R)."""
    R = 1
    while R < T:
        R *= 2
    kept: list[tuple[int, int]] = []

    def visit(lo: int, hi: int) -> None:
        if lo >= T:
            return  # dropped
        size = hi - lo
        if size > 1 and (hi > T or size > a * (T - lo)):
            mid = lo + size // 2
            visit(lo, mid)
            visit(mid, hi)
        else:
            kept.append((lo, hi))

    visit(0, R)
    return kept


@functools.lru_cache(maxsize=4096)
def _spec_cover(T: int, budget: int) -> tuple[tuple[int, int], ...]:
    if T <= budget:  # step 1 (T == 0 gives ())
        return tuple((i, i + 1) for i in range(T))
    lo, hi = 0.0, 1.0  # step 3
    for _ in range(60):
        mid = (lo + hi) / 2
        if len(spec_tile(T, mid)) > budget:
            lo = mid
        else:
            hi = mid
    out = spec_tile(T, hi)
    while len(out) < budget:  # step 4: split the newest block larger than 1
        wide = [k for k, (a, b) in enumerate(out) if b - a > 1]
        if not wide:
            break
        k = wide[-1]
        a, b = out[k]
        m = (a + b) // 2
        out[k : k + 1] = [(a, m), (m, b)]
    return tuple(out)


def spec_cover(T: int, budget: int) -> list[tuple[int, int]]:
    """SPEC §2.2 steps 1-4."""
    return list(_spec_cover(T, budget))
