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

import datetime as dt
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ...storage import safeopen, userlock
from ...storage.private_files import fsync_path, private_folder
from . import every_memory
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
    # Copied as it is, crafted or not (the check of the copy reports it); hardened,
    # so nothing of its schema runs while it is copied.
    source = safeopen.open_plain(src, check=False)
    try:
        target = safeopen.open_plain(dst, check=False)
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


MANIFEST = "backup.json"
MANIFEST_FORMAT = 1


def _utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _write_manifest(dest: Path, manifest: dict[str, object]) -> None:
    """Replace the manifest whole (a new file, synced, renamed over the old,
    the folder synced): a reader finds the old one or the new one."""
    tmp = dest / f".{MANIFEST}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, dest / MANIFEST)
    _fsync(dest)


def backup(data_dir: Path, dest: Path) -> list[tuple[Copied, Report | None]]:
    """Copy every user under ``data_dir`` into ``dest`` (which must not exist
    or be empty; it is made 0700, as is every folder in it), then check each
    copy as ``stash verify`` would without a token.

    A backup says whether it is whole (docs/DESIGN.md, "Backups"): before any
    user is copied, ``backup.json`` records the moment and the users it is
    to hold, marked incomplete; once every copy is synced it is rewritten
    with each user's files and their sizes (and the users skipped, with why)
    and marked complete, last of all. ``stash verify`` of a backup whose
    manifest is missing, incomplete or disagrees with its files fails, naming
    what is missing (:func:`check_manifest`)."""
    data_dir, dest = Path(data_dir), Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BackupRefused("the destination exists and is not an empty folder; choose a new one")
    if dest.resolve() == data_dir.resolve() or data_dir.resolve() in dest.resolve().parents:
        raise BackupRefused("the destination is inside the data folder; choose a folder outside it")
    folders = list(user_folders(data_dir))
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(dest, 0o700)
    manifest: dict[str, object] = {
        "format": MANIFEST_FORMAT,
        "complete": False,
        "started": _utc_now(),
        "planned": [f.name for f in folders],
    }
    _write_manifest(dest, manifest)
    # 0700 from the top whatever the umask, so the folder `cp -a` restores from it is the server's alone too.
    private_folder(dest / "users")
    out = []
    users: dict[str, dict[str, int]] = {}
    skipped: dict[str, str] = {}
    for folder in folders:
        copied = _copy_user(folder, dest / "users" / folder.name)
        if copied.copied:  # and every other memory of this user (docs/DESIGN.md, "Memories")
            every_memory.backup_memories(folder, dest / "users" / folder.name, _copy_user)
        report = verify_user(dest / "users" / folder.name) if copied.copied else None
        out.append((copied, report))
        if copied.copied:
            users[folder.name] = _files(dest / "users" / folder.name)
        else:
            skipped[folder.name] = copied.note
    _fsync(dest / "users")
    _write_manifest(dest, {**manifest, "users": users, "skipped": skipped, "finished": _utc_now(), "complete": True})
    return out


def _files(copy: Path) -> dict[str, int]:
    """Every file of a user's copy by its path relative to it, each memory's
    under ``m/<name>/`` included, with its size: what the manifest holds, so
    a memory missing from the backup is named as any file is."""
    return {p.relative_to(copy).as_posix(): p.stat().st_size for p in sorted(copy.rglob("*")) if p.is_file()}


def check_manifest(folder: Path, required: bool) -> list[str]:
    """What a backup's manifest says is wrong with it (empty: whole, or no
    manifest where none is ``required``): unmarked, incomplete, a user or a
    file missing, a size changed, a user it never held."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return (
            ["it has no backup.json: not a finished stash backup (or one made before backups recorded what they hold)"]
            if required
            else []
        )
    try:
        manifest = json.loads(path.read_text())
        complete = manifest.get("complete") is True
        planned = [str(u) for u in manifest.get("planned", [])]
        users = {str(u): {str(n): int(z) for n, z in files.items()} for u, files in manifest.get("users", {}).items()}
        skipped = {str(u) for u in manifest.get("skipped", {})}
    except (OSError, ValueError, TypeError, AttributeError):
        return ["its backup.json is unreadable"]
    if not complete:
        present = sorted(p.name for p in (Path(folder) / "users").glob("*") if p.is_dir())
        missing = [u for u in planned if u not in present]
        return [
            f"the backup never finished (started {str(manifest.get('started'))[:32]}): it holds "
            f"{len(present)} of the {len(planned)} users it was to copy; missing "
            f"{', '.join(missing[:10]) or 'none'}{' and more' if len(missing) > 10 else ''}"
        ]
    problems = []
    for user_id, files in sorted(users.items()):
        where = Path(folder) / "users" / user_id
        if not where.is_dir():
            problems.append(f"user {user_id} is missing (backup.json lists it)")
            continue
        for name, size in sorted(files.items()):
            if (where / name).is_dir():
                continue  # a memories folder, as a backup made before memories' files were listed records it
            try:
                now = (where / name).stat().st_size
            except OSError:
                problems.append(f"{user_id}'s {name} is missing (backup.json lists it)")
                continue
            if now != size:
                problems.append(f"{user_id}'s {name} is {now:,} bytes; backup.json records {size:,}")
    held = {p.name for p in (Path(folder) / "users").glob("*") if p.is_dir()}
    for extra in sorted(held - set(users) - skipped):
        problems.append(f"user {extra} is in the folder but backup.json does not list it")
    return problems
