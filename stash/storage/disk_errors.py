"""What a failure of the disk or of a SQLite file means for the caller: the
exceptions SQLite raises, the refusal each one is reported as (full, read-only,
unreadable, damaged), and the files found missing or empty before an open."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from ..core.errors import Damaged, Full, StashError, Stopping, Unavailable
from . import safeopen

try:  # SQLCipher is optional: without it the file is plain SQLite, rows still sealed
    import sqlcipher3.dbapi2 as _sqlcipher
except ImportError:  # pragma: no cover - depends on the platform's wheels
    _sqlcipher = None


DB_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error,) + ((_sqlcipher.Error,) if _sqlcipher is not None else ())

# SQLite's primary result codes (sqlite3.h) that mean the storage, not the request, failed.
_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_INTERRUPT, _SQLITE_IOERR, _SQLITE_CORRUPT = 3, 8, 9, 10, 11
_SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 13, 14, 26

FULL = (
    "The server's disk is full, so nothing was written; what was acknowledged before is safe. "
    "Tell the operator to free space, then retry."
)
READ_ONLY = (
    "The server's data folder is read-only, so nothing was written; what was acknowledged before is "
    "safe. Tell the operator to make it writable, then retry."
)
UNREADABLE = (
    "This memory's file cannot be read right now (missing, unreadable or an I/O error); nothing was "
    "changed. Tell the operator to run `stash verify` and restore it from a backup if needed."
)
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
