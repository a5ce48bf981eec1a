"""Erasure costs log T (docs/DESIGN.md, "Erase"): erasing #i drops only the summaries on
its path to the root; every other summary stays, byte for byte; the holes are
the pending blocks, in settling order; the wake is whole again after at most
⌊log2 T⌋ naps per erased memory. Checked against an oracle written from the
design's words, on real memory files."""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import pytest

from stash.core import blocks
from stash.service.memory import Memory
from stash.storage.memfile import MemoryFile

USER = "00112233aabbccdd"


def oracle_path(i: int, T: int) -> list[tuple[int, int]]:
    """Every complete aligned block of size >= 2 that contains memory i, smallest first."""
    out, size = [], 2
    while size <= T:
        lo = i - i % size
        if lo + size <= T:
            out.append((lo, lo + size))
        size *= 2
    return out


def oracle_all_blocks(T: int) -> list[tuple[int, int]]:
    """Every complete block, in settling order (size, then position)."""
    out, size = [], 2
    while size <= T:
        out += [(lo, lo + size) for lo in range(0, T - size + 1, size)]
        size *= 2
    return out


def build(tmp_path: Path, T: int, cipher: str, master: bytes | None = None) -> MemoryFile:
    mf = MemoryFile(tmp_path / "memory.db", USER, master or os.urandom(32), cipher, create=True)
    for start in range(0, T, 500):
        mf.append([("2026-01-01", f"memory {i}") for i in range(start, min(T, start + 500))])
    while (due := blocks.first_pending(T, mf.settled(T))) is not None:
        assert mf.put_summary(*due, f"summary {due[0]}-{due[1] - 1}")
    return mf


def summaries(mf: MemoryFile, T: int) -> dict[tuple[int, int], str]:
    return {b: s for b in oracle_all_blocks(T) if (s := mf.summary(*b)) is not None}


@pytest.mark.parametrize("cipher", ["none", "sqlcipher"])
@pytest.mark.parametrize("T", [2, 3, 37, 300, 1024])
def test_erasing_one_memory_drops_exactly_its_path(tmp_path: Path, T: int, cipher: str):
    mf = build(tmp_path, T, cipher)
    try:
        before = summaries(mf, T)
        assert set(before) == set(oracle_all_blocks(T))
        rng = random.Random(T)
        i = rng.randrange(T)
        _, fresh, gone = mf.erase([i], "2026-01-02T00:00:00Z")
        assert fresh == [i]
        assert gone == oracle_path(i, T)
        assert len(gone) <= math.floor(math.log2(T))
        after = summaries(mf, T)
        assert after == {b: s for b, s in before.items() if b not in gone}
        assert blocks.pending(T, mf.settled(T)) == gone  # the pending order: smallest first
        # Every hole is a nap; the wake is whole after them.
        mem = Memory(mf, today=lambda: "2026-01-02")
        naps = 0
        while (nap := mem.nap()["nap"]) is not None:
            mem.nap(nap["block"], f"rewritten {nap['block']}")
            naps += 1
        assert naps == len(gone)
        wake = mem.wake()
        assert wake["awake"] or wake["parts"] > 1
        assert summaries(mf, T).keys() == before.keys()
    finally:
        mf.close()


def test_several_erasures_drop_the_union_of_their_paths_and_survive_reopening(tmp_path: Path):
    T = 777
    master = os.urandom(32)
    mf = build(tmp_path, T, "none", master)
    before = summaries(mf, T)
    ids = [5, 6, 400, 776]
    _, fresh, gone = mf.erase(ids, "2026-01-02T00:00:00Z")
    expect = sorted({b for i in ids for b in oracle_path(i, T)}, key=lambda b: (b[1] - b[0], b[0]))
    assert fresh == ids and gone == expect
    mf.close()
    mf = MemoryFile(tmp_path / "memory.db", USER, master, "none")
    try:
        assert summaries(mf, T) == {b: s for b, s in before.items() if b not in gone}
        assert blocks.pending(T, mf.settled(T)) == expect
        assert blocks.pending_count(T, mf.settled(T)) == len(expect)
        # A later memory extends the levels past their frontiers; the holes still come first per size.
        mf.append([("2026-01-02", "memory 777")])
        order = blocks.pending(T + 1, mf.settled(T + 1))
        assert order == sorted(order, key=lambda b: (b[1] - b[0], b[0]))
        assert set(expect) <= set(order)
        # Erasing an erased memory again drops nothing more.
        assert mf.erase([5], "2026-01-03T00:00:00Z")[1:] == ([], [])
    finally:
        mf.close()


def test_a_nap_for_a_hole_is_refused_out_of_order_and_accepted_in_order(tmp_path: Path):
    T = 64
    mf = build(tmp_path, T, "none")
    try:
        mf.erase([9], "2026-01-02T00:00:00Z")
        assert not mf.put_summary(0, 64, "the root before its halves")
        assert not mf.put_summary(8, 16, "the size-8 hole before its size-2 and size-4 halves")
        assert mf.put_summary(8, 10, "the size-2 hole")
        assert mf.put_summary(8, 12, "the size-4 hole")
        assert not mf.put_summary(8, 10, "again")
        assert blocks.first_pending(T, mf.settled(T)) == (8, 16)
    finally:
        mf.close()
