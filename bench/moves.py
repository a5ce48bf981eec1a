"""Bulk moves over HTTP (issue 12 items 1 and 2), against a real ``stash
serve`` on loopback:

* **import to awake** — a memory of T imported memories (one ``POST /import``)
  is refused a wake until its compressions are written; an agent that follows
  only what the server prints (the refused wake's nap, the batch its prompt
  offers, each batch's answering command) is awake again after R requests and
  S seconds. The summaries are written instantly here: the number is the
  server's and the protocol's cost, not a model's.
* **import-optmem** — ``stash import-optmem DIR`` moves an OptMem folder of N
  summaries (and the T memories they cover) into an empty memory; wall time of
  the whole command, as a user runs it.

Usage::

    python bench/moves.py                         # T = 2,000 to awake; 100,000 summaries through import-optmem
    python bench/moves.py --awake 2000 --summaries 20000
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _repo  # noqa: F401  (the repository root on sys.path)
import httpx
from run import serve  # tests/support/server.py's launcher, as bench/run.py starts it

LOG_REC, TREE_REC = 320, 288  # OptMem's record widths
_CMD = re.compile(
    r'curl -s -H "Authorization: Bearer \$STASH_TOKEN"(?: -X POST)? "\$STASH_URL(/[a-z]+)"'
    r"(?: -d '(.*)')?"
)


def record(text: str, width: int) -> bytes:
    raw = text.encode("utf-8")
    return raw + b" " * (width - 1 - len(raw)) + b"\n"


def import_to_awake(url: str, T: int) -> dict:
    with httpx.Client(base_url=url, timeout=300, trust_env=False) as c:
        token = c.post("/init", json={}).json()["token"]
        auth = {"Authorization": f"Bearer {token}"}
        entries = [{"date": "2024-01-01", "text": f"imported memory number {i}"} for i in range(T)]
        assert c.post("/import", headers=auth, json={"entries": entries}).status_code == 200
        requests = 0

        def run(command: str) -> dict:
            nonlocal requests
            m = _CMD.fullmatch(command)
            assert m, command
            requests += 1
            if m.group(2) is None:
                return c.get(m.group(1), headers=auth).json()
            body = json.loads(m.group(2).replace("<your line>", "one line"))
            for s in body.get("summaries", []):
                s["text"] = f"summary of {s['block']}"
            return c.post(m.group(1), headers=auth, json=body).json()

        wake = 'curl -s -H "Authorization: Bearer $STASH_TOKEN" "$STASH_URL/wake"'
        t0 = time.perf_counter()
        answer = run(wake)
        batches = 0
        while not answer.get("awake"):
            prompt = answer["nap"]["prompt"]
            offer = re.search(r"instead run: (curl [^\n]*'\{\"batch\": \d+\}')", prompt)
            if offer:
                listed = run(offer.group(1))
                batches += 1
                answer = run(listed["prompt"].splitlines()[-1].removeprefix("Run: "))
            else:
                answer = run(prompt.splitlines()[-1].removeprefix("Run: "))
            if answer.get("nap") is None:
                answer = run(wake)
        seconds = time.perf_counter() - t0
    return {"T": T, "requests": requests, "batches": batches, "seconds": seconds}


def optmem_folder(path: Path, n_summaries: int) -> int:
    """An OptMem folder with every summary of T memories, T the smallest log
    with at least ``n_summaries`` (T memories complete T - popcount(T) blocks)."""
    T = n_summaries
    while T - bin(T).count("1") < n_summaries:
        T += 1
    (path / "TREE").mkdir(parents=True)
    start = dt.date(2020, 1, 1)
    with open(path / "LOG.txt", "wb") as f:
        for i in range(T):
            f.write(record(f"#{i} {(start + dt.timedelta(days=i // 100)).isoformat()} memory number {i}", LOG_REC))
    size = 2
    while size <= T:
        with open(path / "TREE" / str(size), "wb") as f:
            for k in range(T // size):
                f.write(record(f"summary of {k * size}-{(k + 1) * size - 1}", TREE_REC))
        size *= 2
    return T


def import_optmem(url: str, n: int, root: Path) -> dict:
    folder = root / "optmem"
    T = optmem_folder(folder, n)
    token = httpx.post(url + "/init", json={}, timeout=60, trust_env=False).json()["token"]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("STASH_")},
        "STASH_URL": url,
        "STASH_TOKEN": token,
    }
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "stash", "import-optmem", str(folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    carried = re.search(r"Carried over (\d+) of the folder's (\d+) summaries", done.stdout)
    return {"T": T, "summaries": int(carried.group(1)), "in_folder": int(carried.group(2)), "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--awake", type=int, default=2000, help="memories imported before the walk to awake")
    p.add_argument("--summaries", type=int, default=100_000, help="summaries in the OptMem folder")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="stash-moves-"))
    server = serve(root / "data", root / "server.log")
    try:
        a = import_to_awake(server.url, args.awake)
        print(
            f"import to awake: T = {a['T']:,}: awake after {a['requests']} requests ({a['batches']} batches) "
            f"in {a['seconds']:.2f} s"
        )
        b = import_optmem(server.url, args.summaries, root)
        print(
            f"import-optmem: {b['summaries']:,} of {b['in_folder']:,} summaries (T = {b['T']:,} memories) "
            f"in {b['seconds']:.1f} s ({b['summaries'] / b['seconds']:,.0f} summaries/s)"
        )
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
