"""Row sealing (stash.crypto.aead): XChaCha20-Poly1305 as docs/DESIGN.md, "Sealing rows", requires.

Two independent references: the published vectors of draft-irtf-cfrg-xchacha
(§2.2.1 for HChaCha20, §A.3.1 for the AEAD), and an XChaCha20-Poly1305 built
here from its definition — HChaCha20 written out in Python, then libsodium's
plain ChaCha20-Poly1305-IETF with the derived subkey — which never calls the
xchacha functions the module uses.
"""

from __future__ import annotations

import os
import random
import struct

import pytest
from nacl import bindings
from nacl.exceptions import CryptoError

from stash.crypto import aead

# draft-irtf-cfrg-xchacha-03 §A.3.1
KAT_KEY = bytes(range(0x80, 0xA0))
KAT_NONCE = bytes(range(0x40, 0x58))
KAT_AAD = bytes.fromhex("50515253c0c1c2c3c4c5c6c7")
KAT_PT = (
    b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, "
    b"sunscreen would be it."
)
KAT_CT = bytes.fromhex(
    "bd6d179d3e83d43b9576579493c0e939572a1700252bfaccbed2902c21396cbb"
    "731c7f1b0b4aa6440bf3a82f4eda7e39ae64c6708c54c216cb96b72e1213b452"
    "2f8c9ba40db5d945b11b69b982c1bb9e3f3fac2bc369488f76b2383565d3fff9"
    "21f9664c97637da9768812f615c68b13b52e"
)
KAT_TAG = bytes.fromhex("c0875924c1c7987947deafd8780acf49")

# ----------------------------------------------------------------- reference


def _rotl(v: int, c: int) -> int:
    return ((v << c) & 0xFFFFFFFF) | (v >> (32 - c))


def _quarter(s: list[int], a: int, b: int, c: int, d: int) -> None:
    s[a] = (s[a] + s[b]) & 0xFFFFFFFF
    s[d] = _rotl(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & 0xFFFFFFFF
    s[b] = _rotl(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b]) & 0xFFFFFFFF
    s[d] = _rotl(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & 0xFFFFFFFF
    s[b] = _rotl(s[b] ^ s[c], 7)


def hchacha20(key: bytes, nonce16: bytes) -> bytes:
    """draft-irtf-cfrg-xchacha §2.2: twenty ChaCha rounds, no final addition,
    output words 0-3 and 12-15."""
    s = [0x61707865, 0x3320646E, 0x79622D32, 0x6B206574]
    s += list(struct.unpack("<8I", key)) + list(struct.unpack("<4I", nonce16))
    for _ in range(10):
        _quarter(s, 0, 4, 8, 12)
        _quarter(s, 1, 5, 9, 13)
        _quarter(s, 2, 6, 10, 14)
        _quarter(s, 3, 7, 11, 15)
        _quarter(s, 0, 5, 10, 15)
        _quarter(s, 1, 6, 11, 12)
        _quarter(s, 2, 7, 8, 13)
        _quarter(s, 3, 4, 9, 14)
    return struct.pack("<8I", *(s[0:4] + s[12:16]))


def ref_encrypt(key: bytes, nonce24: bytes, pt: bytes, aad: bytes) -> bytes:
    sub = hchacha20(key, nonce24[:16])
    return bindings.crypto_aead_chacha20poly1305_ietf_encrypt(pt, aad, bytes(4) + nonce24[16:], sub)


def ref_decrypt(key: bytes, nonce24: bytes, ct: bytes, aad: bytes) -> bytes:
    sub = hchacha20(key, nonce24[:16])
    return bindings.crypto_aead_chacha20poly1305_ietf_decrypt(ct, aad, bytes(4) + nonce24[16:], sub)


def test_reference_hchacha20_matches_the_draft():
    out = hchacha20(bytes(range(32)), bytes.fromhex("000000090000004a0000000031415927"))
    assert out.hex() == "82413b4227b27bfed30e42508a877d73a0f9e4d58a74a853c12ec41326d3ecdc"


def test_reference_matches_the_published_aead_vector():
    assert ref_encrypt(KAT_KEY, KAT_NONCE, KAT_PT, KAT_AAD) == KAT_CT + KAT_TAG


# ----------------------------------------------------------------- known answers


def openers():
    bulk = aead.BulkOpener(1024)
    return [("open_sealed", aead.open_sealed), ("BulkOpener", bulk.open)]


@pytest.mark.parametrize(("name", "opener"), openers())
def test_published_vector_opens(name, opener):
    assert opener(KAT_KEY, KAT_NONCE + KAT_CT + KAT_TAG, KAT_AAD) == KAT_PT


def test_seal_output_is_nonce_then_ciphertext_then_tag():
    # Whatever nonce seal() drew, the reference must open its output with it.
    for _ in range(20):
        key = os.urandom(32)
        pt = os.urandom(random.randrange(0, 400))
        aad = os.urandom(random.randrange(0, 60))
        sealed = aead.seal(key, pt, aad)
        assert ref_decrypt(key, sealed[:24], sealed[24:], aad) == pt
        assert ref_encrypt(key, sealed[:24], pt, aad) == sealed[24:]


def test_module_opens_what_the_reference_sealed():
    rng = random.Random(7)
    bulk = aead.BulkOpener(512)
    for _ in range(50):
        key = rng.randbytes(32)
        nonce = rng.randbytes(24)
        pt = rng.randbytes(rng.randrange(0, 513))
        aad = rng.randbytes(rng.randrange(0, 80))
        sealed = nonce + ref_encrypt(key, nonce, pt, aad)
        assert aead.open_sealed(key, sealed, aad) == pt
        assert bulk.open(key, sealed, aad) == pt


# ----------------------------------------------------------------- shape


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 64, 320, 4096])
def test_seal_length_is_plaintext_plus_40(n):
    sealed = aead.seal(os.urandom(32), os.urandom(n), b"aad")
    assert len(sealed) == n + 40
    assert aead.OVERHEAD == 40


def test_two_seals_of_the_same_input_differ():
    key, pt, aad = os.urandom(32), b"same words", b"stash/v1|u|log|0"
    sealed = [aead.seal(key, pt, aad) for _ in range(64)]
    assert len({s[:24] for s in sealed}) == 64  # fresh nonce every time
    assert len(set(sealed)) == 64
    for s in sealed:
        assert aead.open_sealed(key, s, aad) == pt


def test_plaintext_does_not_appear_in_the_sealed_bytes():
    pt = b"the launch code is 0000 and must stay secret"
    sealed = aead.seal(os.urandom(32), pt, b"")
    assert pt not in sealed
    assert pt[:8] not in sealed


# ----------------------------------------------------------------- agreement and tampering


def test_open_sealed_and_bulk_opener_agree_on_random_inputs():
    rng = random.Random(99)
    bulk = aead.BulkOpener(320)
    for _ in range(300):
        key = rng.randbytes(32)
        pt = rng.randbytes(rng.randrange(0, 321))
        aad = rng.randbytes(rng.randrange(0, 50))
        sealed = aead.seal(key, pt, aad)
        assert aead.open_sealed(key, sealed, aad) == pt
        assert bulk.open(key, sealed, aad) == pt
        # One random flipped bit anywhere: both refuse.
        pos = rng.randrange(len(sealed))
        bad = bytearray(sealed)
        bad[pos] ^= 1 << rng.randrange(8)
        with pytest.raises(aead.Unsealable):
            aead.open_sealed(key, bytes(bad), aad)
        with pytest.raises(aead.Unsealable):
            bulk.open(key, bytes(bad), aad)


def test_bulk_opener_buffer_reuse_returns_independent_bytes():
    # The opener recycles one buffer; an earlier result must not change under a later open.
    bulk = aead.BulkOpener(64)
    key = os.urandom(32)
    first = bulk.open(key, aead.seal(key, b"A" * 64, b""), b"")
    second = bulk.open(key, aead.seal(key, b"B" * 10, b""), b"")
    assert first == b"A" * 64
    assert second == b"B" * 10


@pytest.mark.parametrize(("name", "opener"), openers())
def test_every_byte_flip_is_refused(name, opener):
    key, aad = os.urandom(32), b"stash/v1|u|log|5"
    sealed = aead.seal(key, os.urandom(48), aad)
    regions = {"nonce": range(0, 24), "ciphertext": range(24, 24 + 48), "tag": range(24 + 48, len(sealed))}
    for region, positions in regions.items():
        for pos in positions:
            for mask in (0x01, 0x80, 0xFF):
                bad = bytearray(sealed)
                bad[pos] ^= mask
                with pytest.raises(aead.Unsealable):
                    opener(key, bytes(bad), aad)
                    pytest.fail(f"{name} opened a value altered in its {region} at {pos}")


@pytest.mark.parametrize(("name", "opener"), openers())
def test_truncated_or_extended_values_are_refused(name, opener):
    key, aad = os.urandom(32), b"a"
    sealed = aead.seal(key, os.urandom(30), aad)
    for n in range(len(sealed)):
        with pytest.raises(aead.Unsealable):
            opener(key, sealed[:n], aad)
    for extra in (b"\x00", os.urandom(16)):
        with pytest.raises(aead.Unsealable):
            opener(key, sealed + extra, aad)
    with pytest.raises(aead.Unsealable):
        opener(key, sealed[1:], aad)


@pytest.mark.parametrize(("name", "opener"), openers())
def test_wrong_associated_data_is_refused(name, opener):
    key = os.urandom(32)
    aad = b"stash/v1|0123456789abcdef|log|12"
    sealed = aead.seal(key, b"payload", aad)
    for other in (
        b"",
        b"stash/v1|0123456789abcdef|log|13",  # another row
        b"stash/v1|0123456789abcdef|erased|12",  # another table
        b"stash/v1|0123456789abcdee|log|12",  # another user
        aad + b"\x00",
        aad[:-1],
    ):
        with pytest.raises(aead.Unsealable):
            opener(key, sealed, other)


@pytest.mark.parametrize(("name", "opener"), openers())
def test_wrong_key_is_refused(name, opener):
    key = os.urandom(32)
    sealed = aead.seal(key, b"payload", b"x")
    for other in (os.urandom(32), bytes(32), key[:-1] + bytes([key[-1] ^ 1])):
        with pytest.raises(aead.Unsealable):
            opener(other, sealed, b"x")


@pytest.mark.parametrize("n", [0, 16, 31, 33, 64])
def test_key_of_the_wrong_length_is_a_value_error(n):
    key = os.urandom(n)
    with pytest.raises(ValueError):
        aead.seal(key, b"x", b"")
    good = aead.seal(os.urandom(32), b"x", b"")
    with pytest.raises(ValueError):
        aead.open_sealed(key, good, b"")


@pytest.mark.parametrize("n", [31, 33])
def test_bulk_opener_never_opens_with_a_wrong_length_key(n):
    key = os.urandom(32)
    sealed = aead.seal(key, b"x", b"")
    with pytest.raises((ValueError, aead.Unsealable)):
        aead.BulkOpener(16).open(key[:n] if n < 32 else key + b"\x00", sealed, b"")


def test_bulk_opener_refuses_a_value_larger_than_its_buffer():
    key = os.urandom(32)
    bulk = aead.BulkOpener(16)
    assert bulk.open(key, aead.seal(key, b"y" * 16, b""), b"") == b"y" * 16
    with pytest.raises(aead.Unsealable):
        bulk.open(key, aead.seal(key, b"y" * 17, b""), b"")


def test_unsealable_is_not_a_nacl_error():
    # Callers catch Unsealable to report damage; a leaked CryptoError would escape as a bare 500.
    with pytest.raises(aead.Unsealable) as info:
        aead.open_sealed(os.urandom(32), os.urandom(60), b"")
    assert not isinstance(info.value, CryptoError)


# ----------------------------------------------------------------- padding


@pytest.mark.parametrize("size", [2, 3, 40, 320])
def test_pad_round_trips_at_a_fixed_size(size):
    for n in range(0, size - 1):
        payload = os.urandom(n)
        padded = aead.pad(payload, size)
        assert len(padded) == size
        # schema.sql: a 2-byte big-endian length, the payload, zeros.
        assert padded[:2] == n.to_bytes(2, "big")
        assert padded[2 : 2 + n] == payload
        assert padded[2 + n :] == bytes(size - 2 - n)
        assert aead.unpad(padded) == payload


def test_padded_seals_hide_the_payload_length():
    key = os.urandom(32)
    lengths = {len(aead.seal(key, aead.pad(b"x" * n, 320), b"")) for n in (0, 1, 100, 318)}
    assert lengths == {320 + 40}


@pytest.mark.parametrize(("n", "size"), [(319, 320), (400, 320), (1, 2), (0, 1)])
def test_oversize_payload_is_refused(n, size):
    with pytest.raises(ValueError):
        aead.pad(b"z" * n, size)


def test_unpad_refuses_an_impossible_length():
    with pytest.raises(aead.Unsealable):
        aead.unpad((50).to_bytes(2, "big") + bytes(10))
    with pytest.raises(aead.Unsealable):
        aead.unpad(b"\xff\xff" + bytes(318))
