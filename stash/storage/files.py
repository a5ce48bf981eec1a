"""Where each user's files live, and how a SQLite connection is opened."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import shutil
import sqlite3
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

from ..core.errors import Damaged, Full, StashError, Stopping, Unavailable
from . import safeopen, userlock
from .pool import MAX_IDLE, Pool, Signature, key_digest, signature

try:  # SQLCipher is optional: without it the file is plain SQLite, rows still sealed
    import sqlcipher3.dbapi2 as _sqlcipher
except ImportError:  # pragma: no cover - depends on the platform's wheels
    _sqlcipher = None

# The page size of every file this release creates. An empty identity is a
# handful of pages (schema.sql, "Layout on disk"), so the page is what its
# size is counted in: 4 KiB, the filesystem's block, not the 16 KiB of
# earlier releases (bench/pages.py weighs the two).
PAGE_BYTES = 4096
# The page size of every file made before 4 KiB pages. A plain SQLite file
# records its own page size in its header, but a SQLCipher file does not (its
# header is encrypted too), so an open must be told: the key ring says which
# (Keyring.memory_page_bytes), and a key ring that does not say is older than
# the change, so its memory file has these.
LEGACY_PAGE_BYTES = 16384
BUSY_TIMEOUT_MS = 30_000


DB_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error,) + ((_sqlcipher.Error,) if _sqlcipher is not None else ())

# SQLite's primary result codes (sqlite3.h) that mean the storage, not the request, failed.
_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_INTERRUPT, _SQLITE_IOERR, _SQLITE_CORRUPT = 3, 8, 9, 10, 11
_SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 13, 14, 26

FULL = ("The server's disk is full, so nothing was written; what was acknowledged before is safe. "
        "Tell the operator to free space, then retry.")
READ_ONLY = ("The server's data folder is read-only, so nothing was written; what was acknowledged before is "
             "safe. Tell the operator to make it writable, then retry.")
UNREADABLE = ("This memory's file cannot be read right now (missing, unreadable or an I/O error); nothing was "
              "changed. Tell the operator to run `stash verify` and restore it from a backup if needed.")
DAMAGED = "This memory's file is damaged and was not served; the operator should run `stash verify` and restore it."


class MissingFile(Exception):
    """A user's file that must exist is not there."""


class EmptyFile(Exception):
    """A user's file that must hold a database is empty (cut to 0 bytes)."""


def on_read_only_fs(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def storage_error(exc: BaseException, folder: Path | None = None) -> StashError | None:
    """The refusal a storage failure means for the caller, or None when the
    exception is not one (a bug, to be reported as such). Nothing of the
    exception's own text (paths, SQL) is carried over. With ``folder``, a
    file that cannot be opened on a read-only filesystem is reported as that."""
    err = _storage_error(exc)
    if folder is not None and err is not None and err.code == "store.unreadable":
        # SQLite reports a failed write to the WAL index or a failed open as
        # an I/O error, whatever the cause; the filesystem says which it was.
        if on_read_only_fs(folder):
            return Unavailable(READ_ONLY, code="store.read_only")
        if nearly_full(folder):
            return Full(FULL)
    return err


def nearly_full(folder: Path) -> bool:
    """Less than 1 MiB left for an unprivileged writer: the likeliest reason
    an I/O error happened."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < (1 << 20)


def _storage_error(exc: BaseException) -> StashError | None:
    if isinstance(exc, MissingFile):
        return Unavailable(UNREADABLE, code="store.missing")
    if isinstance(exc, DB_ERRORS):
        code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
        if code == _SQLITE_FULL:
            return Full(FULL)
        if code == _SQLITE_READONLY:
            return Unavailable(READ_ONLY, code="store.read_only")
        if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
            return Damaged(DAMAGED)
        if code == _SQLITE_INTERRUPT:
            # Ended by safeopen's progress handler: the server's shutdown, or a
            # statement the file kept going past any bound a Stash file needs.
            return Stopping() if safeopen.stopping() else Damaged(DAMAGED)
        if code in (_SQLITE_PERM, _SQLITE_IOERR, _SQLITE_CANTOPEN):
            return Unavailable(UNREADABLE, code="store.unreadable")
        return None
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return Full(FULL)
        if exc.errno == errno.EROFS:
            return Unavailable(READ_ONLY, code="store.read_only")
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EIO, errno.ENOENT):
            return Unavailable(UNREADABLE, code="store.unreadable")
    return None


def available_file_cipher() -> str:
    return "sqlcipher" if _sqlcipher is not None else "none"


class UserFiles:
    """The folder of one user under the data directory."""

    def __init__(self, data_dir: Path, user_id: str) -> None:
        self.folder = data_dir / "users" / user_id
        self.keyring = self.folder / "keyring.db"
        self.memory = self.folder / "memory.db"

    def exists(self) -> bool:
        """The user's folder is there (its files may still be missing: that
        is reported as such, not as an unknown user)."""
        return self.folder.is_dir()

    def create_folder(self) -> None:
        private_folder(self.folder.parent)
        self.folder.mkdir(exist_ok=False, mode=0o700)
        os.chmod(self.folder, 0o700)

    def destroy(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=False)

    def destroy_quietly(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def create_private(path: Path) -> None:
    """Make an empty file 0600 before SQLite opens it, whatever the umask:
    SQLite gives its -wal and -shm files the mode of the database file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return
    os.fchmod(fd, 0o600)
    os.close(fd)


def data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """The ``(start, end)`` ranges of an open file that hold data, as the
    file system records them (SEEK_DATA, SEEK_HOLE); the rest are holes,
    which read as zeros and take no disk. The whole file where the file
    system does not tell."""
    at = 0
    while at < size:
        try:
            start = os.lseek(fd, at, os.SEEK_DATA)
            end = os.lseek(fd, start, os.SEEK_HOLE)
        except OSError as e:
            if e.errno == errno.ENXIO:  # no data after ``at``
                return
            yield at, size  # SEEK_DATA unsupported here
            return
        yield start, min(end, size)
        at = end


def overwrite_with_zeros(path: Path) -> None:
    """Write zeros over every byte of a file that holds data, durably, before
    it is removed: its sealed rows and the pages of destroyed keys are then
    not left in the filesystem's free blocks (on a filesystem that writes in
    place). A hole holds nothing and stays a hole, so a sparse file costs
    only what it holds."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        for start, end in list(data_extents(f.fileno(), size)):
            f.seek(start)
            for at in range(start, end, 1 << 20):
                f.write(bytes(min(1 << 20, end - at)))
        f.flush()
        os.fsync(f.fileno())


def private_folder(path: Path) -> None:
    """``path`` and any missing parents made 0700, whatever the umask (mkdir's
    mode is filtered by it, and parents get the default)."""
    missing = []
    p = Path(path)
    while not p.exists():
        missing.append(p)
        p = p.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(folder, 0o700)


def write_private(path: str | Path, data: bytes, *, exclusive: bool = False) -> bool:
    """Write a small file readable by this user only (0600 whatever the
    umask): with ``exclusive``, only when it does not exist yet; otherwise
    whole or not at all (a temporary file renamed over it). Not fsynced: for
    hints that may be lost, like the tag index's stamp. False when it could
    not be written (or, exclusive, already existed)."""
    path = Path(path)
    target = path if exclusive else path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError:
        return False
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    except OSError:
        os.close(fd)
        _unlink_quietly(target)
        return False
    os.close(fd)
    if not exclusive:
        try:
            os.replace(target, path)
        except OSError:
            _unlink_quietly(target)
            return False
    return True


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def can_write(folder: Path) -> bool:
    """Whether a file can be created, written, flushed to disk and removed in
    ``folder`` right now: the readiness probe. It asks the filesystem instead
    of reading permission bits, which say nothing about a read-only mount, a
    full disk or a folder that was replaced."""
    try:
        fd, name = tempfile.mkstemp(prefix=".ready-", dir=folder)
    except OSError:
        return False
    try:
        os.write(fd, b"ready")
        os.fsync(fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        try:
            os.unlink(name)
        except OSError:
            pass


# Connections inside a read_snapshot block, by id: a write there is a bug.
_READING: set[int] = set()


@contextlib.contextmanager
def read_snapshot(conn: sqlite3.Connection) -> Iterator[None]:
    """Read every statement of the block from one snapshot of the file (a
    deferred ``BEGIN``, ended by ``COMMIT``). Outside a transaction each
    statement sees the newest commit, so a forget or an erasure by another
    worker landing between two reads (the settled tree, then a summary it
    names) would look like a damaged file. Inside a transaction already, it
    joins it. A write inside the block raises: a deferred read cannot become
    a write once another writer has committed, so writes take their own
    ``write_transaction`` outside it."""
    if conn.in_transaction:
        yield
        return
    conn.execute("BEGIN")
    _READING.add(id(conn))
    try:
        yield
    finally:
        _READING.discard(id(conn))
        conn.commit()  # ends the read; a no-op if nothing is open any more


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """Hold the file's write lock (``BEGIN IMMEDIATE``) for the block and
    commit it whole, or roll all of it back if the block raises. Inside a
    transaction already, it joins it: the outer block commits, so a write and
    the idempotency record of it land together or not at all."""
    if id(conn) in _READING:
        raise RuntimeError("a write inside a read snapshot: take the write outside read_snapshot")
    if conn.in_transaction:
        yield
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.rollback()
        raise
    conn.commit()


def checkpoint(conn: sqlite3.Connection, attempts: int = 50, pause: float = 0.02) -> bool:
    """``wal_checkpoint(TRUNCATE)`` until it completes: True, or False when
    readers kept it busy for every attempt. Each attempt must not wait in the
    busy handler, or a long reader would hold the request for minutes. A file
    Litestream streams is flushed by Litestream's own checkpoint instead
    (:func:`litestream_flushed`)."""
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        for _ in range(attempts):
            if not conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]:
                return True
            time.sleep(pause)
    finally:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return attempts > 1 and litestream_flushed(conn)


# How long a flush waits for Litestream's checkpoint: many of its sync
# intervals (stash replicate's default is one second). Litestream ships the
# write, then checkpoints at its next timer, two intervals on a quiet host;
# 5 s was once too short on a loaded one (the whole suite's replication
# test answered flushed false), and a flush that times out stays pending.
LITESTREAM_FLUSH_S = 10.0


def _wal_header(path: str) -> bytes | None:
    """The WAL's salts (header bytes 16 to 24), b"" for an empty WAL, None without one."""
    try:
        with open(f"{path}-wal", "rb") as f:
            head = f.read(24)
    except OSError:
        return None
    return head[16:24] if len(head) == 24 else b""


def _streamed(conn: sqlite3.Connection) -> str | None:
    """The file's path when Litestream streams it (its ``-litestream`` folder lies beside it)."""
    row = conn.execute("PRAGMA database_list").fetchone()
    path = row[2] if row else ""
    return path if path and (Path(path).parent / f".{Path(path).name}-litestream").is_dir() else None


def _wal_frames_pages(path: str) -> list[int] | None:
    """The page numbers of the frames of the WAL's current generation (those
    carrying its header's salts), in order; None without a readable WAL."""
    try:
        with open(f"{path}-wal", "rb") as f:
            header = f.read(32)
            if len(header) < 32:
                return []
            page = int.from_bytes(header[8:12], "big")
            salts = header[16:24]
            pages: list[int] = []
            while True:
                frame = f.read(24)
                if len(frame) < 24 or frame[8:16] != salts:
                    return pages
                pages.append(int.from_bytes(frame[:4], "big"))
                f.seek(page, os.SEEK_CUR)
    except OSError:
        return None


def _only_litestreams(conn: sqlite3.Connection, path: str) -> bool:
    """The WAL's current generation holds nothing but Litestream's own row
    (``_litestream_seq``, which it writes after each checkpoint): so it
    restarted after everything written before was checkpointed."""
    pages = _wal_frames_pages(path)
    if pages is None or not pages:
        return pages is not None
    try:
        row = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = '_litestream_seq'").fetchone()
    except DB_ERRORS:
        return False
    return row is not None and set(pages) == {int(row[0])}


def litestream_flushed(conn: sqlite3.Connection, timeout: float = LITESTREAM_FLUSH_S) -> bool:
    """Litestream holds a read transaction on every file it streams, so no
    checkpoint but its own completes; ``stash replicate`` has it checkpoint
    a WAL once an interval after a write of it was shipped. Wait for that:
    True once every frame now in the WAL was checkpointed into the file and
    the WAL restarted or truncated (its salts change, or it empties, or its
    current generation holds only the row Litestream writes after each
    checkpoint: it may have checkpointed between the commit and this call),
    False when the file is not streamed (no ``-litestream`` folder beside
    it) or the wait ran out."""
    path = _streamed(conn)
    if path is None:
        return False
    before = _wal_header(path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = _wal_header(path)
        if now is None or now == b"" or now != before or _only_litestreams(conn, path):
            return True
        time.sleep(0.01)
    return False


FLUSH_WAIT_MS = 5_000
FLUSH_HOLD_MS = 20
"""How long one attempt of :func:`flush` may keep the file's other writers
waiting: a checkpoint that restarts the WAL holds the write lock while it
waits for the readers still using it. Capped, so an agent's note behind a
flush waits a moment, never the whole of a long reader."""
FLUSH_PAUSE_S = 2 * FLUSH_HOLD_MS / 1000  # between attempts: the writers held back by one go first


def flush(conn: sqlite3.Connection, wait_ms: int | None = None) -> bool:
    """Fold the whole WAL into the file and truncate it, so a page version
    that held a destroyed key (or an erased memory's text) survives in
    neither: True once done, False when ``wait_ms`` passed first. Under a
    steady stream of writes the WAL is never empty on its own, so the flush
    makes its moment instead of waiting for one: each attempt waits in
    SQLite's busy handler for the write lock and for the readers of the WAL
    to reach the newest snapshot, holding new writers back meanwhile, but
    for at most :data:`FLUSH_HOLD_MS`; then it lets them go and tries again.
    Readers are never held. A file Litestream streams is flushed by
    Litestream's own checkpoint instead (:func:`litestream_flushed`): its
    read transaction never ends, so ours would never complete."""
    if _streamed(conn) is not None:
        return litestream_flushed(conn)
    deadline = time.monotonic() + (FLUSH_WAIT_MS if wait_ms is None else wait_ms) / 1000
    conn.execute(f"PRAGMA busy_timeout = {FLUSH_HOLD_MS}")
    try:
        while True:
            try:
                if not conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]:
                    return True
            except DB_ERRORS:
                return False
            if time.monotonic() >= deadline:
                return False
            time.sleep(FLUSH_PAUSE_S)
    finally:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")


SQLCIPHER_OPEN_CLOSE = safeopen.SQLCIPHER_OPEN_CLOSE  # one SQLCipher open or close at a time (safeopen.py)

# A connection's page cache, at most (SQLite's default is 2,000 KiB): a wake
# or a note touches a few dozen pages, and a scan gains nothing from a cache;
# what it bounds is the memory of the connections kept open between requests.
CACHE_KIB = 512


def fold(conn: sqlite3.Connection, path: Path) -> None:
    """Checkpoint a WAL that holds frames into the file, in one attempt that
    does not wait: when another connection reads, the last one to finish
    folds it.

    The last close of a file checkpoints its WAL anyway (a write, an
    ``fsync``), and a SQLCipher close must hold :data:`SQLCIPHER_OPEN_CLOSE`:
    done there, every request of the process would queue behind one
    request's disk flush. Done before, the close finds nothing left to
    write; and a connection kept idle (:mod:`stash.storage.pool`) leaves its
    file whole between requests."""
    try:
        if os.stat(f"{path}-wal").st_size == 0:
            return
    except OSError:
        return
    with contextlib.suppress(*DB_ERRORS):
        checkpoint(conn, attempts=1, pause=0.0)


def close_now(path: Path, conn: sqlite3.Connection) -> None:
    """Fold and close for good (a SQLCipher close under the process's lock)."""
    fold(conn, path)
    _close(conn)


def release(conn: sqlite3.Connection, path: Path, file_key: bytes | None, pool: Pool | None = None) -> None:
    """A request is done with ``conn``: keep it idle in ``pool``
    (:mod:`stash.storage.pool`) when there is one, it is on and the connection
    is reusable, else fold its WAL and close it. A kept connection's WAL is
    folded by the pool once its file has been quiet for a moment
    (:func:`_pool_folder`), not here: that is three syncs of each file a
    write touched, off the path of its answer. Whether it is reusable — in
    WAL mode, not holding its file's lock alone — was settled when
    :func:`connect` set it up (:data:`LIVE`); a connection made elsewhere is
    asked."""
    if pool is not None and pool.enabled and not conn.in_transaction:
        try:
            # Neither an immutable open nor one that holds its file's lock alone (connect) is kept.
            live = getattr(conn, LIVE, False) or (conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
                                                  and conn.execute("PRAGMA locking_mode").fetchone()[0] == "normal")
            conn.execute("PRAGMA synchronous = FULL")  # a request may have lowered it for one write
        except DB_ERRORS:
            live = False
        if live:
            if pool.give(path, key_digest(file_key), conn):
                return
    close_now(path, conn)


def _close_stale(path: Path, conn: sqlite3.Connection, held: bool) -> None:
    """How the pool closes a connection whose file changed while it idled,
    in the request that found it so: without folding the WAL first. The
    change is nearly always another worker's write, whose frames that
    worker's pool folds once the file is quiet; a fold here would put that
    fold's syncs in this request, and make the other worker's connection
    stale in turn. A close that is the file's last anywhere still folds the
    WAL, as SQLite's last close does (held under :data:`SQLCIPHER_OPEN_CLOSE`:
    rare, a file that changed with no other connection open to it)."""
    with _users_lock(path, held):
        _close(conn)


def _users_lock(path: Path, held: bool) -> contextlib.AbstractContextManager[None]:
    """What a pool's close of ``path`` holds: the user's lock shared for a
    memory file (its last close may remove the WAL, which a backup copies),
    unless the caller holds that lock already; nothing for a key ring."""
    return contextlib.nullcontext() if held or path.name != "memory.db" else userlock.shared(path.parent)


def _close(conn: sqlite3.Connection) -> None:
    safeopen.close(conn)


def _pool_closer(path: Path, conn: sqlite3.Connection, held: bool) -> None:
    """How the pool closes a connection for good: a memory file's under the
    user's lock held shared (unless the caller holds that user's lock
    already), so a backup never copies it while its WAL is removed."""
    with _users_lock(path, held):
        close_now(path, conn)


def _pool_folder(path: Path, conn: sqlite3.Connection, sig: Signature) -> Signature | None:
    """How the pool folds a kept connection's WAL once its file went quiet:
    under the user's lock held shared, as a request holds it, so a backup or
    a verify (which copy the files under it held exclusive) never sees a
    file half folded. Returns the file's signature after the fold; the one
    it had when the lock is held exclusive now (tried again later); None,
    with the connection closed, when the file changed while idle (replaced,
    restored, written by another process), so that the next request opens
    and checks it afresh, or when the fold failed."""
    try:
        with userlock.shared_now(path.parent) as held:
            if not held:
                return sig
            if signature(path) != sig:
                _close_stale(path, conn, True)
                return None
            fold(conn, path)
            return signature(path)
    except Exception as exc:  # the pool's thread must outlive any one file; no path or message is logged
        logging.getLogger("stash.error").error("a kept file's fold failed (%s); its connection was closed",
                                               type(exc).__name__)
        with contextlib.suppress(Exception):
            _pool_closer(path, conn, False)
        return None


def new_pool(idle_seconds: float, max_idle: int = MAX_IDLE) -> Pool:
    """A pool that keeps connections idle ``idle_seconds`` (0: none), folds
    their WALs once their files went quiet and closes them as this module
    does; its owner closes it. The page caches of this process's connections
    are held to :data:`HEAP_BYTES` together from then on
    (:func:`limit_page_caches`)."""
    if idle_seconds > 0 and max_idle > 0:
        limit_page_caches(HEAP_BYTES)
    return Pool(idle_seconds, max_idle, closer=_pool_closer, folder=_pool_folder, stale_closer=_close_stale,
                trim=return_free_heap)


def _malloc_trim() -> Callable[[int], object] | None:
    try:
        trim: Callable[[int], object] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc: nothing to call
    return trim


_MALLOC_TRIM = _malloc_trim()


def return_free_heap() -> bool:
    """Hand the memory this process has freed back to the system (glibc's
    ``malloc_trim``); False where the C library has none. A worker allocates
    and frees from many threads (page caches, sealed rows, answers); glibc
    keeps what was freed below the top of its heaps, so a worker's resident
    memory rose for the whole of a 10-minute load run, in its anonymous
    pages, while neither Python's heap nor SQLite's did (bench/HISTORY.md,
    "Item 5's RSS: the free heap given back"). Called by
    the pool's thread every 5 s; it changes nothing a connection
    holds."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True


HEAP_BYTES = 12 * 2**20
"""What SQLite may hold on the heap in a server process, page caches above
all, in each of the two SQLite libraries it loads (SQLCipher's and the
standard library's). Without a limit each of up to MAX_IDLE kept connections
grows its own cache to CACHE_KIB as its memory is used. The budget is about
what a worker's caches hold after the first minute of the load test (10–12
MiB in SQLCipher's library, 7–8 in the other), so under load they stop
growing there instead of climbing on towards a larger bound as the users'
files grow: at 32 MiB a worker's RSS still rose 10–13 % over a 10-minute
soak, at 12 MiB it levelled within 10 % with the same throughput
(bench/HISTORY.md, "Issue 27, item 5: the page caches' budget"). A single memory's requests stay within
their connection's CACHE_KIB, far below it."""


def limit_page_caches(limit: int) -> None:
    """Set SQLite's soft heap limit, process-wide, in each SQLite library this
    process uses: past it a connection recycles its own least recently used
    clean pages instead of allocating new ones, so the sum of the caches
    stops growing (what a page holds is read again from the file). Nothing a
    connection reads or writes depends on it."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute(f"PRAGMA soft_heap_limit = {int(limit)}")
    finally:
        conn.close()
    if _sqlcipher is not None:
        with SQLCIPHER_OPEN_CLOSE:
            other = _sqlcipher.connect(":memory:")
        try:
            other.execute(f"PRAGMA soft_heap_limit = {int(limit)}")
        finally:
            with SQLCIPHER_OPEN_CLOSE:
                other.close()


def _refuse_empty(path: Path) -> None:
    """Refuse to open an existing file that holds nothing: :class:`MissingFile`
    when it is not there, :class:`EmptyFile` when it is 0 bytes.

    SQLite takes an empty file for a new database and writes a header into it
    on the first statement that sets it up (``journal_mode = WAL``): opened,
    a file cut to 0 bytes would become a valid, empty 4 KiB database and the
    evidence of the damage would be gone. Every other kind of damage is found
    by SQLite's own reading of the first page, before anything is written."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise MissingFile(path.name) from None
    if not stat.S_ISREG(st.st_mode):
        raise MissingFile(path.name)
    if st.st_size == 0:
        raise EmptyFile(path.name)


def _frozen(path: Path) -> bool:
    """The file is on a read-only filesystem and has no WAL beside it."""
    return on_read_only_fs(path.parent) and not Path(str(path) + "-wal").exists()


def connect(path: Path, *, file_key: bytes | None, cipher: str, create: bool = False,
            page_bytes: int | None = None, pool: Pool | None = None) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL, fsync
    on commit, and freed pages overwritten so destroyed keys leave no copy.
    Without ``create`` a missing file is :class:`MissingFile`, never a new
    empty one. ``page_bytes``: the page size of a new file, and the one a
    SQLCipher file is read with (PAGE_BYTES when None); a plain file that
    exists keeps the one its header records. ``pool``: where a connection
    kept idle since an earlier request may be taken back from. Before it is
    handed over, the file's schema is checked to be one Stash makes
    (:mod:`stash.storage.safeopen`): a crafted view or trigger never runs."""
    page = PAGE_BYTES if page_bytes is None else page_bytes
    if not create:
        _refuse_empty(Path(path))
    if not create and pool is not None and pool.enabled:
        kept = pool.take(Path(path), key_digest(file_key))
        if kept is not None:
            return kept
    if create:
        create_private(Path(path))
    frozen = not create and _frozen(Path(path))
    # On a read-only filesystem SQLite cannot make the WAL's index, so a WAL
    # file could not be opened at all; a file whose WAL was folded in and
    # removed (as the last close does) is whole in itself, and is opened as
    # immutable: readable, and every write refused as read-only.
    target = f"file:{quote(Path(path).resolve().as_posix())}?immutable=1" if frozen else str(path)
    conn = _open(target, cipher, file_key, page, uri=frozen)
    if frozen:
        try:
            safeopen.check_schema(conn, Path(path).name)
        except BaseException:
            _close(conn)
            raise
        return conn
    try:
        wal = _set_up(conn)
        safeopen.check_schema(conn, Path(path).name)
        if wal:
            setattr(conn, LIVE, True)
    except DB_ERRORS as exc:
        _close(conn)
        if create or not isinstance(storage_error(exc, Path(path).parent), Full):
            raise
        conn = _open(target, cipher, file_key, page, uri=False)
        try:
            # No room on the disk for the WAL's shared index (a 32 KiB -shm
            # file, made by the first connection to open the file and removed
            # by the last to close it): with this process holding the file's
            # lock alone, SQLite keeps that index in its own memory instead,
            # so the file can still be read. Other processes wait on the lock
            # for the length of this request (release never keeps it open).
            conn.execute("PRAGMA locking_mode = EXCLUSIVE")
            _set_up(conn)
            safeopen.check_schema(conn, Path(path).name)
        except BaseException:
            _close(conn)
            raise
    except BaseException:
        _close(conn)
        raise
    return conn


LIVE = "stash_live"
"""The attribute :func:`connect` sets on a connection it set up in WAL mode
with the normal locking mode, so :func:`release` need not ask SQLite."""


def _open(target: str, cipher: str, file_key: bytes | None, page: int, *, uri: bool) -> sqlite3.Connection:
    return safeopen.open_file(target, cipher=cipher, key=file_key, page=page, uri=uri,
                              timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)


def _set_up(conn: sqlite3.Connection) -> bool:
    """Set a new connection up; whether it is in WAL mode now."""
    wal: bool = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal"
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA secure_delete = ON")
    conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
    conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_PAGES}")
    conn.execute(f"PRAGMA journal_size_limit = {WAL_PAGES * LEGACY_PAGE_BYTES}")
    return wal


WAL_PAGES = 256
"""The most pages a WAL gathers before the write that passes it folds it in
(SQLite's automatic checkpoint; 1,000 by default). A file written without a
quiet moment is folded by the pool only once it goes quiet (:func:`release`),
so this bounds the WAL of a busy memory to about 1 MiB (and the disk a
memory's quota counts beyond its file), for two syncs every 25 or so notes."""


def fsync_path(path: Path) -> None:
    """Flush a file, or a folder's entries (a rename in it), to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
