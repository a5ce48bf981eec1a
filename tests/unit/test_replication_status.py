"""How a replicated host judges its replication (service/ops/replication_status.py):
Litestream's log lines by kind, the status file's verdicts, and the lag read
from real file times."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from stash.service.ops import replication_status as rs

# Lines as Litestream 0.5 writes them (paths made up).
FULL = (
    'time=2026-12-01T19:34:48.535Z level=ERROR msg="sync error" db=/d/users/ab/memory.db '
    'error="write ltx file: write /r/x.ltx.tmp: no space left on device"'
)
DENIED = (
    'time=2026-12-01T19:34:48.535Z level=ERROR msg="replica sync error" '
    'error="open /r/users/ab/memory.db/ltx/0: permission denied"'
)
# An S3 bucket behind a cut network path, and one refusing the keys (as SeaweedFS answers).
UNREACHABLE = (
    'time=2026-12-01T19:34:48.535Z level=ERROR msg="sync error" db=memory.db error="check database behind replica: '
    "get replica position: operation error S3: ListObjectsV2, exceeded maximum number of attempts, 10, https "
    'response error StatusCode: 0, RequestID: , HostID: , request send failed, Get \\"http://127.0.0.1:1/b?list-type=2'
    '\\": read tcp 127.0.0.1:2->127.0.0.1:1: read: connection reset by peer"'
)
SIGNATURE = (
    'time=2026-12-01T19:34:48.535Z level=ERROR msg="sync error" db=memory.db error="check database behind replica: '
    "get replica position: operation error S3: ListObjectsV2, https response error StatusCode: 403, RequestID: 1, "
    'HostID: , api error SignatureDoesNotMatch: The request signature we calculated does not match"'
)
UNKNOWN_KEY = (
    'time=2026-12-01T19:34:48.535Z level=ERROR msg="compaction failed" db=memory.db level=1 error="operation error '
    "S3: ListObjectsV2, https response error StatusCode: 403, api error InvalidAccessKeyId: The access key ID you "
    'provided does not exist in our records."'
)
OTHER = 'time=2026-12-01T19:34:48.535Z level=ERROR msg="sync error" error="ltx: invalid checksum"'
INFO = 'time=2026-12-01T19:34:48.535Z level=INFO msg="initialized db" path=/d/users/ab/memory.db'


def test_litestream_lines_are_counted_by_kind_never_by_text():
    lines = (FULL, DENIED, UNREACHABLE, SIGNATURE, UNKNOWN_KEY, OTHER, INFO)
    kinds = ["disk_full", "unwritable", "unreachable", "credentials", "credentials", "other", None]
    assert [rs.classify(line) for line in lines] == kinds


def test_the_verdicts(tmp_path: Path):
    now = time.time()
    good = rs.Status(os.getpid(), now, True)
    assert rs.problem(good, now) is None
    assert "not running" in (rs.problem(None, now) or "")
    assert "not running" in (rs.problem(rs.Status(os.getpid(), now - rs.STALE_S - 1, True), now) or "")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert "not running" in (rs.problem(rs.Status(gone.pid, now, True), now) or "")
    assert rs.problem(rs.Status(os.getpid(), now, False), now) == "Litestream is not running"
    full = rs.Status(os.getpid(), now, True, last_error="disk_full", last_error_at=now - 1)
    assert rs.problem(full, now) == "the replica is full"
    for kind, words in (("unreachable", "cannot be reached"), ("credentials", "refuses its credentials")):
        assert words in (rs.problem(rs.Status(os.getpid(), now, True, last_error=kind, last_error_at=now), now) or "")
    past = rs.Status(os.getpid(), now, True, last_error="disk_full", last_error_at=now - rs.ERROR_WINDOW_S - 1)
    assert rs.problem(past, now) is None  # an error long past, nothing since
    assert "behind" in (rs.problem(rs.Status(os.getpid(), now, True, lag_seconds=rs.MAX_LAG_S + 1), now) or "")
    rs.write(tmp_path, full)
    assert rs.read(tmp_path) == full
    assert (tmp_path / rs.STATUS).stat().st_mode & 0o777 == 0o600
    (tmp_path / rs.STATUS).write_text("{not json")
    assert rs.read(tmp_path) is None


def test_the_lag_is_the_age_of_the_oldest_write_not_in_the_replica(tmp_path: Path):
    user = "0123456789abcdef"
    folder, replica = tmp_path / "data" / "users" / user, tmp_path / "replica"
    folder.mkdir(parents=True)
    shipped = replica / "users" / user / "memory.db" / "ltx" / "0"
    shipped.mkdir(parents=True)
    wal = folder / "memory.db-wal"
    wal.write_bytes(b"w")
    lag = rs.Lag(replica)
    t = time.time()
    os.utime(shipped, (t - 10, t - 10))
    os.utime(wal, (t - 5, t - 5))  # written 5 s ago, after the replica's last transaction
    assert 4.5 < lag.measure(tmp_path / "data", {user}, now=t) < 5.5
    # Written again since: still waiting from the first write, not the last.
    os.utime(wal, (t - 1, t - 1))
    assert lag.measure(tmp_path / "data", {user}, now=t + 1) > 5.5
    os.utime(shipped, (t + 1, t + 1))  # shipped
    assert lag.measure(tmp_path / "data", {user}, now=t + 2) == 0.0
    assert lag.measure(tmp_path / "data", {"not-a-user"}, now=t + 2) == 0.0
