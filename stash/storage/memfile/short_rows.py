"""Old log rows stored short, and rebuilt byte for byte when read.

A memory row of the releases before "rows in buckets" seals a plaintext of
one size (312 or 320 bytes): a 2-byte length, the text, zeros, and 4 last
bytes (the writer, or zeros). XChaCha20 encrypts by adding a key stream, so
the ciphertext over the zeros *is* that stream, which the memory's key and
the row's nonce give back (:func:`aead.keystream`). A short row keeps
everything else: which full length it had, the nonce, the ciphertext up to
the end of the text's bucket, the last 4 bytes and the tag. Rebuilt, it is
the same sealed value, so the row still opens under its own key and
position, and the log's running digest, every head recorded, and every pin
a client holds stay what they were.

Once a memory is erased its key is gone, and with it the stream: the erasure
first records the missing bytes (the row's *tail*, :func:`tail_of`), so the
running digest can still be computed over that row.

Layout: ``code (1) || nonce (24) || ciphertext[:kept] || ciphertext[-4:] ||
tag (16)``, where ``kept + 4`` is a multiple of :data:`formats.BUCKET_BYTES`
smaller than the full plaintext. Its length is ``32·k + 41``, which no full
row has (``32·k + 40``, 352 and 360), so a row's length tells its form.
"""

from __future__ import annotations

from ...core.errors import Damaged
from ...crypto import aead
from .. import formats

LAST_BYTES = 4  # the writer's id (or zeros): kept as they are
SHORT_OVERHEAD = formats.SHORT_ROW_OVERHEAD  # 41: every short row is 32·k + 41 bytes
CODE_BYTES = SHORT_OVERHEAD - aead.OVERHEAD  # 1
CODES = {1: formats.MEMORY_PLAINTEXT_BYTES, 2: formats.OLDER_MEMORY_PLAINTEXT_BYTES}
"""The first byte of a short row: the full plaintext length it stands for."""
_CODE_OF = {full: code for code, full in CODES.items()}
FULL_SEALED = frozenset(full + aead.OVERHEAD for full in CODES.values())  # 352 and 360: the rows that may be shortened


def is_short(blob: bytes) -> bool:
    return len(blob) % formats.BUCKET_BYTES == SHORT_OVERHEAD % formats.BUCKET_BYTES


def _parts(blob: bytes) -> tuple[int, int, bytes]:
    """``(full plaintext length, bytes kept before the cut, nonce)``, or
    Damaged for a blob no short row can be."""
    full = CODES.get(blob[0]) if blob else None
    kept = len(blob) - SHORT_OVERHEAD - LAST_BYTES
    if full is None or not 0 < kept < full - LAST_BYTES or not is_short(blob):
        raise Damaged("A stored memory row has an impossible layout; restore this store from a backup.")
    return full, kept, blob[CODE_BYTES : CODE_BYTES + aead.NONCE_BYTES]


def shorten(sealed: bytes, plain: bytes) -> bytes | None:
    """The short form of a full row ``sealed`` whose opened plaintext is
    ``plain``, or None when it would not be shorter (a text that fills its
    bucket to the end) or the row is not a one-size row."""
    full = len(plain)
    if full not in _CODE_OF or len(sealed) != full + aead.OVERHEAD:
        return None
    text = int.from_bytes(plain[:2], "big")
    padded = formats.bucket(2 + text + LAST_BYTES, full)
    kept = padded - LAST_BYTES
    if padded >= full or any(plain[kept : full - LAST_BYTES]):
        return None
    nonce, ct = sealed[: aead.NONCE_BYTES], sealed[aead.NONCE_BYTES :]
    return bytes([_CODE_OF[full]]) + nonce + ct[:kept] + ct[full - LAST_BYTES : full] + ct[full:]


def tail_of(blob: bytes, key: bytes) -> bytes:
    """The ciphertext a short row leaves out: the key stream over its zeros."""
    full, kept, nonce = _parts(blob)
    return aead.keystream(key, nonce, full - LAST_BYTES)[kept:]


def expand(blob: bytes, *, key: bytes | None = None, tail: bytes | None = None) -> bytes:
    """The full sealed row a short one stands for, from the memory's key or
    from the tail recorded when its key was erased. Wrong bytes anywhere (the
    blob, the key, the tail) give a value that fails to open and a running
    digest that does not match: they are never served."""
    full, kept, nonce = _parts(blob)
    if tail is None:
        if key is None:
            raise Damaged(
                "A stored memory row cannot be rebuilt: its key and its recorded tail are both gone; "
                "restore this store from a backup."
            )
        tail = aead.keystream(key, nonce, full - LAST_BYTES)[kept:]
    if len(tail) != full - LAST_BYTES - kept:
        raise Damaged("A stored memory row's recorded tail has the wrong size; restore this store from a backup.")
    body = blob[CODE_BYTES + aead.NONCE_BYTES :]
    return nonce + body[:kept] + tail + body[kept : kept + LAST_BYTES] + body[kept + LAST_BYTES :]
