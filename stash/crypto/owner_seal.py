"""Owner-only data: what only ``GET /grants`` and ``GET /audit`` show
(labels, audit events, last-used days), sealed so that the owner capability
alone opens it (docs/DESIGN.md, "Keys and capabilities").

The store has an *owner key pair* (X25519). Its private key is a random
32-byte seed that exists on disk only in the *owner box*: every owner seed the
store has had, sealed (libsodium sealed box) to the public key of the current
owner grant, whose private key is derived from the owner token's secret
(:func:`stash.crypto.epochs.capability_private_key`). The owner public key is
kept in clear, so any request — a full capability's import, a read
capability's export — can seal an event or a last-used day to the owner
without being able to open it again. The epoch keys, which every read and full
capability reaches, open none of it.

An owner rotation draws a new seed, so the previous owner token, given any
later copy of the key ring, opens nothing sealed after it; the older seeds
ride along in the new box, so the new owner reads the whole history.

Each sealed value carries its context (user, table, row) in its plaintext,
checked on opening, so a value moved to another row or user's key ring is
refused instead of shown.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, PublicKey, SealedBox

from . import aead

SEED_BYTES = 32
MAX_SEEDS = 1 << 16  # bounds what a hand-edited box may ask to be read
MARK = b"stash-owner1:"  # starts every value sealed to the owner key (no earlier format starts so)
PADDED = b"stash-owner2:"  # starts a value whose plaintext is padded (:func:`seal` with ``pad``)
LENGTH_BYTES = 2  # a padded plaintext starts with the value's length, big-endian


def _context(user_id: str, what: str) -> bytes:
    return f"stash/v2|{user_id}|{what}|".encode()


def seal(user_id: str, public_key: bytes, what: str, plain: bytes, pad: int = 0) -> bytes:
    """``plain`` sealed to the owner public key, bound to ``what`` (the
    table and row it is written to). With ``pad``, the plaintext is its
    2-byte length, the value and zeros up to the next multiple of ``pad``
    bytes, so the sealed size tells only that bucket, not the length."""
    if not pad:
        return MARK + SealedBox(PublicKey(public_key)).encrypt(_context(user_id, what) + plain)
    if len(plain) >= 1 << (8 * LENGTH_BYTES):
        raise ValueError("too long to pad")
    body = len(plain).to_bytes(LENGTH_BYTES, "big") + plain
    body += bytes(-len(body) % pad)
    return PADDED + SealedBox(PublicKey(public_key)).encrypt(_context(user_id, what) + body)


def is_sealed(value: bytes) -> bool:
    return value.startswith(MARK) or value.startswith(PADDED)


def _unpad(body: bytes) -> bytes:
    n = int.from_bytes(body[:LENGTH_BYTES], "big")
    value, rest = body[LENGTH_BYTES : LENGTH_BYTES + n], body[LENGTH_BYTES + n :]
    if len(body) < LENGTH_BYTES or len(value) != n or any(rest):
        raise aead.Unsealable("a padded owner value is malformed")
    return value


@dataclass(frozen=True)
class OwnerKeys:
    """Every owner seed of one store, oldest first; the last is current.
    Held for one owner request only."""

    user_id: str
    seeds: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if not self.seeds or any(len(s) != SEED_BYTES for s in self.seeds):
            raise ValueError("owner keys are one or more 32-byte seeds")

    def __repr__(self) -> str:
        return f"OwnerKeys(user_id={self.user_id!r}, seeds={len(self.seeds)})"

    @classmethod
    def new(cls, user_id: str) -> OwnerKeys:
        return cls(user_id, (os.urandom(SEED_BYTES),))

    def advance(self) -> OwnerKeys:
        """The keys with one fresh seed added (an owner rotation)."""
        return OwnerKeys(self.user_id, (*self.seeds, os.urandom(SEED_BYTES)))

    @property
    def public(self) -> bytes:
        return bytes(PrivateKey(self.seeds[-1]).public_key)

    def open(self, value: bytes, what: str) -> bytes:
        """What :func:`seal` sealed for ``what``, or :class:`aead.Unsealable`
        when it was altered, moved from another row, or sealed to a key this
        store never had."""
        if not is_sealed(value):
            raise aead.Unsealable("not a value sealed to the owner")
        padded = value.startswith(PADDED)
        body, context = value[len(MARK) :], _context(self.user_id, what)  # both marks are one length
        for seed in reversed(self.seeds):
            try:
                plain = SealedBox(PrivateKey(seed)).decrypt(body)
            except CryptoError:
                continue
            if not plain.startswith(context):
                raise aead.Unsealable("a sealed owner value was moved from another row")
            return _unpad(plain[len(context) :]) if padded else plain[len(context) :]
        raise aead.Unsealable("a sealed owner value does not open with this store's owner keys")

    def box(self, grant_id: int, grant_public_key: bytes) -> bytes:
        """Every seed, sealed to the owner grant ``grant_id``'s public key."""
        return SealedBox(PublicKey(grant_public_key)).encrypt(
            _context(self.user_id, f"owner_box|{grant_id}") + b"".join(self.seeds)
        )

    @classmethod
    def unbox(cls, user_id: str, grant_id: int, private_key: PrivateKey, box: bytes) -> OwnerKeys:
        """The seeds in the owner box of grant ``grant_id``, or
        :class:`aead.Unsealable`."""
        try:
            plain = SealedBox(private_key).decrypt(box)
        except CryptoError:
            raise aead.Unsealable("the owner box does not open with this capability") from None
        context = _context(user_id, f"owner_box|{grant_id}")
        body = plain[len(context) :]
        if not plain.startswith(context) or not body or len(body) % SEED_BYTES or len(body) > MAX_SEEDS * SEED_BYTES:
            raise aead.Unsealable("the owner box was altered or belongs to another grant")
        return cls(user_id, tuple(body[k : k + SEED_BYTES] for k in range(0, len(body), SEED_BYTES)))
