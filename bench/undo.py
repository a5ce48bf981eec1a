"""The owner's way back from a flood (docs/DESIGN.md, "Erase"), timed on a
real memory file: T memories, the first KEEP written by the owner (grant 1)
and the rest by a full capability (grant 2). Times each ``POST /erase/undo``
slice by grant through the service (erase included; no HTTP, no argon2id),
then what the wake owes once the flood is erased, and one open of the file
(its schema check included), and one open with a note.

    python bench/undo.py -T 100000 --keep 10 --cipher none
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import _repo  # noqa: F401  (puts the checkout on sys.path)

from stash.core import blocks
from stash.service import undo
from stash.service.memory import Memory
from stash.storage.memfile import MemoryFile

USER = "00112233aabbccdd"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-T", type=int, default=100_000)
    ap.add_argument("--keep", type=int, default=10)
    ap.add_argument("--cipher", default="none", choices=("none", "sqlcipher"))
    args = ap.parse_args()
    master = os.urandom(32)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "memory.db"
        mf = MemoryFile(path, USER, master, args.cipher, create=True)
        mf.writer = 1
        mf.append([("2026-01-01", f"owner {i}") for i in range(args.keep)])
        mf.writer = 2
        t = time.perf_counter()
        for start in range(args.keep, args.T, 10_000):
            mf.append([("2026-01-01", f"flood {i}") for i in range(start, min(args.T, start + 10_000))])
        print(f"built T={args.T:,} ({args.cipher}) in {time.perf_counter() - t:.1f} s")
        mem = Memory(mf, today=lambda: "2026-01-02")
        print(f"pending before: {blocks.pending_count(args.T, mf.settled(args.T)):,} naps")
        slices, body_first = [], 0
        while True:
            t = time.perf_counter()
            ans = undo.undo(mem, 2, body_first, None, {1, 2})
            slices.append(time.perf_counter() - t)
            if ans["more"] is None:
                break
            body_first = ans["more"]
        print(
            f"undo by grant: {len(slices)} slices, median {statistics.median(slices):.2f} s, "
            f"max {max(slices):.2f} s per slice of up to {undo.UNDO_MAX:,}"
        )
        t = time.perf_counter()
        owed = blocks.pending_count(args.T, mf.settled(args.T))
        print(f"pending after: {owed} naps ({(time.perf_counter() - t) * 1000:.1f} ms to count)")
        mf.close()
        t = time.perf_counter()
        mf = MemoryFile(path, USER, master, args.cipher)
        print(f"one open with {args.T - args.keep:,} erased: {(time.perf_counter() - t) * 1000:.0f} ms")
        mf.close()
        t = time.perf_counter()
        mf = MemoryFile(path, USER, master, args.cipher)
        Memory(mf, today=lambda: "2026-01-02").note("after the undo")
        mf.close()
        print(f"one open + note + close after it: {(time.perf_counter() - t) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
