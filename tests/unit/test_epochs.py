"""Key epochs' crypto (stash/crypto/epochs.py) and the bulk sealer: known
answers, round trips, and tampering (a flipped byte, another capability's
box, another user's, memory's or epoch's older keys); a key chain in main
and in a second memory, each bound to its own store id."""

from __future__ import annotations

import hashlib
import os

import pytest
from nacl import bindings
from nacl.public import PrivateKey, PublicKey

from stash.crypto import aead, epochs
from stash.crypto.epochs import KeyChain
from tests.support.memories import MEMORIES, Memory

USER = "0123456789abcdef"


def flip(b: bytes, k: int) -> bytes:
    return b[:k] + bytes([b[k] ^ 1]) + b[k + 1 :]


def test_the_capability_key_pair_is_blake2b_of_the_kek_as_documented():
    kek = bytes(range(32))
    seed = hashlib.blake2b(b"x25519", key=kek, digest_size=32, person=b"stash.cap.x25519").digest()
    private = epochs.capability_private_key(kek)
    assert bytes(private) == seed
    # X25519 public key by libsodium's scalar multiplication of the base point.
    assert bytes(private.public_key) == bindings.crypto_scalarmult_base(seed)
    assert bytes(epochs.capability_private_key(flip(kek, 0)).public_key) != bytes(private.public_key)
    with pytest.raises(ValueError):
        epochs.capability_private_key(kek[:31])


def test_a_box_opens_only_with_its_capability_and_untouched():
    key = os.urandom(32)
    mine, theirs = PrivateKey.generate(), PrivateKey.generate()
    box = epochs.box_epoch(bytes(mine.public_key), 7, key)
    assert len(box) == epochs.BOX_BYTES == 88
    assert epochs.open_box(mine, box) == (7, key)
    # Sealed boxes are randomised: the same key sealed twice differs.
    assert epochs.box_epoch(bytes(mine.public_key), 7, key) != box
    with pytest.raises(aead.Unsealable):
        epochs.open_box(theirs, box)
    for k in (0, 31, 32, 47, 48, 87):
        with pytest.raises(aead.Unsealable):
            epochs.open_box(mine, flip(box, k))
    with pytest.raises(aead.Unsealable):
        epochs.open_box(mine, box[:-1])
    with pytest.raises(ValueError):
        epochs.box_epoch(bytes(mine.public_key)[:31], 0, key)
    with pytest.raises(ValueError):
        epochs.box_epoch(bytes(PublicKey(bytes(mine.public_key))), -1, key)


def test_a_key_chain_keeps_its_older_keys_under_the_newest(memory: Memory):
    store = memory.store(USER)
    chain = KeyChain(store, (os.urandom(32),))
    assert chain.epoch == 0 and chain.seal_older() is None
    for _ in range(3):
        chain = chain.advance()
    assert chain.epoch == 3 and len(set(chain.keys)) == 4
    older = chain.seal_older()
    assert older is not None
    assert len(older) == 3 * 32 + aead.OVERHEAD
    assert KeyChain.open(store, 3, chain.current, older) == chain
    # An older key, another user, the same user's other memory, another epoch
    # number, a flipped byte: nothing opens.
    (elsewhere,) = [Memory(name).store(USER) for name in MEMORIES if name != memory.name]
    for args in (
        (store, 3, chain.keys[2], older),
        (memory.store("fedcba9876543210"), 3, chain.current, older),
        (elsewhere, 3, chain.current, older),
        (store, 2, chain.current, older),
        (store, 3, chain.current, flip(older, 30)),
        (store, 3, chain.current, None),
        (store, 0, chain.current, older),
    ):
        with pytest.raises(aead.Unsealable):
            KeyChain.open(*args)
    assert "keys=<hidden>" in repr(chain) and chain.current.hex() not in repr(chain)


def test_the_bulk_sealer_seals_what_open_sealed_opens_and_nothing_else():
    sealer = aead.BulkSealer(64)
    key, ad = os.urandom(32), b"stash/v1|u|t|1"
    for n in (0, 1, 63, 64):
        plain = os.urandom(n)
        sealed = sealer.seal(key, plain, ad)
        assert len(sealed) == n + aead.OVERHEAD
        assert aead.open_sealed(key, sealed, ad) == plain
        with pytest.raises(aead.Unsealable):
            aead.open_sealed(key, sealed, ad + b"x")
        with pytest.raises(aead.Unsealable):
            aead.open_sealed(key, flip(sealed, len(sealed) - 1), ad)
    assert sealer.seal(key, b"same", ad) != sealer.seal(key, b"same", ad)  # fresh nonce each
    with pytest.raises(ValueError):
        sealer.seal(key, bytes(65), ad)
    with pytest.raises(ValueError):
        sealer.seal(key[:31], b"", ad)
