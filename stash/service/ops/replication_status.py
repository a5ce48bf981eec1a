"""Whether replication is running, how far behind it is and what failed:
the file ``stash replicate`` rewrites every pass, and how the server reads it
for ``/health?ready=1`` and ``/metrics`` (deploy/README.md, "Replicated host").

The supervisor writes ``DATA/.run/replication.json`` (0600) once a pass (its
interval, at most every 5 s): its process id, when it wrote, whether
Litestream is up, how often it was restarted, Litestream's errors by kind,
and the lag. A server that replicates is not ready while the file is missing
or older than :data:`STALE_S` (the supervisor is gone), Litestream is down,
an error was seen in the last :data:`ERROR_WINDOW_S` seconds, or the lag is
over :data:`MAX_LAG_S`.

The lag is, for the oldest write to a replicated file not yet in the
replica, the seconds since that write (0 when nothing is pending), read from
file times each pass: a bound to the pass, not to the millisecond. "In the
replica" is judged by the replica's own folder for a folder replica, and by
the transaction files Litestream keeps beside each file for any other (there
an upload that fails shows as an error, not as lag).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...storage.layout import DATA_FILES, USER_ID

STATUS = Path(".run") / "replication.json"
STALE_S = 15.0
# Litestream logs a failure that repeats at most once every 30 s (and retries
# ever more rarely, up to every 5 minutes): an error keeps the host not ready
# for twice that, and a failure that outlasts it shows as lag once writes wait.
ERROR_WINDOW_S = 60.0
MAX_LAG_S = 60.0
UNREACHABLE = "unreachable"
ERROR_KINDS = ("disk_full", "unwritable", "credentials", UNREACHABLE, "other")
# What a line says, by kind, first match wins: a refused signature comes back over a reachable network, and an
# unreachable bucket's line names the attempt (``dial tcp``) that failed.
_SIGNS = (
    ("disk_full", ("no space left", "disk full", "disk quota", "database or disk is full", "enospc")),
    ("unwritable", ("permission denied", "read-only file system", "operation not permitted")),
    (
        "credentials",
        (
            "signaturedoesnotmatch",
            "invalidaccesskeyid",
            "accessdenied",
            "access denied",
            "expiredtoken",
            "invalidtoken",
            "statuscode: 401",
            "statuscode: 403",
            "failed to retrieve credentials",
            "no valid credential",
            "ssh: unable to authenticate",
        ),
    ),
    (
        "unreachable",
        (
            "connection refused",
            "connection reset",
            "no such host",
            "i/o timeout",
            "network is unreachable",
            "no route to host",
            "dial tcp",
            "broken pipe",
            "timeout awaiting",
            "tls handshake",
        ),
    ),
)


def classify(line: str) -> str | None:
    """The kind of a Litestream log line that reports a failure, or None
    for any other line. Only the kind is kept: a line may name paths."""
    low = line.lower()
    if "level=error" not in low and "level=warn" not in low and '"level":"error"' not in low:
        return None
    for kind, signs in _SIGNS:
        if any(s in low for s in signs):
            return kind
    return "other" if "level=error" in low or '"level":"error"' in low else None


@dataclass
class Status:
    pid: int
    written: float
    litestream_up: bool
    restarts: int = 0
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_KINDS, 0))
    last_error: str | None = None
    last_error_at: float = 0.0
    lag_seconds: float = 0.0


def write(data_dir: Path, status: Status) -> None:
    path = Path(data_dir) / STATUS
    path.parent.mkdir(mode=0o700, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(status), f)
    os.replace(tmp, path)


def read(data_dir: Path) -> Status | None:
    try:
        raw = json.loads((Path(data_dir) / STATUS).read_text())
        return Status(**raw)
    except (OSError, ValueError, TypeError):
        return None


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def problem(status: Status | None, now: float | None = None) -> str | None:
    """Why replication is not healthy now (words safe to answer), or None."""
    now = time.time() if now is None else now
    if status is None or now - status.written > STALE_S or not alive(status.pid):
        return "the replication supervisor (stash replicate) is not running"
    if not status.litestream_up:
        return "Litestream is not running"
    if status.last_error is not None and now - status.last_error_at < ERROR_WINDOW_S:
        what = {
            "disk_full": "the replica is full",
            "unwritable": "the replica cannot be written",
            "credentials": "the replica refuses its credentials",
            "unreachable": "the replica cannot be reached",
        }
        return f"{what.get(status.last_error, 'Litestream reports errors')}"
    if status.lag_seconds > MAX_LAG_S:
        return f"the replica is {status.lag_seconds:.0f} s behind"
    return None


class Lag:
    """The lag, kept across passes: per replicated file, since when a write
    has been waiting for Litestream (:mod:`stash.service.ops.replication_status`)."""

    def __init__(self, replica_root: Path | None = None) -> None:
        self._pending: dict[Path, float] = {}
        self._root = replica_root  # a folder replica's root, else None

    def _shipped(self, folder: Path, user_id: str, name: str) -> float:
        """When the newest transaction of the file reached where it is judged shipped."""
        level0 = (
            (self._root / "users" / user_id / name if self._root is not None else folder / f".{name}-litestream")
            / "ltx"
            / "0"
        )
        try:
            return os.stat(level0).st_mtime
        except OSError:
            return 0.0

    def measure(self, data_dir: Path, users: set[str], now: float | None = None) -> float:
        now = time.time() if now is None else now
        oldest = now
        for user_id in users:
            if not USER_ID.fullmatch(user_id):
                continue
            folder = Path(data_dir) / "users" / user_id
            for name in DATA_FILES:
                path = folder / name
                with contextlib.suppress(OSError):
                    wrote = os.stat(f"{path}-wal").st_mtime
                    shipped = self._shipped(folder, user_id, name)
                    if wrote <= shipped:
                        self._pending.pop(path, None)
                        continue
                    since = self._pending.get(path)
                    if since is None or shipped >= since:
                        since = wrote  # the first write not shipped yet, to the pass
                    self._pending[path] = since
                    oldest = min(oldest, since)
        return max(0.0, now - oldest)
