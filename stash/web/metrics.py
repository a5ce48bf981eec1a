"""Prometheus counters and latencies: route templates, statuses and error
codes only, never a user, a memory, a token or a query string.

With ``--workers N`` each worker process counts its own requests and
publishes a snapshot of its counters to ``DATA/.run/metrics-<pid>.json`` every
:data:`PUBLISH_S` seconds; whichever worker answers a scrape adds up every
snapshot (its own live), so ``/metrics`` shows the whole server whichever
worker takes the connection. A snapshot holds only what the text itself shows.
``stash serve`` clears the folder when it starts, so the counters begin at zero
with the server, as a single process's do.
"""

from __future__ import annotations

import json
import os
import threading
from collections import defaultdict
from pathlib import Path

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
RUN_DIR = ".run"
PUBLISH_S = 1.0
SNAPSHOT_PREFIX = "metrics-"


def run_dir(data_dir: Path) -> Path:
    return Path(data_dir) / RUN_DIR


def clear_snapshots(data_dir: Path) -> None:
    """Forget the counters of a previous run (called once, before any worker starts)."""
    folder = run_dir(data_dir)
    if folder.is_dir():
        for path in folder.glob(f"{SNAPSHOT_PREFIX}*.json"):
            path.unlink(missing_ok=True)


def resident_bytes() -> int:
    """This process's resident memory (RSS), from /proc; 0 where there is none."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def user_count(data_dir: Path) -> int:
    """How many user folders the data folder holds (a count, never a name)."""
    try:
        with os.scandir(Path(data_dir) / "users") as it:
            return sum(1 for e in it if e.is_dir(follow_symlinks=False))
    except OSError:
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _key(parts: list) -> str:
    return "\x1f".join(str(p) for p in parts)


class Metrics:
    def __init__(self, data_dir: Path | None = None, *, shared: bool = False) -> None:
        self._data_dir = data_dir
        self._shared = shared and data_dir is not None
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self._errors: dict[tuple[str, str], int] = defaultdict(int)
        self._hist: dict[tuple[str, str], list[int]] = {}
        self._sum: dict[tuple[str, str], float] = defaultdict(float)
        self._count: dict[tuple[str, str], int] = defaultdict(int)
        self._events: dict[str, int] = defaultdict(int)
        self._stop = threading.Event()
        self._publisher: threading.Thread | None = None

    def observe(self, method: str, route: str, status: int, seconds: float, error: str | None = None) -> None:
        with self._lock:
            self._requests[(method, route, status)] += 1
            if error is not None:
                self._errors[(route, error)] += 1
            key = (method, route)
            hist = self._hist.setdefault(key, [0] * len(BUCKETS))
            for k, edge in enumerate(BUCKETS):
                if seconds <= edge:
                    hist[k] += 1
            self._sum[key] += seconds
            self._count[key] += 1

    def event(self, name: str) -> None:
        with self._lock:
            self._events[name] += 1

    # ------------------------------------------------------------ across workers

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "requests": {_key(k): n for k, n in self._requests.items()},
                "errors": {_key(k): n for k, n in self._errors.items()},
                "hist": {_key(k): [*h, self._sum[k], self._count[k]] for k, h in self._hist.items()},
                "events": dict(self._events),
                "rss": resident_bytes(),
            }

    def _snapshot_path(self) -> Path:
        return run_dir(self._data_dir) / f"{SNAPSHOT_PREFIX}{os.getpid()}.json"

    def publish(self) -> None:
        """Write this worker's snapshot where the other workers read it
        (write then rename, so a reader never sees half of one)."""
        path = self._snapshot_path()
        path.parent.mkdir(mode=0o700, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.snapshot()))
        os.replace(tmp, path)

    def start(self) -> None:
        if not self._shared or self._publisher is not None:
            return

        def loop() -> None:
            while True:
                try:
                    self.publish()
                except OSError:
                    pass  # a data folder that cannot be written shows on /health?ready=1, not here
                if self._stop.wait(PUBLISH_S):
                    return

        self._publisher = threading.Thread(target=loop, name="stash-metrics", daemon=True)
        self._publisher.start()

    def stop(self) -> None:
        if self._publisher is None:
            return
        self._stop.set()
        self._publisher.join(timeout=5)
        self._publisher = None
        try:
            self.publish()
        except OSError:
            pass

    def _merged(self) -> tuple[dict, int]:
        """Every worker's snapshot added up, and how many were added."""
        own = self.snapshot()
        snaps = [own]
        if self._shared:
            mine = self._snapshot_path().name
            for path in sorted(run_dir(self._data_dir).glob(f"{SNAPSHOT_PREFIX}*.json")):
                if path.name == mine:
                    continue
                try:
                    snap = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue  # a worker replacing its file; it is counted next scrape
                # A worker that was replaced keeps its counts in the totals
                # (counters never go down), but not its memory or its place.
                snap["live"] = _alive(int(path.stem[len(SNAPSHOT_PREFIX):]))
                if not snap["live"]:
                    snap["rss"] = 0
                snaps.append(snap)
        total: dict = {"requests": defaultdict(int), "errors": defaultdict(int), "hist": {},
                       "events": defaultdict(int), "rss": 0}
        for snap in snaps:
            for name in ("requests", "errors", "events"):
                for k, n in snap[name].items():
                    total[name][k] += n
            for k, vals in snap["hist"].items():
                acc = total["hist"].setdefault(k, [0] * len(vals))
                total["hist"][k] = [a + b for a, b in zip(acc, vals)]
            total["rss"] += snap["rss"]
        return total, sum(1 for snap in snaps if snap.get("live", True))

    # ------------------------------------------------------------ text format

    def render(self) -> str:
        total, workers = self._merged()
        out = [
            "# HELP stash_requests_total Requests answered, by route template and status.",
            "# TYPE stash_requests_total counter",
        ]
        for k, n in sorted(total["requests"].items()):
            method, route, status = k.split("\x1f")
            out.append(f'stash_requests_total{{method="{method}",route="{route}",status="{status}"}} {n}')
        out += [
            "# HELP stash_errors_total Error answers, by route template and error code.",
            "# TYPE stash_errors_total counter",
        ]
        for k, n in sorted(total["errors"].items()):
            route, code = k.split("\x1f")
            out.append(f'stash_errors_total{{route="{route}",code="{code}"}} {n}')
        out += [
            "# HELP stash_request_seconds Time to answer, by route template.",
            "# TYPE stash_request_seconds histogram",
        ]
        for k, vals in sorted(total["hist"].items()):
            method, route = k.split("\x1f")
            labels = f'method="{method}",route="{route}"'
            hist, seconds, count = vals[: len(BUCKETS)], vals[-2], vals[-1]
            for edge, n in zip(BUCKETS, hist):
                out.append(f'stash_request_seconds_bucket{{{labels},le="{edge}"}} {n}')
            out.append(f'stash_request_seconds_bucket{{{labels},le="+Inf"}} {count}')
            out.append(f"stash_request_seconds_sum{{{labels}}} {seconds:.6f}")
            out.append(f"stash_request_seconds_count{{{labels}}} {count}")
        out += ["# HELP stash_events_total Notable events.", "# TYPE stash_events_total counter"]
        for name, n in sorted(total["events"].items()):
            out.append(f'stash_events_total{{event="{name}"}} {n}')
        out += [
            "# HELP stash_users Users (stores) in the data folder.",
            "# TYPE stash_users gauge",
            f"stash_users {user_count(self._data_dir) if self._data_dir is not None else 0}",
            "# HELP stash_workers Live server processes whose counters this answer adds up.",
            "# TYPE stash_workers gauge",
            f"stash_workers {workers}",
            "# HELP stash_resident_bytes Resident memory of those server processes, added up.",
            "# TYPE stash_resident_bytes gauge",
            f"stash_resident_bytes {total['rss']}",
        ]
        return "\n".join(out) + "\n"
