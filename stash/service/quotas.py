"""What one memory may hold, as the operator set it (``stash serve
--quota-memories``, ``--quota-bytes``): checked inside the write's
transaction, before anything is written, so a write is refused whole or
made whole, and two concurrent writes cannot both slip under the limit."""

from __future__ import annotations

import os
from pathlib import Path

from ..core.errors import QuotaReached

DEFAULT_MEMORIES = 1_000_000
DEFAULT_BYTES = 1 << 30  # room for about a million memories (bench/README.md: bytes per memory)


def folder_bytes(folder: Path) -> int:
    """The bytes of every file in a user's folder (key ring, memory file,
    their write-ahead logs): what the memory costs the disk now. A file
    removed between the listing and its size (a WAL or shared-memory file
    that another request's close deleted) holds nothing and counts 0."""
    total = 0
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                try:
                    total += entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue
    return total


def check_room(count: int, folder: Path, adding: int, max_memories: int, max_bytes: int) -> None:
    """Refuse a write of ``adding`` memories to a log of ``count`` when it
    would pass the operator's limits. The byte limit is checked against what
    the folder holds before the write, so one write may end above it by its
    own size (at most one import body)."""
    if count + adding > max_memories:
        room = max(0, max_memories - count)
        raise QuotaReached(
            f"This memory holds {count:,} {'memory' if count == 1 else 'memories'} and this server keeps at most "
            f"{max_memories:,} per memory "
            f"({room:,} more fit); nothing was written. Export it (GET /export) and ask the operator for room.",
            code="quota.memories",
        )
    used = folder_bytes(folder)
    if used >= max_bytes:
        raise QuotaReached(
            f"This memory takes {used // (1 << 20):,} MiB of the {max_bytes // (1 << 20):,} MiB this server allows "
            "per memory; nothing was written. Export it (GET /export) and ask the operator for room.",
            code="quota.bytes",
        )
