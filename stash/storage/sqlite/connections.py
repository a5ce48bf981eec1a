"""How a SQLite connection to a user's file is opened, set up, kept open
between requests (:mod:`stash.storage.sqlite.pool`) and closed."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from ...core.errors import Full
from .. import safeopen, userlock
from ..disk_errors import DB_ERRORS, EmptyFile, MissingFile, on_read_only_fs, storage_error
from ..formats import LEGACY_PAGE_BYTES, PAGE_BYTES
from ..private_files import create_private
from .pool import MAX_IDLE, Pool, Signature, key_digest, signature
from .transactions import BUSY_TIMEOUT_MS, checkpoint

try:  # SQLCipher is optional: without it the file is plain SQLite, rows still sealed
    import sqlcipher3.dbapi2 as _sqlcipher
except ImportError:  # pragma: no cover - depends on the platform's wheels
    _sqlcipher = None


def available_file_cipher() -> str:
    return "sqlcipher" if _sqlcipher is not None else "none"


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
    write; and a connection kept idle (:mod:`stash.storage.sqlite.pool`) leaves its
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
    (:mod:`stash.storage.sqlite.pool`) when there is one, it is on and the connection
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
            live = getattr(conn, LIVE, False) or (
                conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
                and conn.execute("PRAGMA locking_mode").fetchone()[0] == "normal"
            )
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
        logging.getLogger("stash.error").error(
            "a kept file's fold failed (%s); its connection was closed", type(exc).__name__
        )
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
    return Pool(
        idle_seconds,
        max_idle,
        closer=_pool_closer,
        folder=_pool_folder,
        stale_closer=_close_stale,
        trim=return_free_heap,
    )


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


def connect(
    path: Path,
    *,
    file_key: bytes | None,
    cipher: str,
    create: bool = False,
    page_bytes: int | None = None,
    pool: Pool | None = None,
) -> sqlite3.Connection:
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
    return safeopen.open_file(
        target, cipher=cipher, key=file_key, page=page, uri=uri, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
    )


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
