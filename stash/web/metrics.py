"""Prometheus counters and latencies: route templates, statuses and error
codes only, never a user, a memory, a token or a query string.

The counting and the text format are prometheus_client's. With one worker the
values live in this process. With ``--workers N`` they are prometheus_client's
multiprocess files: ``stash serve`` points ``PROMETHEUS_MULTIPROC_DIR`` at a
fresh folder of its own on a memory-backed filesystem apart from the data
folder (:func:`metrics_home`, removed when it exits) before any worker imports
the library, every worker writes its own file, and whichever worker answers a
scrape adds up every file. A file holds only what the text itself shows.
Counters of a worker that died stay in the totals (counters never go down);
its gauges (memory, in-flight requests, its place among the workers) are
dropped at the next scrape.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import disable_created_metrics
from prometheus_client.registry import Collector

from ..service.ops.replication_status import alive as _alive

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
FOLDER_PREFIX = "stash-metrics-"
# Tried in order for the workers' counter files: the first that is a folder
# this process may write in, on another filesystem than the data folder.
MEMORY_HOMES = (
    "/dev/shm",  # noqa: S108 - a fresh 0700 folder of its own is made inside
    os.environ.get("XDG_RUNTIME_DIR") or "",
    tempfile.gettempdir(),
)

# A `_created` series per counter would double the text and says nothing an
# operator needs (the process start is in the exporter's own metrics).
disable_created_metrics()


def _device(path: str | Path) -> int | None:
    try:
        return os.stat(path).st_dev
    except OSError:
        return None


def metrics_home(data_dir: Path, homes: tuple[str, ...] = MEMORY_HOMES) -> Path | None:
    """Where several workers keep their counter files, or None where no
    place qualifies. prometheus_client maps those files into memory, and a
    write to a mapped page the filesystem has no room for kills the process
    (SIGBUS), so they must never share the data folder's filesystem: a full
    data disk would take every worker with it, and its replacements too."""
    data = Path(data_dir)
    while not data.exists() and data != data.parent:
        data = data.parent
    data_device = _device(data)
    for home in homes:
        if home and os.path.isdir(home) and os.access(home, os.W_OK | os.X_OK) and _device(home) != data_device:
            return Path(home)
    return None


def _sweep(home: Path) -> None:
    """Remove the counter folders that servers which died without cleaning
    up (kill -9) left in ``home``: those of this user whose process is gone."""
    for folder in home.glob(FOLDER_PREFIX + "*"):
        pid = folder.name[len(FOLDER_PREFIX) :].split("-", 1)[0]
        try:
            mine = folder.stat().st_uid == os.getuid()
        except OSError:
            continue
        if mine and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def prepare_multiprocess(data_dir: Path) -> tuple[dict[str, str], Path]:
    """A new, empty counter folder for this server's workers (so the counters
    begin at zero with the server, as a single process's do), and the
    environment they need (set it before any worker starts). The folder's
    name starts with this process's id; the caller removes it when the server exits
    (:func:`remove_multiprocess`). Where no memory-backed place apart from the
    data folder exists, the folder falls back to ``DATA/.run/prometheus``
    (the caller says so: a full data disk then stops the workers)."""
    home = metrics_home(data_dir)
    if home is not None:
        _sweep(home)
        # A name no other user can guess and take first in a shared folder (mkdtemp makes it 0700).
        folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-", dir=home))
    else:
        folder = Path(data_dir) / ".run" / "prometheus"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, mode=0o700)
        os.chmod(folder.parent, 0o700)
    os.chmod(folder, 0o700)
    return {MULTIPROC_ENV: str(folder)}, folder


def remove_multiprocess(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


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


def memory_count(data_dir: Path) -> int:
    """How many memories the data folder holds, every identity's main and each
    of its others (docs/DESIGN.md, "Memories"): a count, never a name."""
    total = 0
    try:
        with os.scandir(Path(data_dir) / "users") as users:
            for user in users:
                if not user.is_dir(follow_symlinks=False):
                    continue
                total += 1
                try:
                    with os.scandir(os.path.join(user.path, "m")) as others:
                        total += sum(
                            1 for e in others if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")
                        )
                except OSError:
                    continue
    except OSError:
        return 0
    return total


class _Users(Collector):
    """``stash_users``, counted from the data folder at each scrape."""

    def __init__(self, data_dir: Path | None) -> None:
        self._data_dir = data_dir

    def collect(self) -> Iterator[GaugeMetricFamily]:
        count = user_count(self._data_dir) if self._data_dir is not None else 0
        yield GaugeMetricFamily("stash_users", "Users (stores) in the data folder.", value=count)
        memories = memory_count(self._data_dir) if self._data_dir is not None else 0
        yield GaugeMetricFamily(
            "stash_memories", "Memories in the data folder: each identity's main and its others.", value=memories
        )


class _Replication(Collector):
    """On a host that replicates: what ``stash replicate`` last wrote of
    itself (service/ops/replication_status.py), read at each scrape. Counts and
    seconds only, never a user or a path."""

    def __init__(self, data_dir: Path, active: Callable[[], bool] = lambda: True) -> None:
        self._data_dir = data_dir
        self._active = active  # a host of a fleet replicates only while it holds a shard

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from ..service.ops import replication_status as rs

        if not self._active():
            return
        status = rs.read(self._data_dir)
        healthy = rs.problem(status) is None
        yield GaugeMetricFamily(
            "stash_replication_ready",
            "1 while replication is up, error-free and within its lag bound (as /health?ready=1 judges it).",
            value=int(healthy),
        )
        up = status is not None and rs.problem(status) != rs.problem(None)
        yield GaugeMetricFamily(
            "stash_replication_supervisor_up", "1 while stash replicate writes its status.", value=int(up)
        )
        yield GaugeMetricFamily(
            "stash_replication_litestream_up",
            "1 while Litestream runs.",
            value=int(up and status is not None and status.litestream_up),
        )
        yield GaugeMetricFamily(
            "stash_replication_lag_seconds",
            "Seconds the oldest write not yet shipped by Litestream has waited (0: none).",
            value=status.lag_seconds if status else 0.0,
        )
        yield GaugeMetricFamily(
            "stash_replication_restarts",
            "Times the supervisor restarted Litestream.",
            value=status.restarts if status else 0,
        )
        errors = GaugeMetricFamily(
            "stash_replication_errors",
            "Litestream's error lines since the supervisor started, by kind.",
            labels=("kind",),
        )
        for kind in rs.ERROR_KINDS:
            errors.add_metric((kind,), (status.errors.get(kind, 0) if status else 0))
        yield errors


class Metrics:
    """One server process's metrics; ``shared`` when it is one of several
    workers writing prometheus_client's multiprocess files."""

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        shared: bool = False,
        replicating: bool | Callable[[], bool] = False,
    ) -> None:
        self._data_dir = data_dir
        active = replicating if callable(replicating) else (lambda: True)
        self._replication = _Replication(data_dir, active) if replicating and data_dir is not None else None
        self._folder: str | None = os.environ.get(MULTIPROC_ENV) if shared else None
        if shared and not (self._folder and os.path.isdir(self._folder)):
            raise RuntimeError("several workers count into PROMETHEUS_MULTIPROC_DIR, which stash serve sets")
        own = None if self._folder else CollectorRegistry(auto_describe=True)
        self._registry = own
        self._requests = Counter(
            "stash_requests",
            "Requests answered, by route template and status.",
            ("method", "route", "status"),
            registry=own,
        )
        self._errors = Counter(
            "stash_errors", "Error answers, by route template and error code.", ("route", "code"), registry=own
        )
        self._seconds = Histogram(
            "stash_request_seconds",
            "Time to answer, by route template.",
            ("method", "route"),
            buckets=BUCKETS,
            registry=own,
        )
        self._events = Counter("stash_events", "Notable events.", ("event",), registry=own)
        self._in_flight = Gauge(
            "stash_requests_in_flight",
            "Requests being answered now, scrapes of this text not counted.",
            registry=own,
            multiprocess_mode="livesum",
        )
        self._workers = Gauge(
            "stash_workers",
            "Live server processes whose counters this answer adds up.",
            registry=own,
            multiprocess_mode="livesum",
        )
        self._rss = Gauge(
            "stash_resident_bytes",
            "Resident memory of those server processes, added up.",
            registry=own,
            multiprocess_mode="livesum",
        )
        self._rss_read = 0.0
        if own is not None:
            own.register(_Users(data_dir))
            if self._replication is not None:
                own.register(self._replication)

    def observe(self, method: str, route: str, status: int, seconds: float, error: str | None = None) -> None:
        self._requests.labels(method, route, str(status)).inc()
        if error is not None:
            self._errors.labels(route, error).inc()
        self._seconds.labels(method, route).observe(seconds)

    def event(self, name: str) -> None:
        self._events.labels(name).inc()

    def request_started(self) -> None:
        self._in_flight.inc()

    def request_finished(self) -> None:
        self._in_flight.dec()
        # Read at most once a second: a read of /proc per request cost more than a refusal does.
        now = time.monotonic()
        if now - self._rss_read >= 1.0:
            self._rss_read = now
            self._rss.set(resident_bytes())

    def start(self) -> None:
        """This process joins the count of workers."""
        self._workers.set(1)
        self._rss.set(resident_bytes())

    def stop(self) -> None:
        """This process leaves the live gauges (its counters stay in the totals)."""
        if self._folder is not None:
            multiprocess.mark_process_dead(os.getpid(), self._folder)
        else:
            self._workers.set(0)

    def render(self) -> str:
        self._rss.set(resident_bytes())
        if self._registry is not None:
            return generate_latest(self._registry).decode()
        for path in Path(self._folder or "").glob("gauge_live*_*.db"):
            pid = path.stem.rsplit("_", 1)[-1]
            if pid.isdigit() and not _alive(int(pid)):
                multiprocess.mark_process_dead(int(pid), self._folder)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, self._folder)
        registry.register(_Users(self._data_dir))
        if self._replication is not None:
            registry.register(self._replication)
        return generate_latest(registry).decode()
