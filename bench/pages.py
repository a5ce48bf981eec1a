"""What the memory file's page size costs: the same store built at 4 KiB (what
new stores get) and at 16 KiB (what stores made before the 4 KiB layout
have), then its bytes per memory and the time of a wake and of a recall.

    python bench/pages.py -T 100000

Both stores are built by bench/build.py with the same seed, so they hold the
same memories and summaries; only the page size differs. The recall is timed
cold (no recall.db: every memory opened from the memory file, the cache
written) and warm (from recall.db, which is in 4 KiB pages either way), each
through the service as a request would run it, the two stores in turns. Nothing is kept: the stores
are built in a temporary folder unless ``--keep`` names one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _repo  # noqa: F401  (the repository root on sys.path)
import build as builder
import disk

from stash.crypto.keys import KdfParams
from stash.service.access import Vault
from stash.storage.formats import LEGACY_PAGE_BYTES, PAGE_BYTES
from stash.storage.recallcache.rendered_log import CACHE_FILE

CHEAP = KdfParams(1, 8, 1)  # the KDF is not what is measured
QUERY = builder.RARE_WORD  # one memory in 10,000 matches: the scan dominates


def timed_ms(vault: Vault, token: str, work) -> float:
    t = time.perf_counter()
    with vault.session(token, "read") as s:
        work(s.open_memory())
    return (time.perf_counter() - t) * 1000


def measure(root: Path, T: int, rounds: int) -> dict[int, dict[str, float]]:
    """Both stores built first, then timed in turns, round by round, so a
    busy moment of the machine weighs on both alike."""
    stores = {}
    for page_bytes in (PAGE_BYTES, LEGACY_PAGE_BYTES):
        data = root / f"pages-{page_bytes}"
        built = builder.build(data, T, kdf=CHEAP, page_bytes=page_bytes)
        stores[page_bytes] = (Vault(data, CHEAP), built.token, data / "users" / built.user_id)
        print(disk.account(data, built.token), file=sys.stderr)
    times: dict[int, dict[str, list[float]]] = {
        size: {"wake ms": [], "recall cold ms": [], "recall warm ms": []} for size in stores
    }
    for _ in range(rounds):
        for size, (vault, token, folder) in stores.items():
            times[size]["wake ms"].append(timed_ms(vault, token, lambda m: m.wake()))
            (folder / CACHE_FILE).unlink(missing_ok=True)
            times[size]["recall cold ms"].append(timed_ms(vault, token, lambda m: m.recall(QUERY)))
            times[size]["recall warm ms"].append(timed_ms(vault, token, lambda m: m.recall(QUERY)))
    return {
        size: {
            "memory.db bytes per memory": (folder / "memory.db").stat().st_size / T,
            **{name: statistics.median(xs) for name, xs in times[size].items()},
        }
        for size, (_, _, folder) in stores.items()
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="What the memory file's page size costs.")
    p.add_argument("-T", type=int, default=100_000, help="memories in each store (default 100,000)")
    p.add_argument("--rounds", type=int, default=5, help="timed requests of each kind (median)")
    p.add_argument("--keep", type=Path, help="build the stores here and keep them")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        results = measure(root, args.T, args.rounds)
    small, large = results[PAGE_BYTES], results[LEGACY_PAGE_BYTES]
    print(f"T = {args.T:,}; medians of {args.rounds} requests.\n")
    print(f"| measure | {PAGE_BYTES // 1024} KiB pages | {LEGACY_PAGE_BYTES // 1024} KiB pages | ratio |")
    print("|---|---:|---:|---:|")
    for name in small:
        print(f"| {name} | {small[name]:,.1f} | {large[name]:,.1f} | {small[name] / large[name]:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
