"""Which files of a data folder are Stash's own: the one rule ``stash
replicate``, ``stash restore`` and ``stash verify`` share (docs/DESIGN.md,
"Replication").

A user's folder is ``users/<16 hex digits>/`` and holds exactly the files
named here; anything else found in it (another ``*.db``, a nested folder, a
file named like ours with a suffix) is not a user's data: it is never
replicated or restored, and ``stash verify`` names it. A new kind of file or
folder under a user (per-memory folders, say) is added here, once.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

from .private_files import private_folder

USER_ID = re.compile(r"[0-9a-f]{16}")
# The two files a user's memory is (replicated, backed up, restored).
DATA_FILES = ("keyring.db", "memory.db")
# Rebuilt from the log: never replicated, backed up when present.
CACHE_FILES = ("recall.db",)
SQLITE_SIDE = ("-wal", "-shm", "-journal")
# Empty lock files, the tag index's hint, a readiness probe's file while it runs.
SMALL_FILES = ("lock", "gate", "grants.stamp")
PROBE = re.compile(r"\.ready-[A-Za-z0-9_]+")
# What Litestream keeps beside each file it streams.
LITESTREAM_FOLDER = re.compile(r"\.(keyring|memory)\.db-litestream")


def known_file(name: str) -> bool:
    """Whether ``name``, directly in a user's folder, is one of Stash's own."""
    for base in (*DATA_FILES, *CACHE_FILES):
        if name == base or any(name == base + side for side in SQLITE_SIDE):
            return True
    return name in SMALL_FILES or PROBE.fullmatch(name) is not None


def known_folder(name: str) -> bool:
    """Whether ``name``, directly in a user's folder, is a folder of ours."""
    return LITESTREAM_FOLDER.fullmatch(name) is not None


MEMORIES = "m"
"""A user's other memories: ``m/<name>/``, each holding the same files as the user's folder."""
MEMORY_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
MEMORY_IN_PASSING = re.compile(r"\.(new|gone)-.+")  # a memory being built or deleted (storage/memories/__init__.py)


def unknown_in_user(folder: Path, *, memory: bool = False) -> list[str]:
    """What a user's folder holds that is not Stash's, as names relative to
    it (a folder ends in ``/``), sorted. ``memory``: the folder is one of
    the user's other memories, which holds no ``m/`` of its own."""
    out = []
    for entry in sorted(Path(folder).iterdir()):
        mode = _mode(entry)
        if mode is None:
            continue  # a WAL or shared-memory file SQLite removed at a live server's last close, meanwhile
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):  # a symlink, a socket, a device...
            out.append(entry.name)
        elif stat.S_ISDIR(mode):
            if entry.name == MEMORIES and not memory:
                out += [f"{MEMORIES}/{name}" for name in _unknown_memories(entry)]
            elif not known_folder(entry.name):
                out.append(entry.name + "/")
        elif not known_file(entry.name):
            out.append(entry.name)
    return out


def _mode(entry: Path) -> int | None:
    """The entry's own mode (a symlink's, not its target's), read once, or
    None when the name a folder listing gave is gone: a user's folder is
    listed while a server may serve it."""
    try:
        return entry.lstat().st_mode
    except FileNotFoundError:
        return None


def _unknown_memories(folder: Path) -> list[str]:
    out = []
    for entry in sorted(folder.iterdir()):
        named = MEMORY_NAME.fullmatch(entry.name) or MEMORY_IN_PASSING.fullmatch(entry.name)
        if entry.is_symlink() or not entry.is_dir() or not named:
            out.append(entry.name + ("/" if entry.is_dir() and not entry.is_symlink() else ""))
        else:
            out += [f"{entry.name}/{name}" for name in unknown_in_user(entry, memory=True)]
    return out


def unknown_in_users(users: Path) -> list[str]:
    """What ``users/`` holds that is not a user's folder (names relative to
    it; a folder ends in ``/``), readiness probes excepted."""
    out = []
    for entry in sorted(Path(users).iterdir()):
        if entry.is_dir() and not entry.is_symlink() and USER_ID.fullmatch(entry.name):
            continue
        if entry.is_file() and PROBE.fullmatch(entry.name):
            continue
        if entry.name.startswith(".restore-") and entry.is_dir():
            continue  # a restore staging its files
        out.append(entry.name + ("/" if entry.is_dir() else ""))
    return out


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
