"""Erased blocks need no nap (docs/DESIGN.md, "Erase"): the pending order,
the count, the batch and forget of stash.core.blocks, on trees with erased
memories, against the oracle written from the design's words
(tests/support/oracle.py), which shares no code with the module."""

from __future__ import annotations

import random

import pytest

from stash.core import blocks
from tests.support.oracle import Model, all_erased, oracle_batch, oracle_pending


def as_settled(model: Model, T: int, *, stale_holes: bool) -> blocks.Settled:
    """The model's tree in the storage's shape: a frontier per level, the
    missing indices below it as holes (with ``stale_holes``, wholly erased
    blocks are listed among the holes too, as a record written before the
    last erasure would), and the erased memories."""
    out = blocks.Settled(erased=blocks.Erased(model.erased))
    size = 2
    while size <= T:
        have = [lo // size for lo, hi in model.summaries if hi - lo == size]
        out[size] = max(have) + 1 if have else 0
        holes = [
            k
            for k in range(out[size])
            if (k * size, (k + 1) * size) not in model.summaries
            and (stale_holes or not model.wholly_erased(k * size, (k + 1) * size))
        ]
        if holes:
            out.holes[size] = holes
        size *= 2
    return out


def random_history(rng: random.Random, T: int) -> Model:
    """Notes, naps, erasures (single memories and whole runs, as an owner
    undoing a flood does) and forgets, each done by the model's rules."""
    m = Model()
    for i in range(T):
        m.add_note("2026-01-01", f"m{i}")
    for _ in range(rng.randrange(1, 40)):
        op = rng.random()
        if op < 0.5:
            for _ in range(rng.randrange(1, 30)):
                first = m.first_pending()
                if first is None:
                    break
                m.settle(first, "s")
        elif op < 0.8:
            lo = rng.randrange(T)
            for i in range(lo, min(T, lo + rng.choice([1, 1, 2, 3, 8, 17, 64]))):
                m.erase(i)
        else:
            if m.summaries:
                lo, hi = rng.choice(sorted(m.summaries))
                m.drop(m.forget_set(lo, hi))
    return m


@pytest.mark.parametrize("seed", range(200))
def test_pending_count_batch_and_forget_agree_with_the_oracle(seed: int):
    rng = random.Random(seed)
    T = rng.choice([2, 3, 5, 16, 17, 33, 64, 100, 130, 257])
    m = random_history(rng, T)
    settled = as_settled(m, T, stale_holes=seed % 2 == 1)
    want = oracle_pending(T, set(m.summaries), frozenset(m.erased))
    assert blocks.pending(T, settled) == want
    assert blocks.pending_count(T, settled) == len(want) == m.pending_count()
    assert blocks.first_pending(T, settled) == (want[0] if want else None) == m.first_pending()
    for limit in (1, 3, 256):
        assert blocks.pending(T, settled, limit) == want[:limit]
        assert blocks.batch(T, settled, limit) == oracle_batch(T, set(m.summaries), frozenset(m.erased), limit)
    for lo, hi in m.complete_blocks():
        assert blocks.is_settled(settled, lo, hi) == ((lo, hi) in m.summaries)
        assert blocks.is_erased(settled, lo, hi) == all_erased(lo, hi, m.erased)
    if m.summaries:
        lo, hi = rng.choice(sorted(m.summaries))
        assert blocks.forget_span(lo, hi, settled, T) == m.forget_set(lo, hi)


def test_a_snapshot_before_the_last_memories_counts_only_its_own_blocks():
    m = Model()
    for i in range(40):
        m.add_note("2026-01-01", f"m{i}")
    for i in range(8, 40):
        m.erase(i)
    settled = as_settled(m, 40, stale_holes=False)
    for T in (9, 16, 24, 40):
        want = [b for b in oracle_pending(T, set(), frozenset(m.erased))]
        assert blocks.pending(T, settled) == want
        assert blocks.pending_count(T, settled) == len(want)


def test_erased_runs_count_whole_blocks_by_the_definition():
    rng = random.Random(7)
    for _ in range(200):
        ids = {i for i in range(300) if rng.random() < rng.choice([0.1, 0.5, 0.95])}
        e = blocks.Erased(ids)
        assert len(e) == len(ids)
        for size in (2, 4, 8, 16, 64):
            a, b = sorted(rng.randrange(0, 300 // size + 2) for _ in range(2))
            want = sum(1 for k in range(a, b) if all_erased(k * size, (k + 1) * size, ids))
            assert e.whole_blocks(size, a, b) == want
            k = rng.randrange(0, 300 // size)
            live = next(j for j in range(k, 10**6) if not all_erased(j * size, (j + 1) * size, ids))
            assert e.next_live(size, k) == live


def test_a_million_erased_memories_need_no_nap_and_cost_no_listing():
    """The full-token flood undone: a million erased memories after ten
    live ones owe only the naps of the live part and the blocks across it."""
    T = 1_000_010
    settled = blocks.Settled({2: 0}, erased=blocks.Erased(range(10, T)))
    todo = blocks.pending(T, settled)
    # Every block that holds one of #0-#9: size by size, those starting below 10.
    want = [(lo, lo + size) for size in (2**k for k in range(1, 20)) for lo in range(0, 10, size)]
    assert todo == want
    assert blocks.pending_count(T, settled) == len(want) == 5 + 3 + 2 + 16


# ------------------------------------------------------------------ on real memory files

USER = "00112233aabbccdd"


def _answer_following(mem, model: Model) -> int:
    """Settle every nap with a line naming the source's digest, each nap
    checked against the model's first pending block and source."""
    from tests.support.oracle import answer_all

    return answer_all(mem, model)


@pytest.mark.parametrize("cipher", ["none", "sqlcipher"])
@pytest.mark.parametrize("napped_first", [True, False])
def test_a_wholly_erased_run_renders_as_erased_and_owes_no_nap(tmp_path, cipher: str, napped_first: bool):
    """A flood erased by its owner (before or after it was napped): the wake
    and zoom show its blocks as ``#lo-hi [erased]``, only the blocks that
    still hold a live memory are due, and every nap's source is the
    oracle's (an erased half shown as erased)."""
    import os

    from stash.service.memory import Memory
    from stash.storage.memfile import MemoryFile
    from tests.support.oracle import check_wake

    T = 300
    mf = MemoryFile(tmp_path / "memory.db", USER, os.urandom(32), cipher, create=True)
    try:
        model = Model()
        items = [("2026-01-01", f"memory {i}") for i in range(T)]
        mf.append(items)
        for d, t in items:
            model.add_note(d, t)
        mem = Memory(mf, today=lambda: "2026-01-02")
        if napped_first:
            _answer_following(mem, model)
        flood = list(range(37, 290))
        mf.erase(flood, "2026-01-02T00:00:00Z")
        for i in flood:
            model.erase(i)
        due = oracle_pending(T, set(model.summaries), frozenset(model.erased))
        assert blocks.pending(T, mf.settled(T)) == due
        assert mem.nap()["nap"]["remaining"] == model.pending_count() - 1 == len(due) - 1
        assert _answer_following(mem, model) == len(due)
        # Only blocks that hold one of #0-#36 or #290-#299 were ever due: not one per erased memory.
        assert len(due) <= len(model.complete_blocks()) - 200
        doc, _, _ = check_wake(mem, model, mem.sizes)
        assert "#40-47 [erased]" in doc
        assert mem.zoom("0-127")["lines"] == model.zoom(0, 128)
        assert mem.zoom("64-127")["lines"] == model.zoom(64, 128) == ["#64-95 [erased]", "#96-127 [erased]"]
        # The next notes extend the tree over the erased run.
        mf.append([("2026-01-03", "after the flood")])
        model.add_note("2026-01-03", "after the flood")
        _answer_following(mem, model)
        check_wake(mem, model, mem.sizes)
    finally:
        mf.close()
