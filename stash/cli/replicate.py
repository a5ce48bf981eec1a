"""``stash replicate`` and ``stash restore``: stream a data folder to a
replica off the host with Litestream, and bring users back from it whole
(deploy/README.md, "Replicated host")."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from ..core.lines import plural
from ..web.settings import DATA
from .operate import INCOMPLETE

if TYPE_CHECKING:
    from ..service.ops.replication_status import Status

SYNC_ENV = "STASH_REPLICATE_INTERVAL"
RESTART_PAUSE_S = 0.2
STOP_MARGIN_S = 5.0  # beyond Litestream's own shutdown sync, before it is killed


def _data(arg: str) -> Path:
    return Path(os.path.expanduser(arg)).resolve()


def replicate_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="stash replicate",
        description=(
            "Stream every user's files of a data folder to REPLICA with Litestream, users created later included, "
            "until stopped. Only plain-file stores (--file-cipher none) replicate; a SQLCipher store is reported."
        ),
    )
    p.add_argument(
        "replica",
        help="a folder, a URL Litestream takes (sftp://, s3://…), or a JSON file of Litestream replica settings",
    )
    p.add_argument(
        DATA.flag,
        default=os.environ.get(DATA.env_var, DATA.default),
        help=f"the data folder (default: ${DATA.env_var} or {DATA.default})",
    )
    p.add_argument(
        "--interval",
        default=os.environ.get(SYNC_ENV, "1s"),
        help=f"how often each file is shipped, as Litestream reads it (default: ${SYNC_ENV} or 1s)",
    )
    p.add_argument("--print-config", action="store_true", help="print Litestream's configuration and exit")
    args = p.parse_args(argv)
    from ..service.ops import replica

    data = _data(args.data)
    try:
        target = replica.Target.parse(args.replica)
        binary = replica.litestream_binary()
        if args.print_config:
            import json

            print(json.dumps(replica.config(data, target, args.interval), indent=1))
            return 0
        env = target.environment()
    except replica.ReplicaError as e:
        print(f"stash replicate: {e}.", file=sys.stderr)
        return 2
    (data / "users").mkdir(parents=True, exist_ok=True, mode=0o700)
    known: set[str] = set()
    # The roster exists before Litestream is asked to watch it; only plain-file users are streamed.
    listed = replica.update_roster(data, known)
    streamed = {user_id for user_id, cipher in listed if cipher == "none"}
    cfg = replica.write_config(data, target, args.interval)
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    _report(listed)
    from ..service.ops import replication_status as rs

    status = rs.Status(os.getpid(), time.time(), False)
    lag = rs.Lag(Path(str(target.settings["path"])) if target.settings.get("type") == "file" else None)
    child: subprocess.Popen[bytes] | None = None
    watcher: threading.Thread | None = None
    probing = False
    pause = _seconds(args.interval)
    while not stopping:
        if child is None or child.poll() is not None:
            if child is not None:
                print(
                    f"stash replicate: litestream exited with {child.returncode}; restarting it.",
                    file=sys.stderr,
                    flush=True,
                )
                status.restarts += 1
                status.litestream_up = False
                rs.write(data, dataclasses.replace(status, written=time.time()))
                time.sleep(RESTART_PAUSE_S)
            child = subprocess.Popen(
                [binary, "replicate", "-config", str(cfg), "-no-expand-env"],
                env=env,
                stdin=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                # Linux ends it when this supervisor dies, even by kill -9: a supervisor started again never
                # finds an orphaned Litestream still streaming the same files.
                preexec_fn=replica.dies_with_parent(),
            )
            watcher = threading.Thread(target=_watch_errors, args=(child, status), daemon=True)
            watcher.start()
            if target.endpoint is not None and not probing:
                probing = True
                threading.Thread(target=_watch_endpoint, args=(target.endpoint, status), daemon=True).start()
        added = replica.update_roster(data, known)
        _report(added)
        streamed |= {user_id for user_id, cipher in added if cipher == "none"}
        status.litestream_up = child.poll() is None
        status.lag_seconds = lag.measure(data, streamed)
        status.written = time.time()
        rs.write(data, status)
        time.sleep(pause)
    shipped = True
    if child is not None and child.poll() is None:
        stopped_at = time.time()
        child.terminate()  # Litestream ships what it has before it exits, for at most SHUTDOWN_SYNC_S
        try:
            child.wait(timeout=replica.SHUTDOWN_SYNC_S + STOP_MARGIN_S)
        except subprocess.TimeoutExpired:
            child.kill()
            shipped = False
        if watcher is not None:
            watcher.join(timeout=STOP_MARGIN_S)  # its last lines, which say whether the final sync failed
        # Litestream exits 0 even when its final sync failed; it says so in an error line.
        shipped = shipped and status.last_error_at < stopped_at
    status.litestream_up = False
    rs.write(data, dataclasses.replace(status, written=time.time()))
    # 1: what was written last may not be in the replica (a drain waits for 0: stash/fleet/host.py).
    return 0 if shipped else 1


def _watch_errors(child: subprocess.Popen[bytes], status: Status) -> None:
    """Pass Litestream's log through to ours, counting its errors by kind
    (service/ops/replication_status.py) for /health?ready=1 and /metrics."""
    from ..service.ops import replication_status as rs

    assert child.stderr is not None
    for raw in child.stderr:
        line = raw.decode("utf-8", "replace")
        sys.stderr.write(line)
        sys.stderr.flush()
        kind = rs.classify(line)
        if kind is not None:
            status.errors[kind] = status.errors.get(kind, 0) + 1
            status.last_error, status.last_error_at = kind, time.time()


# How often an S3 replica's server is asked whether it answers, and how long it has to answer.
PROBE_S = 2.0


def _watch_endpoint(endpoint: str, status: Status) -> None:
    """Count an S3 server that does not answer as an ``unreachable`` error,
    every :data:`PROBE_S`. Litestream's own S3 client retries a request up to
    ten times, with waits growing to 20 s, before it logs the failure: about a
    minute in which nothing would say the bucket is gone, while its files in
    this folder keep up with the writes (so the lag shows nothing either)."""
    from ..service.ops import replication_status as rs
    from ..service.ops.replica import answers

    while True:
        if not answers(endpoint, PROBE_S):
            status.errors[rs.UNREACHABLE] = status.errors.get(rs.UNREACHABLE, 0) + 1
            status.last_error, status.last_error_at = rs.UNREACHABLE, time.time()
        time.sleep(PROBE_S)


def _report(added: list[tuple[str, str]]) -> None:
    from ..service.ops.replica import CRAFTED

    for user_id, cipher in added:
        if cipher == CRAFTED:
            print(
                f"stash replicate: {user_id}'s key ring holds a schema Stash does not make (crafted or damaged): "
                "stash restore will refuse it; run stash verify.",
                file=sys.stderr,
                flush=True,
            )
        elif cipher != "none":
            print(
                f"stash replicate: {user_id} uses SQLCipher files, which Litestream cannot read: NOT replicated "
                "(convert it to plain files with `stash migrate --file-cipher none` and a token of its owner: "
                'deploy/README.md, "stash migrate"; until then the daily backup keeps it).',
                file=sys.stderr,
                flush=True,
            )


def _seconds(interval: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0}
    for unit in ("ms", "s", "m"):
        if interval.endswith(unit):
            try:
                return max(0.05, min(5.0, float(interval[: -len(unit)]) * units[unit]))
            except ValueError:
                break
    return 1.0


def restore_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="stash restore",
        description=(
            "Bring users back from a Litestream replica into a data folder, each at the latest moment (or the latest "
            "at or before --timestamp) where its key ring and memory file agree, then check each as stash verify "
            "does. Needs no token. Run it with the server stopped, or into a new folder."
        ),
    )
    p.add_argument("replica", help="the replica stash replicate writes to (folder, URL or JSON settings file)")
    p.add_argument(
        DATA.flag,
        default=os.environ.get(DATA.env_var, DATA.default),
        help=f"the data folder to restore into (default: ${DATA.env_var} or {DATA.default})",
    )
    p.add_argument(
        "--user",
        action="append",
        default=None,
        metavar="ID",
        help="restore this user only (repeatable); default: every user the replica lists",
    )
    p.add_argument("--jobs", type=int, default=4, metavar="N", help="users restored at once (default 4)")
    p.add_argument(
        "--timestamp",
        default=None,
        metavar="TIME",
        help="restore as of this moment (ISO 8601, e.g. 2026-12-01T13:00:00Z) instead of the latest",
    )
    args = p.parse_args(argv)
    from ..service.ops import replica
    from .operate import _print_report

    at = None
    if args.timestamp:
        try:
            at = dt.datetime.fromisoformat(args.timestamp)
        except ValueError:
            print("stash restore: --timestamp must be ISO 8601, like 2026-12-01T13:00:00Z.", file=sys.stderr)
            return 2
        if at.tzinfo is None:
            at = at.replace(tzinfo=dt.UTC)
    data = _data(args.data)
    try:
        target = replica.Target.parse(args.replica)
        replica.litestream_binary()
        target.environment()  # an S3 replica's credentials, checked before anything is restored
        (data / "users").mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(data, 0o700)
        os.chmod(data / "users", 0o700)
        if args.user:
            users = [(u.lower(), "none") for u in args.user]
        else:
            users = replica.replica_users(target, data)
    except (replica.ReplicaError, OSError) as e:
        print(f"stash restore: {e}.", file=sys.stderr)
        return 2
    failed = skipped = partial = 0
    started = time.monotonic()
    # A crafted key ring is tried like a plain store: restore refuses it, saying why.
    wanted = [user_id for user_id, cipher in users if cipher in ("none", replica.CRAFTED)]
    for user_id, cipher in users:
        if cipher not in ("none", replica.CRAFTED):
            print(f"{user_id}  skip  SQLCipher store: never replicated", flush=True)
            skipped += 1
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, min(args.jobs, 64))) as pool:
        for done in pool.map(lambda u: replica.restore_user(target, u, data, at), wanted):
            if done.absent and at is not None:
                print(f"{done.user_id}  skip  made after that moment", flush=True)
                skipped += 1
                continue
            if done.problem:
                print(f"{done.user_id}  FAIL  {done.problem}", flush=True)
                failed += 1
                continue
            assert done.report is not None
            step = f", {plural(done.stepped, 'moment')} stepped back to where its files agree" if done.stepped else ""
            print(f"{done.user_id}  restored at {done.moment}{step}", flush=True)
            _print_report(done.report)
            failed += not done.report.ok
            partial += bool(done.left)
    took = time.monotonic() - started
    restored = plural(len(users) - failed - skipped, "user")
    print(f"stash restore: {restored} restored, {failed} failed, {skipped} skipped, in {took:.1f} s.")
    status = restore_status(len(users) - failed - skipped, failed, skipped)
    if status == INCOMPLETE:
        print(
            "stash restore: not every user of the replica was restored (see the skip lines above); a failover "
            "must not go on as if they were.",
            file=sys.stderr,
        )
    if status == 0 and partial:
        print(
            f"stash restore: {plural(partial, 'user')} came back without a memory their key ring names (see "
            '"not restored" above); a failover must not go on as if they were whole.',
            file=sys.stderr,
        )
        status = INCOMPLETE
    return status


def restore_status(restored: int, failed: int, skipped: int) -> int:
    """``stash restore``'s exit status: 1 when a user failed, 3
    (:data:`INCOMPLETE`) when it skipped one or restored nobody, else 0, so
    a failover script that reads only the status is never fooled."""
    if failed:
        return 1
    return INCOMPLETE if skipped or not restored else 0
