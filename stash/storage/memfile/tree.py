"""The summary tree: settling summaries, the holes an erasure leaves, the
drops of forget and erase, and reading levels back.

A level is settled left to right up to its frontier; an erasure drops the
blocks on its memory's path below the frontier as holes, which the next naps
fill. Every drop is recorded with the state version it happened at
(:meth:`SummaryTree._summary_valid`), so a summary put back from before its
block was dropped is refused rather than served.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import closing
from typing import Any

from ...core.blocks import Erased, Settled, forget_span, is_settled, levels
from ...core.errors import Damaged, RolledBack
from ...crypto import aead
from ..formats import SUMMARY_PLAINTEXT_BYTES, SUMMARY_VERSION_BYTES
from ..sqlite.transactions import write_transaction
from .base import DROPS_META, HOLES_META, FileBase
from .bound import RowDigests
from .row_tree import summary_kind, summary_slot
from .rows import RowCodec
from .state import State


class SummaryTree:
    """The summaries of ``file``, sealed by ``codec``, each bound by
    ``digests``; every settle or drop advances ``state``."""

    def __init__(self, file: FileBase, codec: RowCodec, digests: RowDigests, state: State) -> None:
        self.file = file
        self.codec = codec
        self.digests = digests
        self.state = state

    def settled(self, T: int) -> Settled:
        """Each level's frontier up to ``T``, its holes (blocks an erasure
        dropped below the frontier, docs/DESIGN.md, "Erase") and the erased
        memories, whose wholly erased blocks need no summary."""
        out = Settled(holes=self._holes(), erased=self.erased_runs())
        sizes = list(levels(T))
        for size, top in zip(sizes, self.file.top_idxs(sizes) if self.file.made("summaries") else [None] * len(sizes)):
            out[size] = 0 if top is None else int(top) + 1
        return out

    def _top_idx(self, size: int) -> int | None:
        """The last settled index of level ``size`` (None: none settled)."""
        if not self.file.made("summaries"):
            return None
        top = self.file.conn.execute("SELECT MAX(idx) FROM summaries WHERE size = ?", (size,)).fetchone()[0]
        return None if top is None else int(top)

    def _holes(self) -> dict[int, list[int]]:
        row = self.file.conn.execute("SELECT value FROM meta WHERE name = ?", (HOLES_META,)).fetchone()
        if row is None:
            return {}
        try:
            return {int(size): sorted(int(k) for k in ks) for size, ks in json.loads(row[0]).items()}
        except (ValueError, TypeError, AttributeError):
            raise Damaged(
                "The memory file's record of erased summaries is unreadable; restore this store from a backup."
            ) from None

    def erased_runs(self) -> Erased:
        """The erased memories (as the authenticated state covers them) as
        runs, made once per state: a wake and its nap ask several times."""
        cached = self.file.erased_runs_made
        record = self.file.erasure_record  # from format mark 4 the runs are the record's own: no set is made
        source = record if record is not None else self.file.erased_ids
        if cached is None or cached[0] is not source:
            cached = (source, Erased.from_runs(record.runs) if record is not None else Erased(self.file.erased_ids))
            self.file.erased_runs_made = cached
        return cached[1]

    def _erased_in(self, lo: int, hi: int) -> int:
        """How many of memories ``[lo, hi)`` are erased, as this transaction sees it."""
        if hi <= lo or "erased" not in self.file.tables():
            return 0
        return int(
            self.file.conn.execute("SELECT COUNT(*) FROM erased WHERE id >= ? AND id < ?", (lo, hi)).fetchone()[0]
        )

    def save_holes(self, holes: dict[int, list[int]], erased: Erased | None = None) -> None:
        """Record ``holes``, keeping only those still below their level's
        frontier (a hole at or past it is just a block not written yet) and
        not wholly ``erased`` (such a block is never due again)."""
        kept = {}
        erased = self.erased_runs() if erased is None else erased
        for size, ks in holes.items():
            top = self._top_idx(size)
            below = sorted(
                {k for k in ks if top is not None and k < top and not erased.covers(k * size, (k + 1) * size)}
            )
            if below:
                kept[str(size)] = below
        if kept:
            self.file.put_meta(HOLES_META, json.dumps(kept))
        else:
            self.file.conn.execute("DELETE FROM meta WHERE name = ?", (HOLES_META,))

    def summaries_of(self, size: int, first: int, end: int) -> dict[int, str]:
        """The summaries of level ``size`` with index in ``[first, end)``, each
        opened and checked as :meth:`summary` does, in one query; an index
        without a summary is absent."""
        if not self.file.made("summaries"):
            return {}
        with closing(
            self.file.conn.execute(
                f"SELECT idx, sealed, {self.codec.epoch_sql('summaries')} FROM summaries "
                "WHERE size = ? AND idx >= ? AND idx < ?",
                (size, first, end),
            )
        ) as rows:
            return {idx: self.summary_text(size, idx, sealed, epoch) for idx, sealed, epoch in rows}

    def summary(self, lo: int, hi: int) -> str | None:
        size = hi - lo
        if not self.file.made("summaries"):
            return None
        row = self.file.conn.execute(
            f"SELECT sealed, {self.codec.epoch_sql('summaries')} FROM summaries WHERE size = ? AND idx = ?",
            (size, lo // size),
        ).fetchone()
        if row is None:
            return None
        return self.summary_text(size, lo // size, row[0], row[1])

    def summary_text(self, size: int, idx: int, sealed: bytes, epoch: int | None) -> str:
        """Open one summary and check it is current: written after the last
        drop of its block (:meth:`_summary_valid`). Plaintexts written before
        the state head existed carry no version (0)."""
        written, plain = self.open_summary(size, idx, sealed, epoch)
        lo = idx * size
        if not self._summary_valid(size, idx, written):
            raise RolledBack(
                f"The summary of {lo}-{lo + size - 1} is an older copy of one that was dropped "
                "(forgotten, or erased over); it was not served. The operator should run `stash "
                "verify` and restore this store from a backup."
            )
        try:
            return aead.unpad(plain).decode()
        except (aead.Unsealable, UnicodeDecodeError):
            raise Damaged(f"The summary of {lo}-{lo + size - 1} is unreadable; forget it and nap again.") from None

    def summary_writer(self, lo: int, hi: int) -> int | None:
        """The grant that wrote the summary of ``[lo, hi)`` (0: not
        recorded), or None when there is none."""
        size = hi - lo
        if not self.file.made("summaries"):
            return None
        row = self.file.conn.execute(
            f"SELECT sealed, {self.codec.epoch_sql('summaries')} FROM summaries WHERE size = ? AND idx = ?",
            (size, lo // size),
        ).fetchone()
        if row is None:
            return None
        return self.codec.writer_of(self.open_summary(size, lo // size, row[0], row[1])[1])

    def put_summary(self, lo: int, hi: int, text: str) -> bool:
        """Settle block ``[lo, hi)`` if it is still the next one of its level
        (past blocks wholly erased, which need none) or one of its holes and,
        above size 2, both its halves are still settled or wholly erased.
        False if another writer got there first, or a forget dropped a half
        meanwhile. Erasures are read inside the transaction, so a stale view
        of them can only refuse, never let a block in out of order."""
        size = hi - lo
        idx = lo // size
        with write_transaction(self.file.conn):
            version = self.file.next_version()
            sealed = self.codec.seal_summary(size, idx, version, text)
            top = self._top_idx(size)
            holes = self._holes()
            hole = idx in holes.get(size, ()) and top is not None and idx < top
            frontier = 0 if top is None else top + 1
            if not hole and not (frontier <= idx and self._erased_in(frontier * size, lo) == lo - frontier * size):
                return False
            if self._erased_in(lo, hi) == size:
                return False  # a wholly erased block has no summary
            if size > 2:
                half = size // 2
                have = (
                    {
                        r[0]
                        for r in self.file.conn.execute(
                            "SELECT idx FROM summaries WHERE size = ? AND idx IN (?, ?)", (half, 2 * idx, 2 * idx + 1)
                        )
                    }
                    if self.file.made("summaries")
                    else set()
                )
                for k in (2 * idx, 2 * idx + 1):
                    if k not in have and self._erased_in(k * half, (k + 1) * half) != half:
                        return False
            self.file.ensure_table("summaries")
            cols, marks, epoch = self.codec.epoch_of_write("summaries")
            self.file.conn.execute(
                f"INSERT INTO summaries(size, idx, sealed{cols}) VALUES (?, ?, ?{marks})", (size, idx, sealed, *epoch)
            )
            self.digests.bind(summary_slot(size, idx), sealed)
            if hole:
                holes[size].remove(idx)
                self.save_holes(holes)
            self.state.write()
        return True

    def put_summaries(self, items: list[tuple[int, int, str]]) -> bool:
        """Settle several blocks at once, in the given order, each under
        exactly :meth:`put_summary`'s conditions; all or nothing: False (and
        nothing written) if any one of them would be refused. A savepoint
        keeps it whole inside a caller's transaction too."""
        with write_transaction(self.file.conn):
            self.file.conn.execute("SAVEPOINT summaries_batch")
            for lo, hi, text in items:
                if not self.put_summary(lo, hi, text):
                    self.file.conn.execute("ROLLBACK TO summaries_batch")
                    self.file.conn.execute("RELEASE summaries_batch")
                    return False
            self.file.conn.execute("RELEASE summaries_batch")
        return True

    def drop_summaries_from(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Drop block ``[lo, hi)``, the block containing it at each larger
        size, and every later block of each of those sizes (docs/DESIGN.md,
        "Forget"). Returns the dropped blocks, smallest first."""
        with write_transaction(self.file.conn):
            gone = self._drop_from(lo, hi)
            if gone:
                version = self.file.next_version()
                drops = self.file.read_drops()
                for size in sorted({b - a for a, b in gone}):
                    # A later suffix record from an earlier start supersedes the ones it covers.
                    start = lo // size
                    drops["s"][size] = [r for r in drops["s"].get(size, []) if r[0] < start] + [(start, version)]
                self._save_drops(drops)
                self.state.write()
            return gone

    def _drop_from(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Delete what :func:`blocks.forget_span` says forget drops."""
        if not self.file.made("summaries"):
            return []
        top_size = self.file.conn.execute("SELECT MAX(size) FROM summaries").fetchone()[0] or 0
        settled = self.settled(top_size)
        gone = forget_span(lo, hi, settled, top_size)
        for size in sorted({b - a for a, b in gone}):
            self.file.conn.execute("DELETE FROM summaries WHERE size = ? AND idx >= ?", (size, lo // size))
            self.digests.bind_from(summary_kind(size), lo // size)
        if settled.holes:
            self.save_holes(settled.holes)  # holes past the new frontiers are gone with them
        return gone

    def drop_erased(self, fresh: list[int], T: int, version: int) -> list[tuple[int, int]]:
        """Drop the summaries that contain the newly erased memories
        ``fresh`` — the blocks on each one's path to the root, at most
        ⌊log2 T⌋ (docs/DESIGN.md, "Erase") — as holes the next naps fill,
        recorded as dropped at state ``version``; a block left wholly erased
        is no hole and needs no drop record (it is never served from a row
        again: it renders as erased). Returns the dropped blocks, smallest
        first. Each path is read against the tree as it was, so the cost is
        O(log T) per memory however many are erased at once."""
        settled = self.settled(T)
        erased = Erased(self.file.erased_ids | set(fresh))
        drops = self.file.read_drops()
        dropped: set[tuple[int, int]] = set()
        for size in levels(T):
            # Each block over a fresh memory once, however many of its memories went.
            for k in sorted({i // size for i in fresh}):
                a, b = k * size, (k + 1) * size
                if b > T or not is_settled(settled, a, b):
                    continue
                dropped.add((a, b))
                self.file.conn.execute("DELETE FROM summaries WHERE size = ? AND idx = ?", (size, a // size))
                self.digests.bind(summary_slot(size, a // size), None)
                if not erased.covers(a, b):
                    drops["p"].setdefault(size, {})[a // size] = version
        gone = sorted(dropped, key=lambda blk: (blk[1] - blk[0], blk[0]))
        holes = {size: list(ks) for size, ks in settled.holes.items()}
        for a, b in gone:
            holes.setdefault(b - a, []).append(a // (b - a))
        self.save_holes(holes, erased)
        self._save_drops(drops)
        return gone

    def level(self, size: int) -> Iterator[str]:
        """The summaries of one level up to its first hole, in order (OptMem's
        levels are dense: an export writes each up to its first hole; docs/DESIGN.md, "Erase")."""
        if not self.file.made("summaries"):
            return
        with closing(
            self.file.conn.execute(
                f"SELECT idx, sealed, {self.codec.epoch_sql('summaries')} FROM summaries WHERE size = ? ORDER BY idx",
                (size,),
            )
        ) as rows:
            for expected, (idx, sealed, epoch) in enumerate(rows):
                if idx != expected:
                    return
                yield self.summary_text(size, idx, sealed, epoch)

    def level_sizes(self) -> list[int]:
        if not self.file.made("summaries"):
            return []
        return [r[0] for r in self.file.conn.execute("SELECT DISTINCT size FROM summaries ORDER BY size")]

    def _save_drops(self, drops: dict[str, Any]) -> None:
        self.file.drops = drops
        text = json.dumps(
            {
                "s": {str(k): v for k, v in drops["s"].items()},
                "p": {str(k): {str(i): v for i, v in recs.items()} for k, recs in drops["p"].items()},
            }
        )
        self.file.put_meta(DROPS_META, text)

    def _summary_valid(self, size: int, idx: int, written: int) -> bool:
        """A summary written at state version ``written`` is current unless
        its block was dropped (forgotten or erased over) after that: then it
        is an older copy put back."""
        need = self.file.drops["p"].get(size, {}).get(idx, 0)
        for start, v in self.file.drops["s"].get(size, ()):
            if start <= idx:
                need = max(need, v)
        return bool(written >= need)

    def open_summary(self, size: int, idx: int, sealed: bytes, epoch: int | None) -> tuple[int, bytes]:
        """The state version a summary was written at (0: before the field)
        and its padded text. An unversioned summary is the one layout of
        :data:`SUMMARY_PLAINTEXT_BYTES` (formats.py keeps every bucketed
        length off it); the version field of one padded to one size has
        zeros where a bucketed one's has :data:`BUCKETED_MARK`."""
        plain = self.digests.open_bound(summary_slot(size, idx), sealed, epoch, f"{size}|{idx}")
        if len(plain) == SUMMARY_PLAINTEXT_BYTES:
            return 0, plain
        return int.from_bytes(plain[2:SUMMARY_VERSION_BYTES], "big"), plain[SUMMARY_VERSION_BYTES:]
