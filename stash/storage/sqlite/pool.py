"""Open SQLite connections kept between the requests of one process.

Opening a user's two files and closing them again cost more than most
requests do: a SQLCipher open, the WAL and its shared-memory index created
and deleted, and every page read decrypted afresh into an empty cache. A
connection a request has finished with is kept here instead, idle, for at
most ``idle_seconds``, and the next request for the same file in this
process takes it back.

What keeps that as safe as a fresh open:

* **Same key only.** An idle connection is filed under its path and a digest
  of the key it was opened with; only a request that derived the same key
  gets it. No request reads through a connection it could not have opened.
* **At rest while idle.** A connection goes idle with whatever its request
  committed still in its WAL: the commit is durable there already (synced
  at ``synchronous = FULL``), and folding it into the file before the answer
  cost a write request three syncs of each file it wrote. Once the file has
  been quiet for :data:`FOLD_AFTER_S`, the pool's own thread folds the WAL
  into the file (:func:`fold_quiet`), under the user's lock held shared as
  a request holds it, so that a backup never copies a file half folded; from
  then until the next request the file on disk is whole by itself, as it was
  when every request closed its files. A backup, a verify or a copy taken
  meanwhile copies the WAL beside the file, which together are one state;
  the server stopped (its pool closed) leaves every file folded.
* **Changed files are never reused, unless SQLite saw the change.** The
  file's identity, size, modification and change times, its WAL's size and
  whether its filesystem is read-only are recorded when it goes idle
  (:func:`signature`), with SQLite's own count of other connections'
  commits and the file's schema version (:func:`versions`). A file
  replaced, restored, damaged or made unreadable meanwhile, or a folder
  remounted read-only, no longer matches, and its connection is closed
  instead of reused, so the next open checks the file from scratch. The one
  change that keeps it is another process's commit through SQLite (the
  other worker of ``stash serve --workers 2``, on every second write): the
  same file, a commit counted, the schema as it was (:func:`seen_by_sqlite`).
* **Bounded.** At most ``max_idle`` connections (:data:`MAX_IDLE`), each dropped ``idle_seconds``
  after its last use (the pool's own thread, while it is open as a
  context manager), all of them when the pool is closed, and every one of a
  user's when the store is destroyed. The same thread hands the memory the
  process freed back to the system every 5 s (:data:`TRIM_EVERY_S`,
  :func:`files.return_free_heap`), or a worker's RSS grows under load
  while what it holds does not.

A pool has one owner: the server's lifespan builds it
(:func:`files.new_pool`) and closes it when the server stops, and hands it to
whatever opens files for requests (the service's ``Vault``), which passes it
down to each file it opens. There is no process-wide pool: a tool that opens
stores itself (``stash verify``, ``stash backup``, the tests) passes none, and
closes what it opens.

What an idle SQLCipher connection holds is that file's key, which revoking
a capability does not change (SECURITY.md: the file key comes from epoch 0);
no row key, master key or token is ever kept. Closing a memory file's
connection takes the user's lock shared (:mod:`userlock`), as a request
does, so a backup never copies a file while its WAL is being removed.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Signature = tuple[int, int, int, int, int, int, bool]
MAX_IDLE = 256
"""Idle connections one process keeps at most: a key ring and a memory file
for each of 128 memories used in the last few seconds (fewer thrash: bench
/load.py's 50 users need 100). With their WAL and index files, about 770
descriptors (``stash serve`` raises its open-file limit to make room), and
at most :data:`files.CACHE_KIB` of page cache each."""


FOLD_AFTER_S = 0.5
"""How long a kept file's WAL waits, quiet, before the pool folds it. A
user's requests closer together than this share one fold; a copy taken with
the server running within this long of a write holds the WAL too."""
TRIM_EVERY_S = 5.0
"""How often the pool's thread hands the process's free heap back to the
system (``trim``, :func:`files.new_pool`)."""
TICK_S = 0.25
"""How often the pool's thread folds what went quiet and closes what idled
past its time: a file is folded at most ``FOLD_AFTER_S + TICK_S`` after its
last request."""


def signature(path: Path) -> Signature | None:
    """What changes when anyone touches the file: its device, inode, size,
    modification time and change time (a ``chmod`` moves only the last), its
    WAL's size, and whether the filesystem the path is on is read-only now (a
    read-only bind mount over the folder leaves an open file writable
    underneath)."""
    try:
        st = os.stat(path)
        read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return None
    try:
        wal = os.stat(f"{path}-wal").st_size
    except OSError:
        wal = -1
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, wal, read_only)


Versions = tuple[int, int]


def versions(conn: sqlite3.Connection) -> Versions | None:
    """SQLite's ``data_version`` (it moves when another connection commits
    to the file) and ``schema_version`` of ``conn``'s file, in one statement;
    None when they cannot be read."""
    try:
        row = conn.execute("SELECT * FROM pragma_data_version(), pragma_schema_version()").fetchone()
    except Exception:  # sqlite3's and sqlcipher3's errors share no base class
        return None
    return (int(row[0]), int(row[1])) if row else None


def seen_by_sqlite(conn: sqlite3.Connection, was: Signature, now: Signature | None, at_idle: Versions | None) -> bool:
    """Whether a kept connection whose file changed while it idled may be
    reused all the same, because the change was a commit SQLite itself
    counted: the same file on the same device, not read-only now, another
    connection's commit counted since (``data_version`` moved) and the
    schema unchanged. SQLite then drops the connection's whole page cache as
    it starts its next read, so what the request reads is what the file
    holds now, as through a fresh connection, and every check an open makes
    runs on it as on one. A schema changed meanwhile is opened afresh, so the
    schema check of :mod:`safeopen` runs again; a change SQLite did not see
    (a file copied over in place, its mode or its bytes edited) still closes
    the connection, whose cache would hide it."""
    if now is None or at_idle is None or was[:2] != now[:2] or now[6]:
        return False
    current = versions(conn)
    return current is not None and current[1] == at_idle[1] and current[0] != at_idle[0]


def key_digest(key: bytes | None) -> bytes:
    """A name for the key an idle connection was opened with; the key itself
    is not kept twice."""
    return hashlib.blake2b(key or b"", digest_size=16, person=b"stash-pool-key").digest()


@dataclass
class _Idle:
    conn: sqlite3.Connection
    key: bytes
    sig: Signature
    since: float
    versions: Versions | None = None


Closer = Callable[[Path, sqlite3.Connection, bool], None]
"""How a pool closes a connection for good: (path, connection, whether the
caller holds that user's lock already)."""

Folder = Callable[[Path, sqlite3.Connection, Signature], "Signature | None"]
"""How a pool folds an idle connection's WAL: (path, connection, the file's
signature when it went idle) -> the signature after the fold, or None when
the file had changed meanwhile and the connection was closed instead."""


class Pool:
    """Connections kept idle between requests, under the rules of the module
    docstring. ``closer`` closes one for good (:func:`files.new_pool` gives
    the one that folds the WAL and takes the user's lock), ``stale_closer``
    one whose file changed while it idled (the same by default), ``folder``
    folds a quiet one's WAL (:meth:`fold_quiet`; none by default), and
    ``trim``, every ``trim_every`` seconds, gives the process's free heap back
    (none by default)."""

    def __init__(
        self,
        idle_seconds: float,
        max_idle: int = MAX_IDLE,
        *,
        closer: Closer,
        folder: Folder | None = None,
        fold_after: float = FOLD_AFTER_S,
        stale_closer: Closer | None = None,
        trim: Callable[[], object] | None = None,
        trim_every: float = TRIM_EVERY_S,
    ) -> None:
        self.idle_seconds = idle_seconds
        self.max_idle = max_idle
        self.closer = closer
        self.stale_closer = closer if stale_closer is None else stale_closer
        self.trim = trim
        self.trim_every = trim_every
        self.folder = folder
        self.fold_after = fold_after
        self._idle: dict[str, list[_Idle]] = {}
        self._count = 0
        self._closed = False
        self._lock = threading.Lock()
        self._folding: dict[int, tuple[str, _Idle]] = {}  # out of the pool while fold_quiet folds them
        self._doomed: set[int] = set()  # of those, the ones a reap, drop or close let go meanwhile
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.idle_seconds > 0 and self.max_idle > 0 and not self._closed

    def __enter__(self) -> Pool:
        """Start the thread that, every :data:`TICK_S`, folds what went quiet
        and closes what idled past ``idle_seconds`` (none when the pool keeps
        nothing)."""
        if self.enabled and self._reaper is None:
            self._reaper = threading.Thread(target=self._reap_until_closed, name="idle-files", daemon=True)
            self._reaper.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _reap_until_closed(self) -> None:
        last_trim = time.monotonic()
        while not self._stop.wait(TICK_S):
            self.fold_quiet()
            self.reap()
            if self.trim is not None and time.monotonic() - last_trim >= self.trim_every:
                self.trim()
                last_trim = time.monotonic()

    def take(self, path: Path, key: bytes) -> sqlite3.Connection | None:
        """An idle connection to ``path`` opened with this key whose file is
        as it was left; None when there is none. Stale ones are closed here,
        as by a holder of the user's lock: a request takes a memory file's
        connection only while it holds that lock (access.Session.open_memory)."""
        if not self.enabled:
            return None
        name = str(path)
        stale: list[_Idle] = []
        found: _Idle | None = None
        now_sig = signature(path)
        with self._lock:
            entries = self._idle.get(name, [])
            keep = []
            for e in entries:
                if e.sig != now_sig:
                    stale.append(e)
                elif found is None and hmac.compare_digest(e.key, key):
                    found = e
                else:
                    keep.append(e)
            if keep:
                self._idle[name] = keep
            else:
                self._idle.pop(name, None)
            self._count -= len(stale) + (found is not None)
        if found is None:
            # Outside the pool's lock: reading the versions is a read of the file.
            for e in stale:
                if hmac.compare_digest(e.key, key) and seen_by_sqlite(e.conn, e.sig, now_sig, e.versions):
                    found = e
                    stale.remove(e)
                    break
        for e in stale:
            self.stale_closer(path, e.conn, True)
        return None if found is None else found.conn

    def give(self, path: Path, key: bytes, conn: sqlite3.Connection) -> bool:
        """Keep ``conn`` idle; False when the pool will not (the caller
        closes it). The file must be at rest: no transaction (its WAL may
        hold what the request committed; :meth:`fold_quiet` folds it)."""
        if not self.enabled or conn.in_transaction:
            return False
        sig = signature(path)
        if sig is None:
            return False
        return self._keep(str(path), _Idle(conn, key, sig, time.monotonic(), versions(conn)))

    def _keep(self, name: str, entry: _Idle) -> bool:
        """File ``entry`` under ``name``, closing the oldest past the bound;
        False (nothing filed) once the pool is closed."""
        evicted: list[tuple[str, _Idle]] = []
        with self._lock:
            if self._closed:  # closed since the caller's check: nothing is kept after close
                return False
            self._idle.setdefault(name, []).append(entry)
            self._count += 1
            while self._count > self.max_idle:
                oldest = min(self._idle, key=lambda n: self._idle[n][0].since)
                evicted.append((oldest, self._idle[oldest].pop(0)))
                if not self._idle[oldest]:
                    del self._idle[oldest]
                self._count -= 1
        for name_, e in evicted:
            self.closer(Path(name_), e.conn, False)
        return True

    def fold_quiet(self, now: float | None = None) -> None:
        """Fold the WAL of every kept file quiet for ``fold_after`` seconds (as
        of ``now``, a ``time.monotonic()`` reading) whose WAL holds frames.
        Each is taken out of the pool while its fold runs, so no request uses
        it meanwhile, and put back with the signature the fold left (its
        idle time unchanged); one the folder closed (its file changed while
        idle) is not put back, and one whose fold could not finish (another
        process reading, or the user's lock held exclusive) is tried again
        next time."""
        if self.folder is None:
            return
        cutoff = (time.monotonic() if now is None else now) - self.fold_after
        due: list[tuple[str, _Idle]] = []
        with self._lock:
            for name in list(self._idle):
                entries = self._idle[name]
                quiet = [e for e in entries if e.sig[5] > 0 and e.since <= cutoff]
                if not quiet:
                    continue
                due += [(name, e) for e in quiet]
                left = [e for e in entries if not (e.sig[5] > 0 and e.since <= cutoff)]
                if left:
                    self._idle[name] = left
                else:
                    del self._idle[name]
            self._count -= len(due)
            self._folding.update((id(e), (name, e)) for name, e in due)
        for name, e in due:
            try:
                sig = self.folder(Path(name), e.conn, e.sig)
            finally:
                with self._lock:
                    self._folding.pop(id(e), None)
                    doomed = id(e) in self._doomed
                    self._doomed.discard(id(e))
            if sig is None:
                continue
            e.sig = sig
            if doomed or not self._keep(name, e):
                self.closer(Path(name), e.conn, False)

    def _remove(self, keep: Callable[[str, _Idle], bool], held: bool = False) -> None:
        gone: list[tuple[str, _Idle]] = []
        with self._lock:
            for name in list(self._idle):
                entries = self._idle[name]
                left = [e for e in entries if keep(name, e)]
                gone += [(name, e) for e in entries if not keep(name, e)]
                if left:
                    self._idle[name] = left
                else:
                    del self._idle[name]
            self._count -= len(gone)
            self._doomed.update(key for key, (name, e) in self._folding.items() if not keep(name, e))
        for name, e in gone:
            self.closer(Path(name), e.conn, held)

    def reap(self, now: float | None = None) -> None:
        """Close every connection idle for longer than ``idle_seconds`` (as of
        ``now``, a ``time.monotonic()`` reading)."""
        cutoff = (time.monotonic() if now is None else now) - self.idle_seconds
        self._remove(lambda name, e: e.since > cutoff)

    def drop_folder(self, folder: Path, *, held: bool) -> None:
        """Close every idle connection to a file in ``folder``; ``held``:
        the caller holds that user's lock (shared or exclusive)."""
        prefix = str(folder) + os.sep
        self._remove(lambda name, e: not name.startswith(prefix), held)

    def close(self) -> None:
        """Stop the reaper and close every idle connection; from now on
        nothing is kept (a request still finishing closes its files)."""
        with self._lock:
            self._closed = True
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join(timeout=5)
        self._remove(lambda name, e: False)

    def idle_count(self) -> int:
        with self._lock:
            return self._count
