"""Where each user's files live, and how a SQLite connection is opened."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

try:  # SQLCipher is optional: without it the file is plain SQLite, rows still sealed
    import sqlcipher3.dbapi2 as _sqlcipher
except ImportError:  # pragma: no cover - depends on the platform's wheels
    _sqlcipher = None

FILE_CIPHERS = ("sqlcipher", "none")
PAGE_BYTES = 16384
BUSY_TIMEOUT_MS = 30_000


def available_file_cipher() -> str:
    return "sqlcipher" if _sqlcipher is not None else "none"


class UserFiles:
    """The folder of one user under the data directory."""

    def __init__(self, data_dir: Path, user_id: str) -> None:
        self.folder = data_dir / "users" / user_id
        self.keyring = self.folder / "keyring.db"
        self.memory = self.folder / "memory.db"

    def exists(self) -> bool:
        return self.keyring.is_file()

    def create_folder(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=False, mode=0o700)

    def destroy(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=False)


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


def connect(path: Path, *, file_key: bytes | None, cipher: str) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL, fsync
    on commit, and freed pages overwritten so destroyed keys leave no copy."""
    if cipher == "sqlcipher":
        if _sqlcipher is None:
            raise RuntimeError("this store needs SQLCipher, which is not installed here")
        conn = _sqlcipher.connect(
            str(path), isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
        )
        # A file that fails to open is reported to the caller as damage; the
        # library's own stderr lines about it would only be noise in the log.
        conn.execute("PRAGMA cipher_log_level = NONE")
        if file_key is None:
            raise ValueError("a SQLCipher file needs its key")
        conn.execute(f"PRAGMA key = \"x'{file_key.hex()}'\"")
        # SQLCipher authenticates every page it reads; larger pages mean fewer
        # HMACs on a full scan (recall reads the whole log). Not stored in the
        # encrypted header, so every open must say it.
        conn.execute(f"PRAGMA cipher_page_size = {PAGE_BYTES}")
    else:
        conn = sqlite3.connect(str(path), isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
        conn.execute(f"PRAGMA page_size = {PAGE_BYTES}")  # takes effect when the file is created
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA secure_delete = ON")
    except Exception:
        conn.close()
        raise
    return conn
