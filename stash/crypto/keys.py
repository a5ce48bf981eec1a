"""Key derivation: argon2id for capability secrets, BLAKE2b for subkeys.

The master key (32 random bytes per user) exists on disk only wrapped, once
per capability, under a key-encryption key (KEK) that argon2id derives from
that capability's secret. The secret already carries 256 uniform bits, so no
per-guess cost matters against it (2^255 guesses on average), and a key ring
thief who knows part of a token can already test guesses for the rest at
BLAKE2b speed against the grant's lookup tag: argon2id is kept because the
contract names it, at the cheapest sound cost (SECURITY.md, "Choosing the argon2id
parameters"). Parameters are stored beside each wrapped key, so grants minted
at an older, higher cost keep opening with it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import argon2.low_level as argon2

from .aead import KEY_BYTES

MASTER_KEY_BYTES = KEY_BYTES
SALT_BYTES = 16


MAX_TIME_COST = 64
MAX_MEMORY_KIB = 1024 * 1024  # 1 GiB
MAX_LANES = 16


@dataclass(frozen=True)
class KdfParams:
    """argon2id cost: ``time_cost`` passes over ``memory_kib`` KiB, ``lanes`` lanes."""

    # One pass over 64 KiB, the cheapest sound cost (module docstring); 64 KiB
    # per concurrent derivation also keeps a busy server's memory flat.
    time_cost: int = 1
    memory_kib: int = 64
    lanes: int = 1

    def __post_init__(self) -> None:
        # Parameters are read back from disk, so a hand-edited value must be
        # refused here rather than crash argon2 or stall every request.
        if not 1 <= self.lanes <= MAX_LANES:
            raise ValueError(f"argon2id lanes must be 1 to {MAX_LANES}")
        if not 1 <= self.time_cost <= MAX_TIME_COST:
            raise ValueError(f"argon2id time cost must be 1 to {MAX_TIME_COST}")
        if not 8 * self.lanes <= self.memory_kib <= MAX_MEMORY_KIB:
            raise ValueError(f"argon2id memory must be 8 KiB per lane to {MAX_MEMORY_KIB} KiB")

    def as_dict(self) -> dict[str, int | str]:
        return {"alg": "argon2id", "t": self.time_cost, "m": self.memory_kib, "p": self.lanes}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KdfParams:
        if d.get("alg") != "argon2id":
            raise ValueError("unknown key derivation")
        return cls(int(d["t"]), int(d["m"]), int(d["p"]))


DEFAULT_KDF = KdfParams()


def new_salt() -> bytes:
    return os.urandom(SALT_BYTES)


def new_master_key() -> bytes:
    return os.urandom(MASTER_KEY_BYTES)


def derive_kek(secret: bytes, salt: bytes, params: KdfParams) -> bytes:
    return argon2.hash_secret_raw(
        secret, salt, params.time_cost, params.memory_kib, params.lanes, KEY_BYTES, argon2.Type.ID
    )


def subkey(master: bytes, purpose: bytes) -> bytes:
    """An independent 32-byte key for one purpose (``b"file"``, ``b"rows"``):
    BLAKE2b keyed by the master key, so no subkey reveals another or the master."""
    if len(master) != MASTER_KEY_BYTES:
        raise ValueError(f"master key must be exactly {MASTER_KEY_BYTES} bytes")
    return hashlib.blake2b(purpose, key=master, digest_size=KEY_BYTES, person=b"stash.subkey").digest()
