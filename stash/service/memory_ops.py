"""What an operator runs covers every memory of every identity
(docs/DESIGN.md, "Memories"): ``stash backup`` copies each memory's folder
under that memory's own lock, and ``stash verify`` checks each memory other
than main (main is the user's folder, which verify.py checks as before) —
without a token, what its files show; with one, what the token opens."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..core.errors import StashError
from ..core.lines import plural
from ..storage import inbox, memories, safeopen, userlock
from ..storage.files import DB_ERRORS, overwrite_with_zeros, private_folder
from ..storage.memories import MAIN, SUBFOLDER
from .pair_agree import agree

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
def _private_identity(folder: Path) -> Iterator[Path]:
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


def _open(path: Path) -> sqlite3.Connection:
    """A memory's file of the private copy, its schema checked and every
    statement bounded (storage/safeopen.py): a crafted one is this memory's
    failure, and verify goes on to the next."""
    try:
        return safeopen.open_plain(path)
    except safeopen.ForeignSchema:
        raise ValueError(f"its {path.name} holds a schema Stash does not make (crafted or damaged)") from None


def _files_check(folder: Path, user_id: str, name: str) -> str:
    """What one memory's files show without a key, or raises ValueError."""
    store = memories.store_id(user_id, name)
    ring = _open(folder / "keyring.db")
    try:
        if [r[0] for r in ring.execute("PRAGMA integrity_check")] != ["ok"]:
            raise ValueError("its keyring.db fails SQLite's integrity check")
        meta = dict(ring.execute("SELECT name, value FROM keyring_meta"))
        live = ring.execute("SELECT COUNT(*) FROM grants WHERE wrapped IS NOT NULL AND scope != 'owner'").fetchone()[0]
        live += len(inbox.live_tags(ring))  # append capabilities hold no key: counted by their live tags
        owner = ring.execute("SELECT COUNT(*) FROM grants WHERE wrapped IS NOT NULL AND scope = 'owner'").fetchone()[0]
    finally:
        ring.close()
    if meta.get("user_id") != store:
        raise ValueError("its keyring.db belongs to another memory (or none)")
    if not owner:
        raise ValueError("its keyring.db has no live owner enrolment")
    if not (folder / "memory.db").is_file():
        raise ValueError("its memory.db is missing")
    if meta.get("file_cipher") == "none":
        mem = _open(folder / "memory.db")
        try:
            if [r[0] for r in mem.execute("PRAGMA integrity_check")] != ["ok"]:
                raise ValueError("its memory.db fails SQLite's integrity check")
            row = mem.execute("SELECT value FROM meta WHERE name = 'user_id'").fetchone()
        finally:
            mem.close()
        if row is None or row[0] != store:
            raise ValueError("its memory.db belongs to another memory (or none)")
        why = agree(folder / "keyring.db", folder / "memory.db")  # what a restore asks of the pair too
        if why is not None:
            raise ValueError(why)
    return plural(live, "live capability")


def verify_memories(folder: Path, token_text: str | None, report: Any) -> None:
    """Check every memory of ``folder``'s user but main on a private copy,
    adding to ``report`` one fact per memory, or a problem naming it."""
    names = others(folder)
    if not names:
        return
    from ..crypto import tokens
    from .access import Vault

    parsed = tokens.parse(token_text) if token_text else None
    if parsed is None or parsed.user_id != folder.name:
        token_text = None  # another user's token (or none): checked as without one, as main is

    try:
        with _private_identity(folder) as data:
            vault = Vault(data)
            for name in names:
                where = data / "users" / folder.name / SUBFOLDER / name
                try:
                    fact = f"memory {name}: files ok ({_files_check(where, folder.name, name)})"
                    if token_text:
                        try:
                            with vault.session(token_text, "read", memory=name) as s:
                                fact += f", opens with the token ({plural(s.memory.count(), 'note')})"
                        except StashError as e:
                            if e.code != "memory.unknown":
                                raise ValueError(f"it does not open with the token ({e.code})") from None
                            fact += ", not checked with the token (bound to another memory)"
                    report.facts.append(fact)
                except (ValueError, OSError, *DB_ERRORS) as e:  # type: ignore[misc]  # a tuple of classes
                    report.fail(f"memory {name}: {e if isinstance(e, ValueError) else 'a file cannot be read'}")
    except OSError:
        report.fail("a memory's file cannot be read")
