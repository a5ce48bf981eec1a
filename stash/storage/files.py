"""Where each user's files live, and how a SQLite connection is opened."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

from ..core.errors import Damaged, Full, StashError, Unavailable
from . import userlock
from .pool import POOL, key_digest

try:  # SQLCipher is optional: without it the file is plain SQLite, rows still sealed
    import sqlcipher3.dbapi2 as _sqlcipher
except ImportError:  # pragma: no cover - depends on the platform's wheels
    _sqlcipher = None

FILE_CIPHERS = ("sqlcipher", "none")
# The page size of every file this release creates. An empty identity is a
# handful of pages (schema.sql, "Layout on disk"), so the page is what its
# size is counted in: 4 KiB, the filesystem's block, not the 16 KiB of
# earlier releases (bench/README.md, Goal 3, gives both measurements).
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
_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_CORRUPT = 3, 8, 10, 11
_SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 13, 14, 26

FULL = ("The server's disk is full, so nothing was written; memories already acknowledged are safe. "
        "Tell the operator to free space, then retry.")
READ_ONLY = ("The server's data folder is read-only, so nothing was written; memories already acknowledged are "
             "safe. Tell the operator to make it writable, then retry.")
UNREADABLE = ("This memory's file cannot be read right now (missing, unreadable or an I/O error); nothing was "
              "changed. Tell the operator to run `stash verify` and restore it from a backup if needed.")
DAMAGED = "This memory's file is damaged and was not served; the operator should run `stash verify` and restore it."


class MissingFile(Exception):
    """A user's file that must exist is not there."""


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


def _create_private(path: Path) -> None:
    """Make an empty file 0600 before SQLite opens it, whatever the umask:
    SQLite gives its -wal and -shm files the mode of the database file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return
    os.fchmod(fd, 0o600)
    os.close(fd)


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


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """Hold the file's write lock (``BEGIN IMMEDIATE``) for the block and
    commit it whole, or roll all of it back if the block raises. Inside a
    transaction already, it joins it: the outer block commits, so a write and
    the idempotency record of it land together or not at all."""
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
    busy handler, or a long reader would hold the request for minutes."""
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        for _ in range(attempts):
            if not conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]:
                return True
            time.sleep(pause)
        return False
    finally:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")


FLUSH_WAIT_MS = 5_000


def flush(conn: sqlite3.Connection, wait_ms: int | None = None) -> bool:
    """Fold the whole WAL into the file and truncate it, so a page version
    that held a destroyed key survives in neither: True once done, False when
    ``wait_ms`` passed first. Unlike :func:`checkpoint` it waits, in SQLite's
    busy handler, for the writer lock and for every reader to reach the
    newest snapshot, and while it waits it holds new writers back: under a
    steady stream of writes the WAL is never empty on its own, so the flush
    makes its moment instead of waiting for one. Readers are never held."""
    conn.execute(f"PRAGMA busy_timeout = {FLUSH_WAIT_MS if wait_ms is None else int(wait_ms)}")
    try:
        return not conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    except DB_ERRORS:
        return False
    finally:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")


# One thread at a time opens or closes a SQLCipher connection in this process.
# Under sustained concurrent load (bench/load.py: 16 connections over 50 users)
# the server stalled for good within a minute in two runs of three with
# SQLCipher 4.12.0 (SQLite 3.51.1): every worker thread waited on SQLite's VFS
# mutex (unixEnterMutex, from findReusableFd in open and unixShmBarrier in the
# WAL), the signature of a lock-order inversion reported against that release.
# pyproject.toml pins the SQLCipher 4.6.0 build, under which the same load ran
# clean; this lock stays as the second guard, since opens and closes are where
# the threads met. An open costs about a millisecond.
SQLCIPHER_OPEN_CLOSE = threading.Lock()

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
    if _sqlcipher is not None and isinstance(conn, _sqlcipher.Connection):
        with SQLCIPHER_OPEN_CLOSE:
            conn.close()
    else:
        conn.close()


def release(conn: sqlite3.Connection, path: Path, file_key: bytes | None) -> None:
    """A request is done with ``conn``: keep it idle in the process's pool
    (:mod:`stash.storage.pool`) when the pool is on and the connection is
    reusable, else close it. Either way its WAL is folded first."""
    if POOL.enabled and not conn.in_transaction:
        try:
            live = conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # an immutable open is not
            conn.execute("PRAGMA synchronous = FULL")  # a request may have lowered it for one write
        except DB_ERRORS:
            live = False
        if live:
            fold(conn, path)
            if POOL.give(path, key_digest(file_key), conn):
                return
    close_now(path, conn)


def _pool_closer(path: Path, conn: sqlite3.Connection, held: bool) -> None:
    """How the pool closes a connection for good: a memory file's under the
    user's lock held shared (unless the caller holds that user's lock
    already), so a backup never copies it while its WAL is removed."""
    if held or path.name != "memory.db":
        close_now(path, conn)
        return
    with userlock.shared(path.parent):
        close_now(path, conn)


POOL.closer = _pool_closer


def _frozen(path: Path) -> bool:
    """The file is on a read-only filesystem and has no WAL beside it."""
    return on_read_only_fs(path.parent) and not Path(str(path) + "-wal").exists()


def connect(path: Path, *, file_key: bytes | None, cipher: str, create: bool = False,
            page_bytes: int | None = None) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL, fsync
    on commit, and freed pages overwritten so destroyed keys leave no copy.
    Without ``create`` a missing file is :class:`MissingFile`, never a new
    empty one. ``page_bytes``: the page size of a new file, and the one a
    SQLCipher file is read with (PAGE_BYTES when None); a plain file that
    exists keeps the one its header records."""
    page = PAGE_BYTES if page_bytes is None else page_bytes
    if not create and not Path(path).is_file():
        raise MissingFile(path.name)
    if not create and POOL.enabled:
        kept = POOL.take(Path(path), key_digest(file_key))
        if kept is not None:
            return kept
    if create:
        _create_private(Path(path))
    frozen = not create and _frozen(Path(path))
    # On a read-only filesystem SQLite cannot make the WAL's index, so a WAL
    # file could not be opened at all; a file whose WAL was folded in and
    # removed (as the last close does) is whole in itself, and is opened as
    # immutable: readable, and every write refused as read-only.
    target = f"file:{quote(Path(path).resolve().as_posix())}?immutable=1" if frozen else str(path)
    conn: sqlite3.Connection  # sqlcipher3's connection has the same interface
    if cipher == "sqlcipher":
        if _sqlcipher is None:
            raise RuntimeError("this store needs SQLCipher, which is not installed here")
        with SQLCIPHER_OPEN_CLOSE:
            conn = _sqlcipher.connect(
                target, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False, uri=frozen
            )
        # A file that fails to open is reported to the caller as damage; the
        # library's own stderr lines about it would only be noise in the log.
        conn.execute("PRAGMA cipher_log_level = NONE")
        if file_key is None:
            raise ValueError("a SQLCipher file needs its key")
        conn.execute(f"PRAGMA key = \"x'{file_key.hex()}'\"")
        # Not stored in the encrypted header, so every open must say it. A
        # wrong size (an edited key ring) fails the first page's HMAC: the
        # file is refused as damaged, never read some other way.
        conn.execute(f"PRAGMA cipher_page_size = {page}")
    else:
        conn = sqlite3.connect(target, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False,
                               uri=frozen)
        conn.execute(f"PRAGMA page_size = {page}")  # takes effect when the file is created
    if frozen:
        return conn
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA secure_delete = ON")
        conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
    except Exception:
        conn.close()
        raise
    return conn
