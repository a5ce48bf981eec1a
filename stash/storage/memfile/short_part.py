"""Rows stored short (short_rows.py) in the memory file: storing the log's
one-size rows short (``stash compact``), rebuilding them for every read and
every walk of the running digest, and the tails an erasure records for them
once their keys are gone."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ...crypto import aead
from .. import formats
from ..sqlite.transactions import write_transaction
from .log import ERASED_KEY, KEYS_PER_CHUNK
from .rows import RowCodec
from .short_rows import FULL_SEALED, SHORT_OVERHEAD, expand, is_short, shorten


class ShortRowsPart(RowCodec):
    def _open_row(self, i: int, key: bytes, stored: bytes) -> bytes:
        """Memory #i's padded plaintext from its row as stored, full or short."""
        return self._open(key, expand(stored, key=key) if is_short(stored) else stored, "log", i)

    def _tail(self, i: int) -> bytes | None:
        """The tail recorded for short row #i when its key was erased."""
        if not self._made("log_tails"):
            return None
        row = self.conn.execute("SELECT tail FROM log_tails WHERE id = ?", (i,)).fetchone()
        return None if row is None else bytes(row[0])

    def chain_rows(self, rows: Iterable[tuple[int, bytes]]) -> Iterator[bytes]:
        """The sealed bytes the running digest covers, row by row, for
        ``(id, row as stored)``: a short row is rebuilt from its memory's key,
        or from its recorded tail once the key is erased. Each key chunk is
        read once and not kept, so a walk over a million rows holds one."""
        c_now, chunk = -1, b""
        for i, stored in rows:
            if not is_short(stored):
                yield stored
                continue
            c = i // KEYS_PER_CHUNK
            if c != c_now:
                self._chunks.pop(c_now, None)
                chunk = self._chunk(c) or b""
                c_now = c
            slot = (i % KEYS_PER_CHUNK) * aead.KEY_BYTES
            key: bytes | None = chunk[slot : slot + aead.KEY_BYTES]
            if key == ERASED_KEY or len(key or b"") != aead.KEY_BYTES:
                key = None
            yield expand(stored, key=key, tail=None if key is not None else self._tail(i))
        self._chunks.pop(c_now, None)

    def _short_rows(self, ids: list[int]) -> dict[int, bytes]:
        """The rows of ``ids`` stored short (short_rows.py), as stored."""
        out: dict[int, bytes] = {}
        for k in range(0, len(ids) if self._made("log") else 0, 500):
            part = ids[k : k + 500]
            out.update(
                self.conn.execute(
                    f"SELECT id, sealed FROM log WHERE id IN ({', '.join('?' * len(part))}) "
                    f"AND length(sealed) % {formats.BUCKET_BYTES} = {SHORT_OVERHEAD % formats.BUCKET_BYTES}",
                    part,
                ).fetchall()
            )
        return out

    def _ensure_tails(self) -> None:
        """Make the tails table (schema.sql, "memory_tails") inside the
        caller's write transaction, as :meth:`_ensure_table` makes the others."""
        if not self._made("log_tails"):
            self._made_here.add("log_tails")
            formats.make_on_use(self.conn, "memory_tails", "log_tails")

    def shorten_rows(self, start: int, limit: int) -> tuple[int, int]:
        """Store up to ``limit`` one-size memory rows from id ``start`` on
        short (short_rows.py), in one write transaction; returns the id to go
        on from (the log's size once every row was looked at) and how many
        were shortened. Each is checked to rebuild to the very bytes it
        replaces before it is written, so what every row opens to, the
        running digest and every pin stay as they were. A row whose key is
        erased, or whose text fills its bucket, stays whole. The log's
        append-only trigger on updates is lifted for this transaction only
        and put back as it was: the state digest covers its text."""
        if not self._made("log"):
            return start, 0
        with write_transaction(self.conn):
            rows = self.conn.execute(
                f"SELECT id, sealed FROM log WHERE id >= ? AND length(sealed) IN "
                f"({', '.join('?' * len(FULL_SEALED))}) ORDER BY id LIMIT ?",
                (start, *sorted(FULL_SEALED), limit),
            ).fetchall()
            if not rows:
                return self.count(), 0
            self._chunks.clear()
            moved: list[tuple[bytes, int]] = []
            for i, sealed in rows:
                key = self._memory_key(i)
                if key is None:
                    continue
                short = shorten(sealed, self._open(key, sealed, "log", i))
                if short is not None and expand(short, key=key) == sealed:
                    moved.append((short, i))
            self._chunks.clear()
            if moved:
                (trigger,) = self.conn.execute(
                    "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = 'log_no_update'"
                ).fetchone()
                self.conn.execute("DROP TRIGGER log_no_update")
                self.conn.executemany("UPDATE log SET sealed = ? WHERE id = ?", moved)
                self.conn.execute(trigger)
        return rows[-1][0] + 1, len(moved)
