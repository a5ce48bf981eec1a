"""What an operator runs covers every memory of every identity
(docs/DESIGN.md, "Memories"): ``stash backup`` copies each memory's folder
under that memory's own lock, and ``stash verify`` checks each memory other
than main (main is the user's folder, which verify.py checks as before) —
without a token, what its files show; with one, what the token opens."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..core.errors import StashError
from ..storage import memories, userlock
from ..storage.files import DB_ERRORS, overwrite_with_zeros, private_folder
from ..storage.memories import MAIN, SUBFOLDER

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


def verify_memories(folder: Path, token_text: str | None, report: Any) -> None:
    """Check every memory of ``folder``'s user but main on a private copy,
    adding to ``report`` one fact per memory, or a problem naming it."""
    names = others(folder)
    if not names:
        return
    from ..crypto import tokens
    from .access import Vault
    from .verify import Failed, Report, verify_files

    parsed = tokens.parse(token_text) if token_text else None
    if parsed is None or parsed.user_id != folder.name:
        token_text = None  # another user's token (or none): checked as without one, as main is

    try:
        with _private_identity(folder) as data:
            vault = Vault(data)
            need = _scope_of(vault, token_text)
            for name in names:
                where = data / "users" / folder.name / SUBFOLDER / name
                # The same checks as main's, of this memory's files bound to its own store id.
                files = Report(report.user_id)
                verify_files(where, None, files, memories.store_id(folder.name, name))
                report.warnings += [f"memory {name}: {w}" for w in files.warnings]
                if not files.ok:
                    report.fail(f"memory {name}: {'; '.join(files.problems)}")
                    continue
                try:
                    fact = f"memory {name}: files ok"
                    if token_text and need is not None:
                        fact += _with_token(vault, token_text, need, name, report)
                    report.facts.append(fact)
                except (ValueError, Failed, OSError, *DB_ERRORS) as e:  # type: ignore[misc]  # a tuple of classes
                    said = e if isinstance(e, ValueError | Failed) else "a file cannot be read"
                    report.fail(f"memory {name}: {said}")
    except OSError:
        report.fail("a memory's file cannot be read")


def _scope_of(vault: Any, token_text: str | None) -> str | None:
    """What a session of the token needs to check a memory: ``owner`` for the
    owner (its owner-only data too), ``read`` for any other token (one that
    opens nothing is then refused memory by memory); None without a token."""
    if not token_text:
        return None
    try:
        _, _, ring, grant = vault._authenticate(token_text)
    except StashError:
        return "read"
    ring.close()
    return "owner" if grant.scope == "owner" else "read"


def _with_token(vault: Any, token_text: str, need: str, name: str, report: Any) -> str:
    """Memory ``name`` checked with the token as main is (verify.py's
    ``check_rows`` and, for the owner, ``check_owner_data``): what the
    report says of it, or raises ValueError or verify.Failed."""
    from .verify import check_owner_data, check_rows

    warnings: list[str] = []
    try:
        with vault.session(token_text, need, memory=name) as s:
            if s.scope == "owner":
                check_owner_data(s.keyring, s.keys, s.owner)
            fact = check_rows(s.memory.mf, s.cipher, warnings)
    except StashError as e:
        if e.code != "memory.unknown":
            raise ValueError(f"it does not open with the token ({e.code})") from None
        return ", not checked with the token (bound to another memory)"
    report.warnings += [f"memory {name}: {w}" for w in warnings]
    return f", with the token: {fact}"
