"""A request to a memory of an identity holding N memories, against one
holding only that memory (issue 28, must-hold 7), and the disk an extra empty
memory takes.

    python bench/memories.py [--n 100] [--calls 300]

Runs the app in process over real files (closed after every request, as
`stash serve` does by default), with the cheap test KDF for the tokens (the
argon2id cost is the same in both runs and is not what is compared), and
reports per-call p50/p95 of a note and a wake on /m/x for 1 and N memories,
the file-system calls each makes (open, stat, scandir, listdir: a count that
no load on the machine changes), and the bytes of an empty memory's files."""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stash.crypto.keys import KdfParams
from stash.web.app import create_app
from tests.support.api import Api, make_settings

CALLS: collections.Counter = collections.Counter()


def _counted(name: str) -> None:
    real = getattr(os, name)

    def call(*args, **kw):
        CALLS[name] += 1
        return real(*args, **kw)

    setattr(os, name, call)


for _name in ("open", "stat", "scandir", "listdir"):
    _counted(_name)


def run(n: int, calls: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        api = Api(create_app(make_settings(Path(tmp), kdf=KdfParams(1, 8, 1), max_memories=max(n, 1) + 1)))
        try:
            owner = api.init()["token"]
            for i in range(n - 1):
                api.post("/memories", owner, json={"name": f"other{i}"})
            api.post("/memories", owner, json={"name": "x"})
            full = api.post("/grants", owner, json={"scope": "full", "memory": "x"}).json()["token"]
            out = {}
            # The wake first, on a short log (a wake of more than WAKE_LINES memories needs naps).
            for i in range(40):
                api.post("/m/x/note", full, json={"text": f"an early line {i}"})
            for what, call in (
                ("wake", lambda: api.get("/m/x/wake", full)),
                ("note", lambda: api.post("/m/x/note", full, json={"text": "a line of work"})),
            ):
                times = []
                CALLS.clear()
                for _ in range(calls):
                    t = time.perf_counter()
                    assert call().status_code == 200
                    times.append(time.perf_counter() - t)
                times.sort()
                out[f"{what} p50 ms"] = statistics.median(times) * 1e3
                out[f"{what} p95 ms"] = times[int(len(times) * 0.95)] * 1e3
                out[f"{what} fs calls"] = sum(CALLS.values()) / calls
            return out
        finally:
            api.close()


def empty_bytes() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        api = Api(create_app(make_settings(Path(tmp), kdf=KdfParams(1, 8, 1))))
        try:
            made = api.init()
            api.post("/memories", made["token"], json={"name": "empty"})
        finally:
            api.close()
        folder = Path(tmp) / "users" / made["user_id"] / "m" / "empty"
        return sum(p.stat().st_blocks * 512 for p in folder.iterdir()) + folder.stat().st_blocks * 512


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--calls", type=int, default=300)
    a = p.parse_args()
    for n in (1, a.n):
        print(f"{n} memories: " + ", ".join(f"{k} {v:.2f}" for k, v in run(n, a.calls).items()))
    print(f"an extra empty memory: {empty_bytes()} bytes on disk (files' blocks and its folder)")


if __name__ == "__main__":
    main()
