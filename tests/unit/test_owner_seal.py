"""The owner key (stash/crypto/owner_seal.py): what is sealed to it opens
with its seeds only, at the row it was sealed for, in its user's store."""

from __future__ import annotations

import pytest
from nacl.public import PrivateKey

from stash.crypto import aead
from stash.crypto.owner_seal import OwnerKeys, is_sealed, seal


def test_a_sealed_value_opens_only_at_its_row_in_its_store_with_the_owner_seeds() -> None:
    owner = OwnerKeys.new("u1")
    label = seal("u1", owner.public, "grant_label|2", b"temp contractor")
    assert owner.open(label, "grant_label|2") == b"temp contractor"
    with pytest.raises(aead.Unsealable):
        owner.open(label, "grant_label|3")  # moved to another grant's row
    with pytest.raises(aead.Unsealable):
        OwnerKeys("u2", owner.seeds).open(label, "grant_label|2")  # another user's store
    with pytest.raises(aead.Unsealable):
        OwnerKeys.new("u1").open(label, "grant_label|2")  # another owner key
    with pytest.raises(aead.Unsealable):
        owner.open(label[:-1] + bytes([label[-1] ^ 1]), "grant_label|2")


def test_a_rotation_keeps_the_history_and_seals_the_future_to_a_new_seed() -> None:
    old = OwnerKeys.new("u1")
    before = seal("u1", old.public, "audit", b"event 1")
    new = old.advance()
    after = seal("u1", new.public, "audit", b"event 2")
    assert new.open(before, "audit") == b"event 1" and new.open(after, "audit") == b"event 2"
    with pytest.raises(aead.Unsealable):
        old.open(after, "audit")


def test_the_owner_box_opens_for_its_grant_only() -> None:
    grant_key, other_key = PrivateKey.generate(), PrivateKey.generate()
    owner = OwnerKeys.new("u1").advance()
    box = owner.box(1, bytes(grant_key.public_key))
    assert OwnerKeys.unbox("u1", 1, grant_key, box).seeds == owner.seeds
    for user, grant, key in (("u1", 2, grant_key), ("u2", 1, grant_key), ("u1", 1, other_key)):
        with pytest.raises(aead.Unsealable):
            OwnerKeys.unbox(user, grant, key, box)


def test_a_padded_value_opens_to_itself_and_its_size_tells_only_its_bucket() -> None:
    owner = OwnerKeys.new("u1")
    sizes = set()
    for plain in (b"", b"x", b"y" * 64):
        sealed = seal("u1", owner.public, "grant_label|2", plain, pad=66)
        assert is_sealed(sealed) and owner.open(sealed, "grant_label|2") == plain
        sizes.add(len(sealed))
    assert len(sizes) == 1
    longer = seal("u1", owner.public, "grant_label|2", b"z" * 65, pad=66)
    assert len(longer) > sizes.pop()  # past the bucket: the next one
    with pytest.raises(aead.Unsealable):
        owner.open(seal("u1", owner.public, "grant_label|3", b"x", pad=66), "grant_label|2")
