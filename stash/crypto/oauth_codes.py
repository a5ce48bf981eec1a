"""The secrets of an MCP host's OAuth flow (docs/DESIGN.md, "Remote MCP"):
the authorization code, the consent form's nonce, and PKCE.

A code is 256 bits from the OS random source, shown once, to the host's
redirect URI. The server keeps neither it nor the capability token it
stands for: it files the code under a keyed hash (:func:`code_id`) and the
token sealed under a key derived from the code (:func:`seal_token`), so
the token opens only for whoever holds the code, and a copy of the state
file holds no token.

On a host of a fleet a code (or nonce) names where it is kept, before a dot:
``7.<43 characters>`` for a code kept by the host of the shard of users whose
id starts with 7, ``b.<…>`` for a nonce kept by host ``b``; any host sends it
on there (stash/web/hop.py). The name is part of what is hashed and derived,
so a code given another name is an unknown code."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

from . import aead

CODE_BYTES = 32  # 256 bits
_CODE = re.compile(r"(?:([a-z0-9][a-z0-9_-]{0,62})\.)?[A-Za-z0-9_-]{43}")  # [where.]secret
_VERIFIER = re.compile(r"[A-Za-z0-9._~-]{43,128}")  # RFC 7636, section 4.1
_CHALLENGE = re.compile(r"[A-Za-z0-9_-]{43}")  # base64url of a SHA-256, unpadded


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def new_code(where: str | None = None) -> str:
    """A fresh code (or nonce): 256 random bits, base64url, 43 characters;
    after ``where.`` when it names where it is kept (a fleet's host or shard)."""
    secret = _b64(secrets.token_bytes(CODE_BYTES))
    return secret if where is None else f"{where}.{secret}"


def is_code(text: object) -> bool:
    return isinstance(text, str) and _CODE.fullmatch(text) is not None


def where_of(code: object) -> str | None:
    """Where a code (or nonce) says it is kept: a host's name or a shard's first digit; None when it names none."""
    found = _CODE.fullmatch(code) if isinstance(code, str) else None
    return found[1] if found else None


def _derive(code: str, person: bytes) -> bytes:
    return hashlib.blake2b(code.encode("ascii"), digest_size=32, person=person).digest()


def code_id(code: str) -> bytes:
    """What the state file files a code (or a consent form's nonce) under: it never holds the code itself."""
    return _derive(code, b"stash.oauth.id")


def seal_token(code: str, token: str, bound: str) -> bytes:
    """``token`` sealed under a key derived from ``code``, bound to ``bound`` (the code's row: its client,
    redirect URI and grant), so a sealed token moved to another row does not open."""
    return aead.seal(_derive(code, b"stash.oauth.key"), token.encode("ascii"), bound.encode("utf-8"))


def open_token(code: str, sealed: bytes, bound: str) -> str:
    """The token :func:`seal_token` sealed; :class:`aead.Unsealable` for another code or row."""
    return aead.open_sealed(_derive(code, b"stash.oauth.key"), sealed, bound.encode("utf-8")).decode("ascii")


def is_challenge(text: object) -> bool:
    return isinstance(text, str) and _CHALLENGE.fullmatch(text) is not None


def verifier_matches(verifier: object, challenge: str) -> bool:
    """PKCE S256 (RFC 7636): BASE64URL(SHA256(verifier)) is the challenge, compared in constant time."""
    if not isinstance(verifier, str) or _VERIFIER.fullmatch(verifier) is None:
        return False
    return hmac.compare_digest(_b64(hashlib.sha256(verifier.encode("ascii")).digest()), challenge)
