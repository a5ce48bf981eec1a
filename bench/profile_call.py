"""Where a warm server spends an agent's call: py-spy over a real ``stash serve``.

    python bench/profile_call.py --store bench/results/store-1000000 --calls 300

Starts ``stash serve`` (one worker, the defaults) under ``py-spy record``
(``pip install py-spy``; it samples the server process, every thread),
mints a ``full`` grant on the store, sends ``--calls`` wakes, zooms and notes
(each due nap settled) over one keep-alive connection, stops the server and
prints, per function of the ``stash`` package and of the libraries it calls,
the share of the server's samples spent inside it (inclusive) and in its own
code (self). The store is one ``bench/versus.py`` built (``store-<T>/data``
and ``store-<T>/owner-token``); notes go only to the Stash copy, so run
``versus.py`` after this with ``--fresh`` if the pair must stay equal.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _repo  # noqa: F401  (the repository root on sys.path)
import httpx
from run import serve

from stash.service.access import Vault

IDLE = {"Condition.wait", "Event.wait", "EpollSelector.select", "select", "Queue.get"}


def aggregate(raw: Path, top: int) -> str:
    """The folded stacks py-spy wrote, as inclusive and self shares per frame."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        count = int(n)
        frames = [
            f.split(" (")[0] + " " + f.split(" (")[1].split(":")[0].rsplit("/", 2)[-1] if " (" in f else f
            for f in stack.split(";")
        ]
        if frames[-1].split(" ")[0] in IDLE:
            continue  # a thread waiting for work, or the event loop waiting for a socket
        total += count
        for f in set(frames):
            inclusive[f] += count
        own[frames[-1]] += count
    out = [f"{total} busy samples", "", "inclusive % | self % | frame"]
    for f, n in inclusive.most_common(top):
        out.append(f"{100 * n / total:6.1f} | {100 * own[f] / total:5.1f} | {f}")
    out += ["", "self % | frame"]
    for f, n in own.most_common(top // 2):
        out.append(f"{100 * n / total:5.1f} | {f}")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, required=True, help="a bench/versus.py store folder (data, owner-token)")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--rate", type=int, default=1000, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=60)
    p.add_argument("--ops", default="wake,zoom,note", help="which calls, in turn")
    args = p.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    data = args.store.resolve() / "data"
    owner = (args.store / "owner-token").read_text().strip()
    with Vault(data).session(owner, "owner") as s:
        _, token = Vault(data).mint_grant(s, "full")
    tmp = Path(tempfile.mkdtemp(prefix="stash-profile-"))
    raw = tmp / "stacks.txt"
    server = serve(data, tmp / "server.log", extra=("--quota-memories", "100000000"))
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=server.url, trust_env=False, timeout=60, headers=headers) as c:
            wake = c.get("/wake").json()
            if "lines" not in wake:
                raise SystemExit(f"wake answered {wake}")
            blocks = [ln.split(" ", 1)[0][1:] for ln in wake["lines"] if "-" in ln.split(" ", 1)[0]]
            for _ in range(20):
                c.get("/wake").raise_for_status()
            rec = subprocess.Popen(
                [
                    spy,
                    "record",
                    "-f",
                    "raw",
                    "-r",
                    str(args.rate),
                    "-o",
                    str(raw),
                    "-p",
                    str(server.proc.pid),
                    "--threads",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)
            t0 = time.perf_counter()
            for k in range(args.calls):
                for op in args.ops.split(","):
                    if op == "wake":
                        c.get("/wake").raise_for_status()
                    elif op == "zoom":
                        c.get(f"/zoom?block={blocks[k % len(blocks)]}").raise_for_status()
                    elif op == "note":
                        nap = c.post("/note", json={"text": f"profiled note {k}"}).json()["nap"]
                        while nap is not None:
                            nap = c.post("/nap", json={"block": nap["block"], "text": "summary"}).json()["nap"]
            wall = time.perf_counter() - t0
            rec.send_signal(signal.SIGINT)
            rec.wait(timeout=60)
    finally:
        server.stop()
    n = args.calls * len(args.ops.split(","))
    print(f"{n} calls in {wall:.2f} s ({1000 * wall / n:.2f} ms each, client side)\n")
    print(aggregate(raw, args.top))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
