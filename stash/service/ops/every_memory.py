"""What an operator runs covers every memory of every identity
(docs/DESIGN.md, "Memories"): ``stash backup`` copies each memory's folder
under that memory's own lock, and ``stash verify`` copies every memory's
files to check them (verify.py checks each as it checks main)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ...storage import memories, userlock
from ...storage.memories import MAIN, SUBFOLDER
from ...storage.private_files import overwrite_with_zeros, private_folder

COPIED = ("keyring.db", "memory.db", "keyring.db-wal", "memory.db-wal")


def others(folder: Path) -> list[str]:
    """The memories of the user whose folder is ``folder``, main left out."""
    return memories.names(folder.parent.parent, folder.name)[1:]


def backup_memories(folder: Path, target: Path, copy: Callable[[Path, Path], Any]) -> list[Any]:
    """Copy each memory of ``folder`` but main into ``target``'s ``m/``, each
    with ``copy`` (backup.py's, which holds that memory's lock)."""
    out = []
    for name in others(folder):
        private_folder(target / SUBFOLDER)
        out.append(copy(folder / SUBFOLDER / name, target / SUBFOLDER / name))
    return out


@contextlib.contextmanager
def private_identity(folder: Path) -> Iterator[Path]:
    """Every memory's files of the user, copied under each memory's lock into
    a private temporary data folder, zeroed and removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="stash-verify-memories-") as tmp:
        root = Path(tmp) / "users" / folder.name
        try:
            for name in [MAIN, *others(folder)]:
                src = folder if name == MAIN else folder / SUBFOLDER / name
                dst = root if name == MAIN else root / SUBFOLDER / name
                dst.mkdir(parents=True, mode=0o700)
                _copy_memory(src, dst)
            yield Path(tmp)
        finally:
            for path in root.rglob("*"):
                if path.is_file():
                    with contextlib.suppress(OSError):
                        overwrite_with_zeros(path)


COPY_ATTEMPTS = 3


def _copy_memory(src: Path, dst: Path) -> None:
    """One memory's files, copied under its lock. A server closing its last
    connection to a file removes the file's ``-wal`` once it has folded it
    in, which may fall between the look and the copy: the copy is then made
    again, whole, up to :data:`COPY_ATTEMPTS` times."""
    for attempt in range(COPY_ATTEMPTS):
        for old in dst.iterdir():
            overwrite_with_zeros(old)
            old.unlink()
        try:
            with userlock.exclusive(src, create=False):
                for file in COPIED:
                    if (src / file).is_file() and not (src / file).is_symlink():
                        shutil.copyfile(src / file, dst / file)
            return
        except FileNotFoundError:
            if attempt == COPY_ATTEMPTS - 1:
                raise
