"""The recall cache: the rendered log, many memories per sealed piece.

A recall reads every memory, and opening one AEAD per row is what such a
scan spends most on; opening one per :data:`PIECE` memories is not. So the
rendered lines of each complete, aligned run of ``PIECE`` memories are kept,
joined by newlines, in one sealed value of the ``scan_cache`` table of the
user's ``recall.db`` (schema.sql, section ``scan_cache``): a plain SQLite
file beside ``memory.db``, since every value in it is sealed already — read
through SQLCipher as well, each piece would be decrypted twice. Backups skip
it; it is rebuilt after a restore.

What keeps it honest:

* **A cache, never the truth.** Every piece can be dropped and rebuilt from the
  log; a piece that is missing, or fails to open for any reason, is rebuilt
  from the log, which is checked as every read checks it.
* **Sealed and bound.** Each piece is XChaCha20-Poly1305 under the file's rows
  key with associated data naming the user, the table, the piece's range *and*
  a BLAKE2b digest of the sealed ``memory_keys`` chunks that cover it and of
  the erased ids in its range (from the erasure record, which the memory
  file's authenticated head covers). The chunks stand in it as the digests
  the file's authenticated tree of row digests holds for them (memfile/bound.py;
  their nonces in a file whose rows are not bound yet), so a piece and key
  chunks put back together from another history of the same user do not
  open: they are not the chunks the state holds. Moved to another position or user's file
  it fails to open; a piece written before an erasure no longer opens after
  it, even when the key chunk that held the erased key is put back from an
  older copy together with the old ``recall.db`` (the nonces match again, the
  erased ids do not), so the cache never shows a memory that the erasure
  record says is gone.
* **Erasure shreds it.** :func:`invalidate` deletes the pieces that hold the
  given memories (``secure_delete`` zeroes the freed pages), and once the
  erasure has committed :func:`flush` folds ``recall.db``'s WAL into it and
  truncates it, as it does the memory file's and the key ring's
  (``Session.flush_memory``). The erase path calls :func:`invalidate` inside
  its transaction on ``memory.db``, holding that file's write lock, and
  :meth:`ScanCache.store`
  writes pieces only under the same lock after checking the key digests
  again — so no piece holding erased text is written after it, and the erased
  text survives in no piece.
* **Compressed, then padded.** A piece's lines are compressed (zlib,
  :data:`ZLIB_LEVEL`) and padded to a multiple of :data:`PAD_BYTES` before
  they are sealed, so its size reveals only how well its ``PIECE`` memories
  compress, to within ``PAD_BYTES`` bytes (about their average length and
  how much they repeat one another; the log's rows show each length to
  within a bucket, formats.py). Only complete pieces are written, each once
  per log range, so an outsider cannot watch one grow memory by memory. A
  piece of the uncompressed layout (associated data without
  :data:`COMPRESSED`) no longer opens and is rebuilt from the log, as any
  piece that does not open is.
* **Best effort to write.** Pieces are written by the recall that found them
  missing, a few per transaction; a store that cannot be written
  (read-only, busy, full) is still served from the log, and writes nothing.

A recall served from a piece answers what the log held when the piece was
built and authenticated; damage done to a log row *after* that is found by the
reads that open the row (wake, zoom, nap sources, export) and by ``stash
verify``, not by the recall.
"""

from __future__ import annotations

import bisect
import hashlib
import sqlite3
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from ...crypto import aead
from .. import safeopen
from ..sqlite.schema import sections
from ..sqlite.transactions import BUSY_TIMEOUT_MS, write_transaction
from ..sqlite.transactions import flush as flush_wal

PIECE = 4096
"""Memories per piece: a whole number of key chunks (32 of 128) and one
``MemoryFile.scan`` batch, so a piece is built from exactly one batch."""

PAD_BYTES = 4096
MAX_LINE_BYTES = len("#18446744073709551615 YYYY-MM-DD \n") + 280
MAX_PLAIN = PIECE * MAX_LINE_BYTES  # the longest piece of lines
MAX_PADDED = -(-(MAX_PLAIN + 4) // PAD_BYTES) * PAD_BYTES
LENGTH_BYTES = 4
ZLIB_LEVEL = 1
"""The recall cache's compression level: measured on bench/build.py's text
(bench/HISTORY.md, "Issue 27, item 3: rows in buckets"), level 1 takes a piece to 27 % of its lines in
4 ms, level 6 to 23 % in 42 ms; a first recall at a million builds 244
pieces, and the lock-free reader decompresses every piece of each recall."""
COMPRESSED = b"|zlib"  # in a compressed piece's associated data
TABLE = "scan_cache"
WORD_TABLE = "word_cache"
WORD_TAIL_TABLE = "word_tail"
WORD_SEG_TABLE = "word_segs"
WORD_TAIL_SEG_TABLE = "word_tail_segs"
WORD_TAIL = 512
"""The word index's pieces (:mod:`stash.storage.recallcache.word_index`), in the same file,
sealed and bound the same way, deleted by the same :func:`invalidate`: one per
``PIECE`` memories, and one per ``WORD_TAIL`` memories after the last of those."""
WRITE_PIECES = 16  # pieces per write transaction: the write lock is held ~tens of ms


CACHE_FILE = "recall.db"


def _connect(folder: Path, *, create: bool) -> sqlite3.Connection | None:
    """The cache file of a user's folder, or None if it is not there (and
    ``create`` is false) or cannot be opened: the log answers then."""
    path = Path(folder) / CACHE_FILE
    if not create and not path.is_file():
        return None
    try:
        # A crafted cache is not read: the log answers.
        conn = safeopen.open_plain(path, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
    except sqlite3.Error:
        return None
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")  # a cache: a lost piece is rebuilt
        conn.execute("PRAGMA secure_delete = ON")
        if create:
            conn.executescript(sections()[TABLE])
    except sqlite3.Error:
        conn.close()
        return None
    return conn


def invalidate(folder: Path, ids: list[int]) -> None:
    """Delete every piece that holds one of memories ``ids`` from the cache
    of the user whose folder is ``folder``. The erase path calls it while it
    holds the memory file's write lock (see the module docstring), and
    :func:`flush` once the erasure has committed: the WAL is not folded
    here, where waiting for the cache's readers would hold every writer of
    the memory file. A cache that cannot be opened to do so is deleted
    whole."""
    if not ids:
        return
    path = Path(folder) / CACHE_FILE
    if not path.exists():
        return
    conn = _connect(folder, create=False)
    try:
        if conn is None:
            raise sqlite3.OperationalError("cannot open the recall cache")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table, size in (
            (TABLE, PIECE),
            (WORD_TABLE, PIECE),
            (WORD_TAIL_TABLE, WORD_TAIL),
            (WORD_SEG_TABLE, PIECE),
            (WORD_TAIL_SEG_TABLE, WORD_TAIL),
        ):
            if table in tables or table == TABLE:
                conn.executemany(f"DELETE FROM {table} WHERE piece = ?", [(i // size,) for i in sorted(set(ids))])
    except sqlite3.Error:
        _delete(path)
    finally:
        if conn is not None:
            conn.close()


def flush(folder: Path) -> bool:
    """Fold the cache's WAL into ``recall.db`` and truncate it
    (:func:`files.flush`), after an erasure: the pieces it deleted leave no
    copy there. True when done or when there is no cache; a cache that
    cannot be opened is deleted whole (it is rebuilt from the log)."""
    path = Path(folder) / CACHE_FILE
    if not path.exists():
        return True
    conn = _connect(folder, create=False)
    if conn is None:
        _delete(path)
        return not path.exists()
    try:
        return flush_wal(conn)
    finally:
        conn.close()


def _delete(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)


def _pad(plain: bytes) -> bytes:
    n = len(plain)
    size = -(-(n + LENGTH_BYTES) // PAD_BYTES) * PAD_BYTES
    return n.to_bytes(LENGTH_BYTES, "big") + plain + bytes(size - LENGTH_BYTES - n)


def _inflate(packed: bytes) -> bytes | None:
    """A compressed piece's lines, or None when they are not a whole zlib
    stream of at most :data:`MAX_PLAIN` bytes (a piece sealed under the
    rows key is one; the bound keeps a damaged one from costing more)."""
    d = zlib.decompressobj()
    try:
        plain = d.decompress(packed, MAX_PLAIN)
    except zlib.error:
        return None
    return plain if d.eof and not d.unconsumed_tail and not d.unused_data else None


def _unpad(padded: bytes) -> bytes | None:
    n = int.from_bytes(padded[:LENGTH_BYTES], "big")
    if n > len(padded) - LENGTH_BYTES:
        return None
    return padded[LENGTH_BYTES : LENGTH_BYTES + n]


class ScanCache:
    """The pieces of one open memory file. ``rows_key`` seals them;
    ``user_id`` is bound into every piece. ``table`` names the table its
    pieces live in (and the schema section that makes it): a subclass keeps
    other pieces of the same range beside these, bound the same way."""

    table = TABLE
    size = PIECE  # memories per piece: a whole number of key chunks
    _marks = "?, ?"  # a row of the table: (piece, sealed)

    def __init__(
        self,
        conn: sqlite3.Connection,
        folder: Path,
        user_id: str,
        rows_key: bytes,
        keys_per_chunk: int,
        erased: frozenset[int] = frozenset(),
        chunk_digests: Callable[[int, int], dict[int, bytes] | None] | None = None,
    ) -> None:
        self.conn = conn  # the memory file: its key chunks, and its write lock
        # What the memory file's authenticated tree holds for its key chunks
        # (MemoryFile.chunk_digests; None for a file whose rows are not bound).
        self._chunk_digests = chunk_digests
        self.folder = Path(folder)
        self.db: sqlite3.Connection | None = None
        self.user_id = user_id
        self._key = rows_key
        self._chunks_per_piece = self.size // keys_per_chunk
        self.digests: dict[int, bytes] = {}
        self._erased = sorted(erased)  # the authenticated erasure record of the open memory file

    def _aad(self, piece: int, keys_digest: bytes) -> bytes:
        return (
            f"stash/v1|{self.user_id}|{self.table}|{piece * self.size}-{(piece + 1) * self.size - 1}|".encode()
            + keys_digest
        )

    def _keys_digests(self, start: int, stop: int) -> dict[int, bytes]:
        """For each piece in ``[start, stop)`` whose key chunks are all there,
        a digest of those chunks' nonces and of the erased ids in the piece
        (32 bytes), read in one ordered pass. A piece with no erased id has
        the digest of its nonces alone, as pieces written before erasures
        were bound.

        The nonce stands for the whole sealed chunk: every re-seal (an
        erasure) draws a fresh random 24-byte nonce, and a chunk whose other
        bytes were changed under an old nonce fails to open when its keys are
        read. Putting an old chunk back brings its old nonce back, and its old
        keys with it: the log itself opens again then, so the cache shows
        nothing more."""
        per = self._chunks_per_piece
        out: dict[int, bytes] = {}
        bound = self._chunk_digests(start * per, stop * per) if self._chunk_digests is not None else None
        if bound is not None:
            for piece in range(start, stop):
                got = [bound.get(c) for c in range(piece * per, (piece + 1) * per)]
                if all(got):
                    out[piece] = self._digest(piece, b"|bound|" + b"".join(g for g in got if g))
            return out
        if (
            self.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'memory_keys'").fetchone()
            is None
        ):
            return out  # no key chunk made yet (schema.sql, "Pages"): no piece has its keys
        rows = self.conn.execute(
            "SELECT chunk, substr(sealed, 1, ?) FROM memory_keys WHERE chunk >= ? AND chunk < ? ORDER BY chunk",
            (aead.NONCE_BYTES, start * per, stop * per),
        )
        nonces: list[bytes] = []
        piece = -1
        for chunk, nonce in rows:
            if chunk // per != piece:
                piece, nonces = chunk // per, []
            if chunk != piece * per + len(nonces):  # a chunk is missing: the log read reports it
                continue
            nonces.append(nonce)
            if len(nonces) == per:
                out[piece] = self._digest(piece, b"".join(nonces))
        return out

    def _digest(self, piece: int, keys: bytes) -> bytes:
        """A piece's digest of its key chunks (``keys``) and its erased ids."""
        h = hashlib.blake2b(keys, digest_size=32, person=b"stash.scancache")
        lo = bisect.bisect_left(self._erased, piece * self.size)
        hi = bisect.bisect_left(self._erased, (piece + 1) * self.size)
        if lo < hi:
            h.update(b"|erased|" + ",".join(map(str, self._erased[lo:hi])).encode())
        return h.digest()

    def pieces(self, count: int, start: int = 0) -> Iterator[tuple[int, bytes | None]]:
        """``(piece, joined lines or None)`` for pieces ``count - 1`` down to
        ``start``: the plaintext (lines joined and ended by ``\\n``) of each piece that
        opens, None for one that is missing or does not open (stale, moved,
        damaged: the caller rebuilds it from the log). Each piece is read by
        its own statement, so :meth:`store` may write between two of them."""
        if count <= start:
            return
        digests, have = self._begin(count, start)
        opener = aead.BulkOpener(MAX_PADDED)
        for piece in range(count - 1, start - 1, -1):
            plain = None
            if piece in have and piece in digests and self.db is not None:
                try:
                    row = self.db.execute(f"SELECT sealed FROM {self.table} WHERE piece = ?", (piece,)).fetchone()
                except sqlite3.Error:
                    row = None
                if row is not None:
                    try:
                        packed = _unpad(opener.open(self._key, row[0], self._aad(piece, digests[piece]) + COMPRESSED))
                        plain = None if packed is None else _inflate(packed)
                    except aead.Unsealable:
                        plain = None
            yield piece, plain

    def _begin(self, count: int, start: int) -> tuple[dict[int, bytes], set[int]]:
        """The key digests of pieces ``[start, count)`` (kept for
        :meth:`store`) and which of them the table holds, the cache file
        opened. The digests are read before any piece or log row: a piece
        rebuilt from the log is written only if its keys still have them."""
        self.digests = digests = self._keys_digests(start, count)
        have: set[int] = set()
        self.db = _connect(self.folder, create=False)
        if self.db is not None:
            try:
                have = {
                    r[0]
                    for r in self.db.execute(
                        f"SELECT DISTINCT piece FROM {self.table} WHERE piece >= ? AND piece < ?", (start, count)
                    )
                }
            except sqlite3.Error:
                have = set()
        return digests, have

    def _pack(self, plain: bytes) -> bytes:
        """What :meth:`_rows` seals of a piece, made before the write lock
        is taken (compressing costs more than sealing)."""
        return zlib.compress(plain, ZLIB_LEVEL)

    def _rows(self, piece: int, packed: bytes, keys_digest: bytes) -> list[tuple[int | bytes, ...]]:
        """The sealed rows that keep piece ``piece``, :meth:`_pack` made (for :meth:`store`)."""
        return [(piece, aead.seal(self._key, _pad(packed), self._aad(piece, keys_digest) + COMPRESSED))]

    def _prepare(self, db: sqlite3.Connection) -> None:
        """Make the table :meth:`store` writes (outside any transaction)."""
        db.executescript(sections()[self.table])

    def store(self, built: dict[int, bytes]) -> None:
        """Seal and write pieces rebuilt from the log since :meth:`pieces`
        read the key digests, a few per transaction. Inside each transaction
        the digests are read again and a piece whose keys changed meanwhile
        (an erasure landed between) is not written: it may hold text that no
        longer exists. Gives up quietly when the file cannot be written now
        (busy, read-only, full): the next recall tries again."""
        items = sorted((p, self._pack(plain)) for p, plain in built.items() if p in self.digests)
        if not items:
            return
        if self.db is None:
            self.db = _connect(self.folder, create=True)
            if self.db is None:
                return
        try:
            self._prepare(self.db)
            for k in range(0, len(items), WRITE_PIECES):
                batch = items[k : k + WRITE_PIECES]
                # The memory file's write lock, held while the digests are
                # read again and the pieces written: an erasure cannot land
                # in between.
                self.conn.execute("BEGIN IMMEDIATE")
                try:
                    now = self._keys_digests(batch[0][0], batch[-1][0] + 1)
                    rows = [
                        row
                        for p, plain in batch
                        if now.get(p) == self.digests[p]
                        for row in self._rows(p, plain, now[p])
                    ]
                    with write_transaction(self.db):
                        self.db.executemany(f"INSERT OR REPLACE INTO {self.table} VALUES ({self._marks})", rows)
                finally:
                    self.conn.rollback()  # nothing was written to the memory file
        except Exception as exc:
            if isinstance(exc, sqlite3.Error) or type(exc).__module__.startswith("sqlcipher3"):
                return  # not written now; the log still answers
            raise

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None
