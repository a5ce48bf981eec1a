"""What one memory may hold, as the operator set it (``stash serve
--quota-memories``, ``--quota-bytes``): checked inside the write's
transaction, before anything is written, so a write is refused whole or
made whole, and two concurrent writes cannot both slip under the limit."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..core.errors import QuotaReached
from ..storage.memories import usage

DEFAULT_MEMORIES = 1_000_000
DEFAULT_BYTES = 1 << 30  # room for about a million memories (bench/README.md: bytes per memory)
DEFAULT_IMPORT_PER_REQUEST = 10_000
DEFAULT_IMPORT_PER_DAY = 100_000


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


def identity_room(session: Any, live: int, adding: int, max_memories: int, max_bytes: int) -> None:
    """The one quota check of every write that adds memories, in any memory
    and for any scope: ``live`` is how many live memories the memory being
    written holds (its exact count, or for an append note the key ring's
    record of it), and the identity's other memories are added as their key
    rings record them (storage/memories/__init__.py, ``others_usage``). Erased
    memories count for nothing, wherever they are."""
    data_dir = session.files.user_folder.parent.parent
    others, their_bytes = usage.others_usage(data_dir, session.user_id, session.memory_name)
    check_room(
        live,
        others,
        session.files.folder,
        adding,
        max_memories,
        max_bytes - their_bytes,
        owner=session.scope == "owner",
    )


def check_room(
    count: int, others: int, folder: Path, adding: int, max_memories: int, max_bytes: int, owner: bool = True
) -> None:
    """Refuse a write of ``adding`` memories to a log of ``count`` live
    (not erased) memories, beside ``others`` live ones in the identity's
    other memories, when it would pass the operator's limits. Erased
    memories keep their positions but count for nothing here, so an owner who
    erases what a capability flooded in gets the room back (docs/DESIGN.md,
    "Erase"); their rows still take disk, which the byte limit counts. The
    byte limit (``max_bytes``: what the other memories leave) is checked
    against what the folder holds before the write, so one write may end
    above it by its own size (at most one import body). Only the owner is
    told the numbers: a capability bound to one memory learns nothing of
    the identity's others from a refusal."""
    total = count + others
    if total + adding > max_memories:
        if owner:
            room = max(0, max_memories - total)
            held = f"{total:,} {'note' if total == 1 else 'notes'}"
            raise QuotaReached(
                f"This identity's memories hold {held} together and this server keeps at most "
                f"{max_memories:,} per identity ({room:,} more fit); nothing was written. Erase what is not "
                "needed (POST /erase, POST /erase/undo), or export a memory (GET /export) and ask the operator "
                "for room.",
                code="quota.memories",
            )
        raise QuotaReached(
            f"This identity's memories hold as many notes as this server keeps (at most {max_memories:,} per "
            "identity); nothing was written. Tell the memory's owner, who can make room.",
            code="quota.memories",
        )
    used = folder_bytes(folder)
    if used >= max_bytes:
        if owner:
            raise QuotaReached(
                f"This identity's memories take as much disk as this server allows per identity (this one takes "
                f"{used // (1 << 20):,} MiB of the {max_bytes // (1 << 20):,} MiB the others leave it); nothing "
                "was written. Export a memory (GET /export) or delete one, and ask the operator for room.",
                code="quota.bytes",
            )
        raise QuotaReached(
            "This identity's memories take as much disk as this server allows per identity; nothing was written. "
            "Tell the memory's owner, who can make room.",
            code="quota.bytes",
        )


def check_import(scope: str, adding: int, today_so_far: int, per_request: int, per_day: int, day: str) -> None:
    """Refuse an import by a full capability of more than ``per_request``
    memories at once, or one that takes its imports of UTC ``day`` past
    ``per_day`` (``stash serve --import-per-request``, ``--import-per-day``),
    so one capability cannot in one request or one day owe its memory's
    writers hundreds of thousands of naps. The owner is not bounded: its
    imports are its own, and it can undo any of them (``POST /erase/undo``)."""
    if scope != "full":
        return
    if adding > per_request:
        raise QuotaReached(
            f"This capability may import at most {per_request:,} notes per request and this one has "
            f"{adding:,}; nothing was written. Send them in batches of {per_request:,} or fewer.",
            code="quota.import_request",
        )
    if today_so_far + adding > per_day:
        room = max(0, per_day - today_so_far)
        raise QuotaReached(
            f"This capability imported {today_so_far:,} notes today ({day} UTC) and may import at most "
            f"{per_day:,} a day ({room:,} more today); nothing was written. Import the rest tomorrow, or ask the "
            "memory's owner to.",
            code="quota.import_day",
        )


def bounded_import(session: Any, entries: object, per_request: int, per_day: int) -> dict[str, Any]:
    """``POST /import`` within :func:`check_import`'s bounds: checked and
    counted inside the import's own transaction (the route's idempotency
    record holds the file's write lock around it), so concurrent imports of
    one capability cannot pass the day's bound together."""
    memory = session.open_memory()
    if session.scope != "full" or not isinstance(entries, list):
        answer: dict[str, Any] = memory.import_entries(entries)
        return answer
    day = memory.today()
    check_import(session.scope, len(entries), memory.mf.imported_on(day, session.grant_id), per_request, per_day, day)
    answer = memory.import_entries(entries)
    memory.mf.count_import(day, session.grant_id, len(entries))
    return answer
