"""The lock that lets ``stash backup`` copy a memory file whole while the
server runs, without any key.

A SQLCipher file cannot be read without its key, so neither SQLite's backup
API nor a read transaction can copy it keyless. Instead every server request
that opens a memory file holds the user's lock *shared* from before it opens
the file until after it has closed it (SQLite checkpoints, and may delete the
WAL, when the last connection closes), and a backup takes it *exclusive*: while
it holds it no process has the file open, so the file and its WAL are at rest
and a plain copy of them is a consistent one.

``flock`` alone lets a steady stream of overlapping shared holders starve an
exclusive one, so a second lock, the gate, is taken first: a request holds the
gate shared only while it queues for the lock; a backup holds it exclusive, so
new requests wait behind the backup (for one user's copy) instead of ahead.
Locks are per open file, so they work across threads and processes, and the
kernel drops them when a process dies, even by ``kill -9``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_NAME = "lock"
GATE_NAME = "gate"


def _open(path: Path, create: bool = True) -> int | None:
    """The lock file, created if need be (and ``create``); None when it
    neither exists nor can be created (a read-only folder: nothing there can
    be written, so there is nothing to keep a copy consistent against; or a
    folder no server has used)."""
    try:
        return os.open(path, os.O_RDWR | (os.O_CREAT if create else 0) | os.O_CLOEXEC, 0o600)
    except OSError:
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None


class UserLock:
    """One holder of one user's lock."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._fd: int | None = None

    def acquire_shared(self) -> None:
        gate = _open(self.folder / GATE_NAME)
        try:
            if gate is not None:
                fcntl.flock(gate, fcntl.LOCK_SH)
            fd = _open(self.folder / LOCK_NAME)
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_SH)
            self._fd = fd
        finally:
            if gate is not None:
                os.close(gate)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the file drops its lock
            self._fd = None


@contextlib.contextmanager
def shared_now(folder: Path) -> Iterator[bool]:
    """The user's lock held shared if it is free of an exclusive holder right
    now: yields True while held, False (nothing held) when a backup, a verify
    or an owner's action holds or queues for it. For the server's own
    background work, which tries again later rather than wait."""
    gate = _open(Path(folder) / GATE_NAME)
    fd: int | None = None
    try:
        try:
            if gate is not None:
                fcntl.flock(gate, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fd = _open(Path(folder) / LOCK_NAME)
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        finally:
            if gate is not None:
                os.close(gate)
        yield True
    finally:
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def shared(folder: Path) -> Iterator[None]:
    lock = UserLock(folder)
    lock.acquire_shared()
    try:
        yield
    finally:
        lock.release()


def _flock_within(fd: int, deadline: float) -> bool:
    """LOCK_EX on ``fd`` unless ``deadline`` (time.monotonic) passes first."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)


@contextlib.contextmanager
def exclusive_within(folder: Path, seconds: float) -> Iterator[bool]:
    """:func:`exclusive` for at most ``seconds`` of waiting: yields True
    while held, or False (held by nobody) when the user's requests in
    progress did not all end in time. New requests queue behind it (the gate)
    while it waits, so the wait is bounded by the requests already running."""
    gate = _open(Path(folder) / GATE_NAME)
    lock = _open(Path(folder) / LOCK_NAME)
    deadline = time.monotonic() + seconds
    try:
        got = all(_flock_within(fd, deadline) for fd in (gate, lock) if fd is not None)
        yield got
    finally:
        for fd in (lock, gate):
            if fd is not None:
                os.close(fd)


@contextlib.contextmanager
def exclusive(folder: Path, create: bool = True) -> Iterator[None]:
    """Hold off every request of this user: returns once none has its files
    open, and keeps new ones waiting until the block ends. ``create=False``
    takes only the lock files a server already made (``stash verify``
    creates nothing in what it checks)."""
    gate = _open(Path(folder) / GATE_NAME, create)
    lock = _open(Path(folder) / LOCK_NAME, create)
    try:
        if gate is not None:
            fcntl.flock(gate, fcntl.LOCK_EX)
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        for fd in (lock, gate):
            if fd is not None:
                os.close(fd)
