"""Key epochs: what a revocation changes so that a revoked token, given every
copy of every file ever made, opens nothing written after it.

A store's rows are sealed under the key of its current *epoch*. Epoch 0's key
is the store's first key (the "master key" of stores made before epochs); every
revocation (and every owner rotation) draws a fresh 32-byte epoch key. Each
live capability reaches the current epoch key through a *box*: the key sealed
(libsodium sealed box: X25519 + XSalsa20-Poly1305, PyNaCl ``SealedBox``) to
that capability's public key. The capability's X25519 private key is derived
from its KEK, i.e. from its token secret through argon2id, so the server keeps
only the public key and can seal a new epoch to every live capability without
ever holding their secrets. The older epoch keys are kept sealed under the
current one (:meth:`KeyChain.seal_older`), so a live capability reaches every
epoch and reads everything; a revoked capability's box is destroyed and never
re-sealed, so from any copy of the key ring it reaches only the epochs up to
its revocation.

Sizes: an epoch key is :data:`EPOCH_KEY_BYTES`; a box is
:data:`BOX_BYTES` (48 bytes of sealed-box overhead over an 8-byte epoch number
and the key); the older keys are 32 bytes each plus the AEAD overhead.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from nacl import bindings
from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, PublicKey, SealedBox

from . import aead

EPOCH_KEY_BYTES = aead.KEY_BYTES  # 32
PUBLIC_KEY_BYTES = PublicKey.SIZE  # 32
EPOCH_NUMBER_BYTES = 8
SEAL_OVERHEAD = bindings.crypto_box_SEALBYTES  # 48: the ephemeral public key and the MAC
BOX_BYTES = SEAL_OVERHEAD + EPOCH_NUMBER_BYTES + EPOCH_KEY_BYTES  # 88
MAX_EPOCHS = 1 << 20  # far beyond any real number of revocations; bounds what a hand-edited file can ask for


def capability_private_key(kek: bytes) -> PrivateKey:
    """The X25519 private key of the capability whose KEK is ``kek``: BLAKE2b
    keyed by the KEK, so it exists only while the token's secret is present."""
    if len(kek) != aead.KEY_BYTES:
        raise ValueError(f"a KEK is exactly {aead.KEY_BYTES} bytes")
    seed = hashlib.blake2b(b"x25519", key=kek, digest_size=32, person=b"stash.cap.x25519").digest()
    return PrivateKey(seed)


def box_epoch(public_key: bytes, epoch: int, key: bytes) -> bytes:
    """Seal epoch ``epoch``'s key to one capability's public key."""
    if len(public_key) != PUBLIC_KEY_BYTES:
        raise ValueError(f"a public key is exactly {PUBLIC_KEY_BYTES} bytes")
    if len(key) != EPOCH_KEY_BYTES or not 0 <= epoch < MAX_EPOCHS:
        raise ValueError("an epoch key is 32 bytes and its number in range")
    return SealedBox(PublicKey(public_key)).encrypt(epoch.to_bytes(EPOCH_NUMBER_BYTES, "big") + key)


def open_box(private_key: PrivateKey, box: bytes) -> tuple[int, bytes]:
    """``(epoch, key)`` from a box sealed to this capability, or
    :class:`aead.Unsealable` when it was sealed to another key or altered."""
    if len(box) != BOX_BYTES:
        raise aead.Unsealable("an epoch box has the wrong size")
    try:
        plain = SealedBox(private_key).decrypt(box)
    except CryptoError:
        raise aead.Unsealable("the epoch box does not open with this capability") from None
    return int.from_bytes(plain[:EPOCH_NUMBER_BYTES], "big"), plain[EPOCH_NUMBER_BYTES:]


def seal_for(public_key: bytes, context: bytes, plain: bytes) -> bytes:
    """``plain`` sealed to one capability's public key, bound to ``context``
    (what it is and where it is kept): what a rotation leaves for its new
    owner token to open at its first use (stash/service/handover.py)."""
    if len(public_key) != PUBLIC_KEY_BYTES:
        raise ValueError(f"a public key is exactly {PUBLIC_KEY_BYTES} bytes")
    return SealedBox(PublicKey(public_key)).encrypt(context + plain)


def open_for(private_key: PrivateKey, context: bytes, sealed: bytes) -> bytes:
    """What :func:`seal_for` sealed to this capability for ``context``, or
    :class:`aead.Unsealable` when it was sealed to another key or another
    context, or altered."""
    try:
        plain = SealedBox(private_key).decrypt(sealed)
    except CryptoError:
        raise aead.Unsealable("the sealed value does not open with this capability") from None
    if not plain.startswith(context):
        raise aead.Unsealable("the sealed value was moved from another place")
    return plain[len(context) :]


def _older_aad(user_id: str, epoch: int) -> bytes:
    return f"stash/v2|{user_id}|epochs|{epoch}".encode()


@dataclass(frozen=True)
class KeyChain:
    """Every epoch key of one store, oldest first; ``keys[-1]`` is current.

    Held for one request only. ``base`` (epoch 0's key) keys what must stay
    the same across epochs: the SQLCipher file key and the log's running
    digest; everything sealed in rows is under the current epoch's key."""

    user_id: str
    keys: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if not self.keys or any(len(k) != EPOCH_KEY_BYTES for k in self.keys):
            raise ValueError("a key chain holds one or more 32-byte keys")

    def __repr__(self) -> str:
        return f"KeyChain(user_id={self.user_id!r}, epoch={self.epoch}, keys=<hidden>)"

    @property
    def epoch(self) -> int:
        return len(self.keys) - 1

    @property
    def current(self) -> bytes:
        return self.keys[-1]

    @property
    def base(self) -> bytes:
        return self.keys[0]

    def key(self, epoch: int) -> bytes:
        if not 0 <= epoch <= self.epoch:
            raise KeyError(epoch)
        return self.keys[epoch]

    def advance(self) -> KeyChain:
        """The chain with one fresh epoch key added."""
        return KeyChain(self.user_id, (*self.keys, os.urandom(EPOCH_KEY_BYTES)))

    def seal_older(self) -> bytes | None:
        """The keys of every earlier epoch, sealed under the current one (None
        at epoch 0). Associated data binds user and epoch number."""
        if not self.epoch:
            return None
        return aead.seal(self.current, b"".join(self.keys[:-1]), _older_aad(self.user_id, self.epoch))

    @classmethod
    def open(cls, user_id: str, epoch: int, current: bytes, older: bytes | None) -> KeyChain:
        """The chain of a store at ``epoch`` whose current key is ``current``;
        :class:`aead.Unsealable` if ``older`` does not authenticate."""
        if not 0 <= epoch < MAX_EPOCHS:
            raise aead.Unsealable("epoch number out of range")
        if epoch == 0:
            if older is not None:
                raise aead.Unsealable("epoch 0 has no older keys")
            return cls(user_id, (current,))
        if older is None:
            raise aead.Unsealable("the older epoch keys are missing")
        plain = aead.open_sealed(current, older, _older_aad(user_id, epoch))
        if len(plain) != epoch * EPOCH_KEY_BYTES:
            raise aead.Unsealable("the older epoch keys have the wrong length")
        return cls(user_id, (*(plain[k : k + EPOCH_KEY_BYTES] for k in range(0, len(plain), EPOCH_KEY_BYTES)), current))
