"""Key derivation (stash.crypto.keys): argon2id KEKs and per-purpose subkeys.

The KEK is checked against argon2-cffi called directly here and against the
output of the reference argon2 command line tool for the same inputs
(``echo -n 123 | argon2 ABCDEFGHIJKLMNOP -id -v 13 -k 8192 -t 2``), so a
silent change of variant, version or argument order is caught.
"""

from __future__ import annotations

import os
from typing import Any, cast

import pytest
from argon2.low_level import Type, hash_secret_raw

from stash.crypto import keys

CHEAP = keys.KdfParams(time_cost=1, memory_kib=64, lanes=1)


def test_kek_matches_argon2id_computed_directly():
    secret, salt = os.urandom(32), os.urandom(16)
    for params in (CHEAP, keys.KdfParams(2, 256, 2), keys.DEFAULT_KDF):
        direct = hash_secret_raw(
            secret=secret,
            salt=salt,
            time_cost=params.time_cost,
            memory_cost=params.memory_kib,
            parallelism=params.lanes,
            hash_len=32,
            type=Type.ID,
            version=19,
        )
        assert keys.derive_kek(secret, salt, params) == direct


@pytest.mark.parametrize(
    ("t", "m", "expected"),
    [
        (2, 8192, "3ee950488d26ce691657b1d753f562139857b61a58f234d6cb0ce84c4cc27328"),
        (5, 1024, "3c5d010180ba0cf5b6b858cba23b318e42d33088983c404598599c3b029ecac6"),
    ],
)
def test_kek_matches_the_reference_argon2_tool(t, m, expected):
    assert keys.derive_kek(b"123", b"ABCDEFGHIJKLMNOP", keys.KdfParams(t, m, 1)).hex() == expected


def test_kek_is_deterministic_and_32_bytes():
    secret, salt = os.urandom(32), os.urandom(16)
    a = keys.derive_kek(secret, salt, CHEAP)
    assert a == keys.derive_kek(secret, salt, CHEAP)
    assert len(a) == 32


def test_kek_changes_with_secret_salt_and_every_parameter():
    secret, salt = os.urandom(32), os.urandom(16)
    base = keys.derive_kek(secret, salt, CHEAP)
    variants = [
        keys.derive_kek(secret, os.urandom(16), CHEAP),
        keys.derive_kek(secret[:-1] + bytes([secret[-1] ^ 1]), salt, CHEAP),
        keys.derive_kek(secret, salt, keys.KdfParams(2, 64, 1)),
        keys.derive_kek(secret, salt, keys.KdfParams(1, 128, 1)),
        keys.derive_kek(secret, salt, keys.KdfParams(1, 64, 2)),
    ]
    assert base not in variants
    assert len(set(variants)) == len(variants)


def test_default_parameters_are_argon2id():
    d: dict[str, Any] = keys.DEFAULT_KDF.as_dict()
    assert d["alg"] == "argon2id"
    # argon2's own floor: memory of at least 8 KiB per lane, one pass or more.
    assert d["t"] >= 1 and d["p"] >= 1 and d["m"] >= 8 * d["p"]


@pytest.mark.parametrize("params", [CHEAP, keys.DEFAULT_KDF, keys.KdfParams(3, 19456, 4)])
def test_kdf_params_round_trip_through_a_dict(params):
    d = params.as_dict()
    assert keys.KdfParams.from_dict(d) == params
    # The keyring stores the salt in the same JSON object.
    assert keys.KdfParams.from_dict({**d, "salt": "00" * 16}) == params


@pytest.mark.parametrize("bad", [{}, {"alg": "argon2i", "t": 1, "m": 64, "p": 1}, {"alg": "scrypt"}])
def test_kdf_params_refuse_another_algorithm(bad):
    with pytest.raises(ValueError):
        keys.KdfParams.from_dict(bad)


def test_salts_and_master_keys_are_fresh():
    assert len(keys.new_salt()) >= 16
    assert len(keys.new_master_key()) == 32
    assert len({keys.new_salt() for _ in range(32)}) == 32
    assert len({keys.new_master_key() for _ in range(32)}) == 32


def test_subkeys_are_deterministic_and_independent_per_purpose():
    master = os.urandom(32)
    file_key = keys.subkey(master, b"file")
    rows_key = keys.subkey(master, b"rows")
    assert len(file_key) == 32 and len(rows_key) == 32
    assert file_key == keys.subkey(master, b"file")
    assert file_key != rows_key
    assert master not in (file_key, rows_key)
    assert keys.subkey(master, b"file2") != file_key
    assert keys.subkey(master, b"") not in (file_key, rows_key)


def test_subkeys_depend_on_the_master():
    a, b = os.urandom(32), os.urandom(32)
    assert keys.subkey(a, b"file") != keys.subkey(b, b"file")
    flipped = a[:-1] + bytes([a[-1] ^ 1])
    assert keys.subkey(flipped, b"rows") != keys.subkey(a, b"rows")


def test_subkeys_over_many_masters_do_not_collide():
    seen = set()
    for _ in range(200):
        m = os.urandom(32)
        seen.add(keys.subkey(m, b"file"))
        seen.add(keys.subkey(m, b"rows"))
    assert len(seen) == 400


@pytest.mark.parametrize("n", [0, 16, 31, 33, 64])
def test_subkey_refuses_a_master_of_the_wrong_length(n):
    with pytest.raises(ValueError):
        keys.subkey(os.urandom(n), b"file")


def test_a_grant_minted_at_the_former_cost_still_opens_under_the_new_default(tmp_path):
    """Parameters are stored beside each wrap: lowering the default for new
    grants must leave a grant minted at t=2, m=8 MiB (the default before)
    opening with exactly those parameters, next to one minted at the new cost."""
    import json

    from stash.service.access import Vault
    from stash.storage.keyring import open_keyring
    from stash.storage.layout import UserFiles

    former = keys.KdfParams(2, 8192, 1)
    old_vault = Vault(tmp_path, kdf=former, file_cipher="none")
    ident = old_vault.create_identity()
    with old_vault.session(ident.token, "owner") as s:
        s.open_memory().note("written under the former cost")
    new_vault = Vault(tmp_path, file_cipher="none")
    assert new_vault.kdf == keys.DEFAULT_KDF != former
    with new_vault.session(ident.token, "owner") as s:
        assert s.open_memory().recall("former cost")["total"] == 1
        _, fresh = new_vault.mint_grant(s, "read")
    with new_vault.session(fresh, "read") as s:
        assert s.open_memory().recall("former cost")["total"] == 1
    ring = open_keyring(UserFiles(tmp_path, ident.user_id).keyring, ident.user_id)
    try:
        stored = [keys.KdfParams.from_dict(json.loads(cast(str, g.kdf))) for g in ring.grants()]
    finally:
        ring.close()
    assert stored == [former, keys.DEFAULT_KDF]
