"""Capability tokens: ``stash1_<user_id>_<secret><checksum>``.

* ``user_id`` — 16 lowercase hex characters (64 random bits), public.
* ``secret`` — 256 bits from the OS random source, as exactly 43 base62 digits.
* ``checksum`` — base62 CRC32 of everything before it, 6 digits, so a mistyped
  or invented token is refused with no database or key work, and a secret
  scanner can recognise a leaked one by :data:`TOKEN_PATTERN`.

The token is handed out once and never stored: the server keeps only a keyed
hash of the secret (to find the grant without running argon2) and the master
key wrapped under a key derived from the secret.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

PREFIX = "stash1"
USER_ID_HEX = 16
SECRET_BYTES = 32
SECRET_DIGITS = 43  # 62**43 > 2**256, the fewest base62 digits that hold a secret
CHECKSUM_DIGITS = 6  # 62**6 > 2**32
TAG_BYTES = 16

ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_INDEX = {c: i for i, c in enumerate(ALPHABET)}

TOKEN_PATTERN = r"stash1_[0-9a-f]{16}_[0-9A-Za-z]{49}"  # noqa: S105 - a pattern, not a secret
"""The regex secret scanners can use to find a leaked token."""
_TOKEN = re.compile(r"stash1_([0-9a-f]{16})_([0-9A-Za-z]{43})([0-9A-Za-z]{6})")
_USER_ID = re.compile(r"[0-9a-f]{16}")

# Anything this long cannot be a token; refusing it first keeps regex work bounded.
MAX_TOKEN_CHARS = len(PREFIX) + 1 + USER_ID_HEX + 1 + SECRET_DIGITS + CHECKSUM_DIGITS


def _b62(n: int, width: int) -> str:
    digits = []
    for _ in range(width):
        n, r = divmod(n, 62)
        digits.append(ALPHABET[r])
    if n:
        raise ValueError("value does not fit the width")
    return "".join(reversed(digits))


def _from_b62(s: str) -> int:
    n = 0
    for c in s:
        n = n * 62 + _INDEX[c]
    return n


def _checksum(body: str) -> str:
    return _b62(zlib.crc32(body.encode("ascii")), CHECKSUM_DIGITS)


@dataclass(frozen=True)
class Token:
    """A parsed token. ``secret`` is the raw 32 bytes; keep it for one request only."""

    user_id: str
    secret: bytes

    def __repr__(self) -> str:  # a token must never reach a log through repr()
        return f"Token(user_id={self.user_id!r}, secret=<hidden>)"

    @cached_property
    def tag(self) -> bytes:
        """This token's lookup tag (:func:`lookup_tag`), derived on first use
        and kept with the parsed token: a request parses its token once and
        every check of it (the tag index, the grant's row) reuses this one."""
        return lookup_tag(self.user_id, self.secret)


def new_user_id(prefixes: Sequence[str] = ()) -> str:
    """A fresh random user id; with ``prefixes`` (lowercase hex), one of them
    picked at random and the rest random, so each host of a fleet sharded by
    user id mints only ids its own shard serves."""
    rand = os.urandom(USER_ID_HEX // 2).hex()
    if not prefixes:
        return rand
    prefix = prefixes[secrets.randbelow(len(prefixes))]
    return prefix + rand[len(prefix) :]


def is_id_prefix(text: str) -> bool:
    """A user-id prefix a host may be told to mint: 1 to 4 lowercase hex digits,
    leaving at least 48 random bits."""
    return bool(re.fullmatch(r"[0-9a-f]{1,4}", text))


def is_user_id(text: str) -> bool:
    return bool(_USER_ID.fullmatch(text))


def mint(user_id: str) -> tuple[str, bytes]:
    """A fresh token for ``user_id``: ``(token_text, secret)``."""
    if not is_user_id(user_id):
        raise ValueError("user_id must be 16 lowercase hex characters")
    secret = os.urandom(SECRET_BYTES)
    body = f"{PREFIX}_{user_id}_{_b62(int.from_bytes(secret, 'big'), SECRET_DIGITS)}"
    return body + _checksum(body), secret


def parse(text: str) -> Token | None:
    """The token's parts, or None when it is malformed or its checksum is
    wrong. Cheap and constant in work: no I/O, no key derivation."""
    if len(text) != MAX_TOKEN_CHARS:
        return None
    m = _TOKEN.fullmatch(text)
    if not m:
        return None
    user_id, digits, check = m.groups()
    if _checksum(text[:-CHECKSUM_DIGITS]) != check:
        return None
    n = _from_b62(digits)
    if n >> (8 * SECRET_BYTES):
        return None
    return Token(user_id, n.to_bytes(SECRET_BYTES, "big"))


def lookup_tag(user_id: str, secret: bytes) -> bytes:
    """The keyed hash under which a grant is filed, so a token finds its grant
    without argon2 and a bogus one is refused at the cost of one BLAKE2b.

    It is not a password hash: the secret is 256 uniform bits, so no search
    over it is feasible and a fast hash reveals nothing usable."""
    return hashlib.blake2b(secret, digest_size=TAG_BYTES, key=user_id.encode(), person=b"stash.grant.tag").digest()
