"""``stash backup``: a consistent copy of every user's files while the server
keeps serving, taken without any token.

Per user, in turn: the key ring is copied with SQLite's online backup API (it
is plain SQLite, and grants may be minted meanwhile), and so is a plain memory
file (``--file-cipher none``, which Litestream may be checkpointing); a
SQLCipher memory file, which cannot be read without a key, is copied as bytes
while the user's lock is held exclusive (:mod:`stash.storage.userlock`), when no request
has it open. The key ring is copied under the same lock, so its copy of the
log head is never ahead of the memory file it describes. Each user's requests
wait for the length of that user's copy, never fail.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from ..storage import userlock
from ..storage.files import fsync_path, private_folder
from . import memory_ops
from .verify import Report, user_folders, verify_user


class BackupRefused(Exception):
    """The destination cannot take a backup; the message says why."""


@dataclass
class Copied:
    user_id: str
    copied: bool
    note: str = ""


def _fsync(path: Path) -> None:
    fsync_path(path)


def _plain(path: Path) -> bool:
    """A plain SQLite file (``--file-cipher none``), not SQLCipher."""
    with open(path, "rb") as f:
        return f.read(16) == b"SQLite format 3\x00"


def _copy_plain(src: Path, dst: Path) -> None:
    source = sqlite3.connect(str(src), isolation_level=None)
    try:
        target = sqlite3.connect(str(dst), isolation_level=None)
        try:
            source.backup(target)
            # The copy stays in WAL mode like its source; fold it into one file.
            target.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            target.close()
    finally:
        source.close()
    Path(str(dst) + "-wal").unlink(missing_ok=True)
    Path(str(dst) + "-shm").unlink(missing_ok=True)


def _copy_user(folder: Path, target: Path) -> Copied:
    with userlock.exclusive(folder):
        keyring, memory = folder / "keyring.db", folder / "memory.db"
        if not keyring.is_file() or not memory.is_file():
            return Copied(folder.name, False, "skipped: its files are incomplete (being created or destroyed)")
        target.mkdir(mode=0o700)
        _copy_plain(keyring, target / "keyring.db")
        if _plain(memory):
            # A plain file may be open in another process that takes no user
            # lock (Litestream, checkpointing it): SQLite's backup API copies
            # one consistent state whatever it does.
            _copy_plain(memory, target / "memory.db")
        else:
            # No request has the memory file open: it and any WAL left by a
            # crash are at rest, and together they are one consistent state.
            for name in ("memory.db", "memory.db-wal"):
                if (folder / name).is_file():
                    shutil.copyfile(folder / name, target / name)
        for path in target.iterdir():
            path.chmod(0o600)
            _fsync(path)
    _fsync(target)
    return Copied(folder.name, True)


def backup(data_dir: Path, dest: Path) -> list[tuple[Copied, Report | None]]:
    """Copy every user under ``data_dir`` into ``dest`` (which must not exist
    or be empty; it is made 0700, as is every folder in it), then check each
    copy as ``stash verify`` would without a token."""
    data_dir, dest = Path(data_dir), Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BackupRefused("the destination exists and is not an empty folder; choose a new one")
    if dest.resolve() == data_dir.resolve() or data_dir.resolve() in dest.resolve().parents:
        raise BackupRefused("the destination is inside the data folder; choose a folder outside it")
    folders = list(user_folders(data_dir))
    # 0700 from the top whatever the umask, so the folder `cp -a` restores from it is the server's alone too.
    private_folder(dest / "users")
    os.chmod(dest, 0o700)
    out = []
    for folder in folders:
        copied = _copy_user(folder, dest / "users" / folder.name)
        if copied.copied:  # and every other memory of this user (docs/DESIGN.md, "Memories")
            memory_ops.backup_memories(folder, dest / "users" / folder.name, _copy_user)
        report = verify_user(dest / "users" / folder.name) if copied.copied else None
        out.append((copied, report))
    _fsync(dest / "users")
    return out
