"""A recall over the whole log, read newest first from the recall cache.

The log is read as the memories after the last complete piece (opened row by
row, at most ``PIECE - 1`` of them) and then the pieces of
:mod:`stash.storage.scancache`, newest first, each one AEAD for 4,096
memories. A piece that is missing or no longer opens (written before an
erasure, moved, damaged) is rendered from the log instead, exactly as a scan
without a cache would, and written back for the next recall. Walking newest
first means only the newest pieces ever have lines decoded: once the answer's
byte budget is spent, older pieces are only counted.

The answer is exactly one pass's (SPEC §2.5): every matching line counted,
and the newest matches that fit ``part_bytes`` kept, oldest first — the
longest run of newest matches that fits, which is what OptMem's "append, then
drop the oldest while over budget" leaves.
"""

from __future__ import annotations

from ..core.recall import Matcher
from ..storage.memfile import KEYS_PER_CHUNK, SCAN_BATCH, MemoryFile
from ..storage.scancache import PIECE, WRITE_PIECES, ScanCache

assert PIECE % SCAN_BATCH == 0, "a piece is built from whole scan batches"


def _cost(lines: list[str]) -> int:
    return sum(len(line.encode()) + 1 for line in lines)


def recall(mf: MemoryFile, matcher: Matcher, part_bytes: int, deadline: float,
           stop: int | None = None) -> tuple[list[str], int]:
    """``(kept, total)`` over memories ``[0, stop)`` (``stop`` defaults to
    the log's length; a paging ``before`` bound is this ``stop``)."""
    T = mf.count()
    stop = T if stop is None else max(0, min(stop, T))
    pieces = stop // PIECE
    tail = [line for batch in mf.scan(stop, pieces * PIECE) for line in batch]
    kept, total = matcher.scan(tail, part_bytes, deadline=deadline)
    parts = [kept]  # newest first
    room = part_bytes - _cost(kept) if len(kept) == total else -1  # -1: budget spent
    cache = ScanCache(mf.conn, mf.user_id, mf.file_keys().rows_key, KEYS_PER_CHUNK)
    built: dict[int, bytes] = {}
    for piece, plain in cache.pieces(pieces):
        if plain is None:
            lines = [line for batch in mf.scan((piece + 1) * PIECE, piece * PIECE) for line in batch]
            plain = ("\n".join(lines) + "\n").encode()
            if plain.count(b"\n") != PIECE:
                # A line with a newline in it (outside the contract): never
                # cached, matched line by line.
                got, count = matcher.scan(lines, max(room, 0), deadline=deadline)
                total += count
                if room >= 0:
                    parts.append(got)
                    room = room - _cost(got) if len(got) == count else -1
                continue
            built[piece] = plain
            if len(built) >= WRITE_PIECES:
                cache.store(built)
                built.clear()
        got, count, whole = matcher.scan_joined(plain, max(room, 0), deadline=deadline)
        total += count
        if room >= 0:
            parts.append(got)
            room = room - _cost(got) if whole else -1
    cache.store(built)
    return [line for part in reversed(parts) for line in part], total
