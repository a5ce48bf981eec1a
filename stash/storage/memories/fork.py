"""Copying a memory's first memories and their summaries into a new memory
file, under that file's own keys (docs/DESIGN.md, "Memories": fork)."""

from __future__ import annotations

from ...core.blocks import levels
from ..memfile import MemoryFile
from ..memfile.row_tree import summary_slot
from ..sqlite.transactions import write_transaction

BATCH = 4096


def copy_log(src: MemoryFile, dst: MemoryFile, at: int) -> list[int]:
    """Append memories ``[0, at)`` of ``src`` to the empty ``dst``, each
    sealed afresh under a new key of ``dst``'s, and erase in ``dst`` the ones
    erased in ``src`` (their text is gone: a placeholder is written and its
    key shredded at once). Returns the erased ids."""
    for lo in range(0, at, BATCH):
        dst.append([(date, text) for _, date, text in src.memories(lo, min(at, lo + BATCH))])
    return sorted(i for i in src.erased_ids if i < at)


def copy_tree(src: MemoryFile, dst: MemoryFile, at: int) -> int:
    """Copy every summary of ``src`` whose block lies inside ``[0, at)`` into
    ``dst`` (which holds that log and no summary yet), each sealed under
    ``dst``'s keys at its next state version, keeping ``src``'s holes below
    each level's frontier as holes: one transaction. Returns how many."""
    n = 0
    with write_transaction(dst.conn):
        version = dst.next_version()
        holes: dict[int, list[int]] = {}
        for size in levels(at):
            got = src.summaries_of(size, 0, at // size)
            if not got:
                continue
            dst.ensure_table("summaries")
            for idx, text in sorted(got.items()):
                sealed = dst.codec.seal_summary(size, idx, version, text)
                dst.conn.execute("INSERT INTO summaries(size, idx, sealed) VALUES (?, ?, ?)", (size, idx, sealed))
                dst.digests.bind(summary_slot(size, idx), sealed)
                n += 1
            missing = [k for k in range(max(got)) if k not in got]
            if missing:
                holes[size] = missing
        dst.tree.save_holes(holes)
        dst.state.write()
    return n
