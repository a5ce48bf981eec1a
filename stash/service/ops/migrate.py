"""``stash migrate --file-cipher none``: every memory of every user of a data
folder moved from SQLCipher files to plain ones (:mod:`stash.storage.cipher_swap`),
so a replicated host can stream them; then each user checked as ``stash
verify --token`` checks it.

The SQLCipher layer's key comes from the memory's master key, which only a
capability's secret unwraps, so a memory converts only when a token that
opens it is given (the owner's opens every memory of its identity; a read or
full capability, the one it is bound to). A memory no given token opens is
left as it is and reported. Each memory moves under its own lock held
exclusive (storage/userlock.py): with the server running, that memory's
requests wait for its move; one whose files a server worker keeps open is
tried again until ``wait`` runs out.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ...core.errors import StashError
from ...crypto import tokens
from ...storage import cipher_swap, userlock
from ...storage.disk_errors import DB_ERRORS
from ...storage.memfile import FileKeys
from ...storage.memories import MAIN, SUBFOLDER
from ..access import Session, Vault
from . import every_memory
from .replica import file_cipher
from .verify import Report, user_folders, verify_user

RETRY_S = 0.2


@dataclass
class Moved:
    """What happened to one memory: ``converted``, ``plain`` (already), or
    ``left`` (still SQLCipher: ``note`` says why)."""

    user_id: str
    memory: str
    outcome: str
    note: str = ""


@dataclass
class UserResult:
    user_id: str
    memories: list[Moved] = field(default_factory=list)
    report: Report | None = None  # the check after, when anything of the user moved


def _folders(user: Path) -> Iterator[tuple[str, Path]]:
    for name in [MAIN, *every_memory.others(user)]:
        yield name, user if name == MAIN else user / SUBFOLDER / name


def _move(s: Session, wait: float) -> str:
    """Convert the session's memory; its outcome note ("" when converted)."""
    folder = s.files.folder
    fk = FileKeys.derive(s.files.memory, s.keyring.user_id, s.keys, "sqlcipher", s.page_bytes)
    assert fk.file_key is not None
    deadline = time.monotonic() + wait
    while True:
        with userlock.exclusive(folder):
            if s.keyring.meta("file_cipher") == "none":
                cipher_swap.finish(folder)
                return ""
            try:
                cipher_swap.convert(folder, s.keyring.conn, fk.file_key, s.page_bytes)
                return ""
            except cipher_swap.Busy:
                pass
            except cipher_swap.Unequal as e:
                return f"not converted: {e}; nothing was changed"
        if time.monotonic() >= deadline:
            return (
                "not converted: a running server keeps its files open (it is in use); run again, or stop "
                "the server first"
            )
        time.sleep(RETRY_S)


def migrate_user(user: Path, given: list[str], wait: float) -> UserResult:
    """Every memory of the user whose folder is ``user``, with the tokens
    ``given`` (only this user's are tried)."""
    mine = [t for t in given if (p := tokens.parse(t)) is not None and p.user_id == user.name]
    result = UserResult(user.name)
    vault = Vault(user.parent.parent)
    for name, folder in _folders(user):
        cipher = file_cipher(folder)
        if cipher == "none":
            with userlock.exclusive(folder):
                done = cipher_swap.finish(folder)  # a move a crash stopped after its commit
            result.memories.append(Moved(user.name, name, "converted" if done else "plain"))
            continue
        if cipher != "sqlcipher":
            result.memories.append(Moved(user.name, name, "left", "its keyring.db is unreadable; run stash verify"))
            continue
        note = "no token given opens it (the file key comes from a capability's secret)"
        for token in mine:
            try:
                with vault.session(token, "read", memory=name) as s:
                    try:
                        note = _move(s, wait)
                    except (OSError, *DB_ERRORS):  # type: ignore[misc]  # a tuple of exception classes
                        note = "not converted: a file of it cannot be read or written; nothing was changed"
                break  # opened: whatever the move did, another token would do the same
            except StashError as e:  # this token does not open it: the next one may
                if e.code not in ("memory.unknown", "auth.scope"):
                    note = f"not converted: the token given does not open it ({e.code})"
        result.memories.append(Moved(user.name, name, "left" if note else "converted", note))
    if any(m.outcome == "converted" for m in result.memories):
        # The owner's token checks every memory with its key; without it, what needs no key.
        owner = next((t for t in mine if _is_owner(vault, t)), None)
        result.report = verify_user(user, owner)
    return result


def _is_owner(vault: Vault, token: str) -> bool:
    try:
        with vault.session(token, "read") as s:
            return s.scope == "owner"
    except StashError:
        return False


def migrate(data_dir: Path, given: list[str], wait: float = 30.0) -> list[UserResult]:
    return [migrate_user(user, given, wait) for user in user_folders(data_dir)]
