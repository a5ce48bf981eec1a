"""What an identity's memories other than the one being written take: the
live memories each key ring records and the bytes of each folder, which the
identity's quotas add to the memory a write goes to (service/quotas.py).
Read without any key: a write holds the keys of its own memory only."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from .. import safeopen
from ..keyring.ring_file import ERASED_COPY, HEAD_COPY
from . import MemoryFiles, names

USAGE_SECONDS = 5.0  # how old the other memories' usage a quota check adds may be, in one process
_USAGE: dict[tuple[str, str, str], tuple[float, tuple[int, int]]] = {}


def others_usage(data_dir: Path, user_id: str, but: str) -> tuple[int, int]:
    """``(memories, bytes)`` of every memory of the user but ``but``: the
    live memories as each key ring records them (its copy of the log head's
    count, its waiting append notes, less the erased ones: erased memories
    count for nothing), the bytes of each folder's files. What an
    identity's quotas add to the memory being written (they count all its
    memories together); nothing to add, at the cost of one folder listing,
    for an identity with main alone. Read at most once every USAGE_SECONDS
    per process and memory written, so a note to one of a hundred memories
    costs what a note to one does: the memory written is counted exactly,
    inside its write; the others as they were then, or as the last erasure
    this process saw left them (:func:`forget_usage`)."""
    memo = (str(data_dir), user_id, but)
    now = time.monotonic()
    kept = _USAGE.get(memo)
    if kept is not None and now - kept[0] < USAGE_SECONDS:
        return kept[1]
    usage = _others_usage(data_dir, user_id, but)
    if len(_USAGE) > 10_000:
        _USAGE.clear()
    _USAGE[memo] = (now, usage)
    return usage


def forget_usage(user_id: str) -> None:
    """Drop what :func:`others_usage` keeps of ``user_id``: an erasure gave
    room back, which the next write of this process sees at once."""
    for memo in [m for m in _USAGE if m[1] == user_id]:
        _USAGE.pop(memo, None)


def _others_usage(data_dir: Path, user_id: str, but: str) -> tuple[int, int]:
    count = size = 0
    for name in names(data_dir, user_id):
        if name == but:
            continue
        files = MemoryFiles(data_dir, user_id, name)
        try:
            with os.scandir(files.folder) as entries:
                for entry in entries:
                    if entry.is_file(follow_symlinks=False):
                        size += entry.stat(follow_symlinks=False).st_size
            # Checked and bounded as every open is: a crafted key ring counts nothing, never hangs the write.
            conn = safeopen.open_plain(files.keyring, read_only=True)
            try:
                meta = dict(
                    conn.execute(
                        "SELECT name, value FROM keyring_meta WHERE name IN (?, ?)", (HEAD_COPY, ERASED_COPY)
                    ).fetchall()
                )
                waiting = (
                    conn.execute("SELECT count(*) FROM inbox").fetchone()[0]
                    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'inbox'").fetchone()
                    else 0
                )
            finally:
                conn.close()
        except (OSError, sqlite3.Error):  # ForeignSchema is one
            continue
        try:
            logged = int(str(meta.get(HEAD_COPY, "0")).split(":", 1)[0])
            erased = int(meta.get(ERASED_COPY) or 0)
        except ValueError:
            continue
        count += max(0, logged - erased) + int(waiting)
    return count, size
