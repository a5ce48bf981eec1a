"""``stash compact``: the summaries of every memory a given token opens moved
to the bucketed layout (formats.py, "rows in buckets") and its one-size log
rows stored short ("rows stored short"), then the memory file
rewritten without the room they left (``VACUUM``), then each user checked as
``stash verify --token`` checks it.

The summaries are re-sealed :data:`SLICE` to a write transaction
(:meth:`MemoryFile.rebucket_summaries`), each in a session of its own as a
nap is written, so a kill at any instant leaves each summary in one layout
or the other, both of which open, and running it again finishes; then the
file is rewritten under the memory's lock held exclusive, so its requests
wait for the rewrite (17 s at a million memories, bench/HISTORY.md), and
its recall cache is deleted, to be rebuilt compressed by the next recall
(rebuilt in place, the old pieces' pages would stay in the file, free).
Before the rewrite the log's one-size rows are stored short, :data:`SLICE`
to a transaction (:meth:`MemoryFile.shorten_rows`): each is rebuilt to the
same sealed bytes when read, so the running digest, and every client's pin
of it, stay valid. ``VACUUM`` is SQLite's own
rewrite, atomic like a transaction; it needs the file's pages once more in
free space while it runs, and on a replicated host Litestream ships the whole
rewritten file.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...core.errors import StashError
from ...crypto import tokens
from ...storage import userlock
from ...storage.disk_errors import DB_ERRORS
from ...storage.keyring import state_copies
from ...storage.memfile import MemoryFile
from ...storage.recallcache.rendered_log import CACHE_FILE
from ...storage.sqlite.transactions import checkpoint
from ..access import Vault
from .migrate import _folders, _is_owner
from .verify import Report, user_folders, verify_user

SLICE = 4096  # summaries per transaction: the memory's requests wait tens of ms at most for one
RETRY_S = 0.2


@dataclass
class Compacted:
    """What happened to one memory: ``compacted`` (``resealed`` summaries
    moved, ``before`` and ``after`` the file's bytes), or ``left`` (``note``
    says why)."""

    user_id: str
    memory: str
    outcome: str
    resealed: int = 0
    shortened: int = 0
    before: int = 0
    after: int = 0
    note: str = ""


@dataclass
class UserResult:
    user_id: str
    memories: list[Compacted] = field(default_factory=list)
    report: Report | None = None


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def _compact(vault: Vault, token: str, name: str, wait: float) -> Compacted:
    """Re-seal one memory's summaries, a slice per session as a nap is
    written (its requests interleave), then ``VACUUM`` its file under its
    lock held exclusive (its requests wait for the whole rewrite), retried
    until ``wait`` runs out while a running server keeps it busy. Each
    session opens and checks the file as a request's does."""
    result = Compacted("", name, "left")
    while True:
        with vault.session(token, "full", memory=name) as s:
            result.before = result.before or _size(s.files.memory)
            n = s.open_memory().mf.rebucket_summaries(SLICE)
        if not n:
            break
        result.resealed += n
    start = 0
    while True:
        with vault.session(token, "full", memory=name) as s:
            mf = s.open_memory().mf
            start, n = mf.shorten_rows(start, SLICE)
            T = mf.count()
        result.shortened += n
        if start >= T:
            break
    deadline = time.monotonic() + wait
    while True:
        with vault.session(token, "full", memory=name) as s, userlock.exclusive(s.files.folder):
            path = s.files.memory
            recorded = state_copies.state_required(s.keyring.conn, s.keyring.copies(s.keys))
            mf = MemoryFile(path, s.keyring.user_id, s.keys, s.cipher, page_bytes=s.page_bytes, recorded=recorded)
            try:
                mf.conn.execute("VACUUM")
            except DB_ERRORS as e:
                if "locked" not in str(e) and "busy" not in str(e):
                    raise
            else:
                checkpoint(mf.conn)
                result.outcome = "compacted"
            finally:
                mf.close()
            if result.outcome == "compacted":
                # A cache, rebuilt compressed by the next recall: pieces
                # rebuilt in place would leave the old ones' pages free in it.
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{s.files.folder / CACHE_FILE}{suffix}").unlink(missing_ok=True)
            if result.outcome == "compacted":
                result.after = _size(path)
                return result
        if time.monotonic() >= deadline:
            result.note = (
                "summaries re-sealed, file not rewritten: a running server keeps it open; run again, or "
                "stop the server first"
            )
            return result
        time.sleep(RETRY_S)


def compact_user(user: Path, given: list[str], wait: float) -> UserResult:
    """Every memory of the user whose folder is ``user`` that one of the
    tokens ``given`` opens (only this user's are tried)."""
    mine = [t for t in given if (p := tokens.parse(t)) is not None and p.user_id == user.name]
    result = UserResult(user.name)
    vault = Vault(user.parent.parent)
    for name, _folder in _folders(user):
        got = Compacted(user.name, name, "left", note="no token given opens it")
        for token in mine:
            try:
                got = _compact(vault, token, name, wait)
                got.user_id = user.name
                break
            except StashError as e:  # this token does not open it, or its store is damaged
                if e.code not in ("memory.unknown", "auth.scope"):
                    got = Compacted(
                        user.name,
                        name,
                        "left",
                        note=f"not compacted ({e.code}); nothing of it was "
                        "changed that does not open; run stash verify",
                    )
            except (OSError, sqlite3.Error, *DB_ERRORS):  # type: ignore[misc]
                got = Compacted(user.name, name, "left", note="not compacted: a file of it cannot be read or written")
                break
        result.memories.append(got)
    if any(m.outcome == "compacted" for m in result.memories):
        owner = next((t for t in mine if _is_owner(vault, t)), None)
        result.report = verify_user(user, owner)
    return result


def compact(data_dir: Path, given: list[str], wait: float = 30.0) -> list[UserResult]:
    return [compact_user(user, given, wait) for user in user_folders(data_dir)]
