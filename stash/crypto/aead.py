"""XChaCha20-Poly1305 sealing of stored rows (PyNaCl / libsodium).

A sealed value is ``nonce (24 bytes) || ciphertext || tag (16 bytes)``. Every
seal draws a fresh random nonce: 192 bits make random nonces safe for any
number of messages under one key. The associated data names where the value
belongs (user, table, position); opening it anywhere else fails, and the caller
must report that as damage rather than serve it.
"""

from __future__ import annotations

import os

from nacl import bindings
from nacl._sodium import ffi as _ffi  # PyNaCl's own libsodium handle
from nacl._sodium import lib as _lib

KEY_BYTES = bindings.crypto_aead_xchacha20poly1305_ietf_KEYBYTES  # 32
NONCE_BYTES = bindings.crypto_aead_xchacha20poly1305_ietf_NPUBBYTES  # 24
TAG_BYTES = bindings.crypto_aead_xchacha20poly1305_ietf_ABYTES  # 16
OVERHEAD = NONCE_BYTES + TAG_BYTES

# seal and open_sealed call libsodium through PyNaCl's cffi handle rather than
# through nacl.bindings: the same function and the same checks of what matters
# (key length, authentication), without the per-argument checks that cost
# more than the cipher itself on a row as short as ours.


class Unsealable(Exception):
    """The sealed bytes do not authenticate under this key and associated data:
    altered, truncated, moved to another row, table or user, or a wrong key."""


def _check_key(key: bytes) -> None:
    if len(key) != KEY_BYTES:
        raise ValueError(f"key must be exactly {KEY_BYTES} bytes")


def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """``nonce || ciphertext || tag`` under a fresh random nonce."""
    _check_key(key)
    nonce = os.urandom(NONCE_BYTES)
    out = _ffi.new("unsigned char[]", len(plaintext) + TAG_BYTES)
    if _lib.crypto_aead_xchacha20poly1305_ietf_encrypt(
        out, _ffi.NULL, plaintext, len(plaintext), aad, len(aad), _ffi.NULL, nonce, key
    ):
        raise RuntimeError("libsodium refused to seal")  # pragma: no cover - cannot fail for valid sizes
    return nonce + bytes(_ffi.buffer(out))


def open_sealed(key: bytes, sealed: bytes, aad: bytes) -> bytes:
    """The plaintext, or :class:`Unsealable` when the value does not
    authenticate under ``key`` and ``aad``; never partial bytes."""
    _check_key(key)
    n = len(sealed) - OVERHEAD
    if n < 0:
        raise Unsealable("sealed value is shorter than nonce and tag")
    out = _ffi.new("unsigned char[]", n or 1)
    if _lib.crypto_aead_xchacha20poly1305_ietf_decrypt(
        out, _ffi.NULL, _ffi.NULL, sealed[NONCE_BYTES:], n + TAG_BYTES, aad, len(aad), sealed[:NONCE_BYTES], key
    ):
        raise Unsealable("sealed value failed authentication")
    return bytes(_ffi.buffer(out, n))


def keystream(key: bytes, nonce: bytes, n: int) -> bytes:
    """The first ``n`` bytes the cipher adds to any plaintext sealed under
    ``key`` and ``nonce``: the ciphertext of ``n`` zero bytes (XChaCha20's
    stream does not depend on the associated data, only the tag does). So
    whoever holds the key can rebuild the ciphertext of a run of zeros."""
    _check_key(key)
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"nonce must be exactly {NONCE_BYTES} bytes")
    out = _ffi.new("unsigned char[]", n + TAG_BYTES)
    if _lib.crypto_aead_xchacha20poly1305_ietf_encrypt(out, _ffi.NULL, bytes(n), n, b"", 0, _ffi.NULL, nonce, key):
        raise RuntimeError("libsodium refused to seal")  # pragma: no cover - cannot fail for valid sizes
    return bytes(_ffi.buffer(out, n))


class BulkOpener:
    """Opens many values with one preallocated buffer.

    A recall decrypts every memory of the log; at a million rows the argument
    checks and allocations of :func:`open_sealed` cost more than the cipher.
    This calls the same libsodium function through PyNaCl's own cffi handle,
    with the same verification: a value that fails to authenticate raises
    :class:`Unsealable`, never returns bytes.
    """

    def __init__(self, max_plaintext: int) -> None:
        from nacl._sodium import ffi, lib  # PyNaCl's libsodium handle

        self._ffi = ffi
        self._fn = lib.crypto_aead_xchacha20poly1305_ietf_decrypt
        self._max = max_plaintext
        self._out = ffi.new("unsigned char[]", max_plaintext)
        self._buf = ffi.buffer(self._out)
        self._len = ffi.new("unsigned long long *")
        self._null = ffi.NULL

    def open(self, key: bytes, sealed: bytes, aad: bytes) -> bytes:
        return self.open_padded(key, sealed, aad, unpad_payload=False)

    def open_padded(self, key: bytes, sealed: bytes, aad: bytes, *, unpad_payload: bool = True) -> bytes:
        """Open a value; with ``unpad_payload`` return the payload that
        :func:`pad` wrapped, read straight out of the buffer."""
        n = len(sealed) - OVERHEAD
        if n < 0 or n > self._max or len(key) != KEY_BYTES:
            raise Unsealable("sealed value has the wrong size")
        if self._fn(
            self._out,
            self._len,
            self._null,
            sealed[NONCE_BYTES:],
            n + TAG_BYTES,
            aad,
            len(aad),
            sealed[:NONCE_BYTES],
            key,
        ):
            raise Unsealable("sealed value failed authentication")
        if not unpad_payload:
            return bytes(self._buf[: self._len[0]])
        size = self._out[0] << 8 | self._out[1]
        if size > n - 2:
            raise Unsealable("padded value has an impossible length")
        return bytes(self._buf[2 : 2 + size])


class BulkSealer:
    """Seals many values with one preallocated buffer: :func:`seal` without
    PyNaCl's per-call argument checks, which cost more than the cipher when a
    new key epoch re-seals a million summaries. Same libsodium function, a
    fresh random nonce per value, the same output layout."""

    def __init__(self, max_plaintext: int) -> None:
        from nacl._sodium import ffi, lib  # PyNaCl's libsodium handle

        self._fn = lib.crypto_aead_xchacha20poly1305_ietf_encrypt
        self._max = max_plaintext
        self._out = ffi.new("unsigned char[]", max_plaintext + TAG_BYTES)
        self._buf = ffi.buffer(self._out)
        self._len = ffi.new("unsigned long long *")
        self._null = ffi.NULL

    def seal(self, key: bytes, plaintext: bytes, aad: bytes) -> bytes:
        if len(key) != KEY_BYTES:
            raise ValueError(f"key must be exactly {KEY_BYTES} bytes")
        if len(plaintext) > self._max:
            raise ValueError("plaintext is larger than this sealer's buffer")
        nonce = os.urandom(NONCE_BYTES)
        if self._fn(self._out, self._len, plaintext, len(plaintext), aad, len(aad), self._null, nonce, key):
            raise RuntimeError("libsodium refused to seal")  # pragma: no cover - cannot fail for valid sizes
        return nonce + bytes(self._buf[: self._len[0]])


def pad(payload: bytes, size: int) -> bytes:
    """``payload`` as exactly ``size`` bytes: a 2-byte length, the payload,
    zeros. Sealing a padded value hides the payload's length."""
    if len(payload) > size - 2:
        raise ValueError(f"payload of {len(payload)} bytes does not fit {size}")
    return len(payload).to_bytes(2, "big") + payload + bytes(size - 2 - len(payload))


def unpad(padded: bytes) -> bytes:
    n = int.from_bytes(padded[:2], "big")
    if n > len(padded) - 2:
        raise Unsealable("padded value has an impossible length")
    return padded[2 : 2 + n]
