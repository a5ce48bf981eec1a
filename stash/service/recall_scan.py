"""A recall over the whole log, read newest first from the recall cache.

The log is read as the memories after the last complete piece (opened row by
row, at most ``PIECE - 1`` of them) and then the pieces of
:mod:`stash.storage.recallcache.rendered_log`, newest first, each one AEAD for 4,096
memories. A piece that is missing or no longer opens (written before an
erasure, moved, damaged) is rendered from the log instead, exactly as a scan
without a cache would, and written back for the next recall. Walking newest
first means only the newest pieces ever have lines decoded: once the answer's
byte budget is spent, older pieces are only counted.

The answer is exactly one pass's (docs/DESIGN.md, "Recall"): every matching line counted,
and the newest matches that fit ``part_bytes`` kept, oldest first — the
longest run of newest matches that fits, which is what OptMem's "append, then
drop the oldest while over budget" leaves.
"""

from __future__ import annotations

import queue
import threading
from typing import cast

from ..core.recall import Matcher
from ..storage.memfile import KEYS_PER_CHUNK, SCAN_BATCH, MemoryFile
from ..storage.recallcache.rendered_log import PIECE, WRITE_PIECES, ScanCache

assert PIECE % SCAN_BATCH == 0, "a piece is built from whole scan batches"


def _cost(lines: list[str]) -> int:
    return sum(len(line.encode()) + 1 for line in lines)


_AHEAD = 4  # pieces the reader may get ahead of the matcher: ~5 MB of plaintext
_DONE = object()
_Piece = tuple[int, bytes, list[str] | None]  # (piece, plain, lines) on the reader's queue


def _read_pieces(mf: MemoryFile, pieces: int, out: queue.Queue[object], stop: threading.Event) -> None:
    """The reader thread: every piece from ``pieces - 1`` down to 0 as
    ``(piece, plain, lines)`` on ``out`` (``lines`` only for a piece that
    cannot be cached), pieces rebuilt from the log written back; then
    ``_DONE``, or the exception that stopped it. It alone uses the file's
    connection until it has finished."""
    cache = None
    try:
        fk = mf.file_keys()
        cache = ScanCache(
            mf.conn, fk.path.parent, mf.user_id, fk.rows_key, KEYS_PER_CHUNK, mf.erased_ids, mf.chunk_digests
        )
        built: dict[int, bytes] = {}
        for piece, plain in cache.pieces(pieces):
            if stop.is_set():
                break
            lines = None
            if plain is None:
                lines = [line for batch in mf.scan((piece + 1) * PIECE, piece * PIECE) for line in batch]
                plain = ("\n".join(lines) + "\n").encode()
                if plain.count(b"\n") == PIECE:
                    built[piece], lines = plain, None
                # else: a line with a newline in it (outside the contract) is
                # never cached and is matched line by line.
                if len(built) >= WRITE_PIECES:
                    cache.store(built)
                    built.clear()
            out.put((piece, plain, lines))
        if not stop.is_set():
            cache.store(built)
        out.put(_DONE)
    except BaseException as exc:  # handed to the request's thread, which raises it
        out.put(exc)
    finally:
        if cache is not None:
            cache.close()


def recall(
    mf: MemoryFile, matcher: Matcher, part_bytes: int, deadline: float, stop: int | None = None
) -> tuple[list[str], int]:
    """``(kept, total)`` over memories ``[0, stop)`` (``stop`` defaults to
    the log's length; a paging ``before`` bound is this ``stop``).

    Two threads: one reads and opens pieces (SQLite and libsodium release the
    GIL), this one matches them (so does RE2), so a long recall uses both
    cores of a small machine without a second process or a second copy of
    any key."""
    T = mf.count()
    stop = T if stop is None else max(0, min(stop, T))
    pieces = stop // PIECE
    tail = [line for batch in mf.scan(stop, pieces * PIECE) for line in batch]
    kept, total = matcher.scan(tail, part_bytes, deadline=deadline)
    parts = [kept]  # newest first
    room = part_bytes - _cost(kept) if len(kept) == total else -1  # -1: budget spent
    if not pieces:
        return kept, total
    found: queue.Queue[object] = queue.Queue(maxsize=_AHEAD)
    halt = threading.Event()
    reader = threading.Thread(target=_read_pieces, args=(mf, pieces, found, halt), name="recall-reader", daemon=True)
    reader.start()
    try:
        while (item := found.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            piece, plain, lines = cast(_Piece, item)  # what _read_pieces puts, when not _DONE or an exception
            if lines is not None:
                got, count = matcher.scan(lines, max(room, 0), deadline=deadline)
                whole = len(got) == count
            else:
                got, count, whole = matcher.scan_joined(plain, max(room, 0), deadline=deadline, first_id=piece * PIECE)
            total += count
            if room >= 0:
                parts.append(got)
                room = room - _cost(got) if whole else -1
    finally:
        halt.set()
        while reader.is_alive():  # unblock a reader waiting on a full queue
            try:
                found.get(timeout=0.05)
            except queue.Empty:
                pass
        reader.join()
    return [line for part in reversed(parts) for line in part], total
