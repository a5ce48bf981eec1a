"""Files and folders readable by this user only, whatever the umask, and
their bytes made durable or overwritten: what every file of a data folder
is made with."""

from __future__ import annotations

import errno
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path


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


def fsync_path(path: Path) -> None:
    """Flush a file, or a folder's entries (a rename in it), to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
