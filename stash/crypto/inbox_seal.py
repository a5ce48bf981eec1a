"""Sealing an append capability's notes so that only read-capable keys open them.

An append capability holds no key (docs/DESIGN.md, "Memories"): it seals each
note with a libsodium sealed box (X25519 + XSalsa20-Poly1305, PyNaCl
``SealedBox``) to the memory's *inbox public key* of the current epoch. The
matching private key is derived from that epoch's key, which only the
read-capable capabilities reach through their boxes; so the note is opened
only by them, and the append token with every file opens nothing: nothing
written before it (it has no epoch key) and not even its own notes.

Sizes: the plaintext is :data:`PLAIN_BYTES` (a 16-byte binding, a 10-byte
day, a 2-byte length and the text padded to 280 bytes), so every sealed note
is :data:`SEALED_BYTES` and its length tells nothing of the text's.
"""

from __future__ import annotations

import hashlib

from nacl import bindings
from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, PublicKey, SealedBox

from . import aead
from .epochs import KeyChain

PUBLIC_META = "inbox_pub"  # key ring meta: "<epoch>:<hex of the inbox public key>"
TEXT_BYTES = 280  # the ceiling of ENTRY_CHARS: an append capability cannot read the memory's own setting
BIND_BYTES = 16
DAY_BYTES = 10
PLAIN_BYTES = BIND_BYTES + DAY_BYTES + 2 + TEXT_BYTES
SEALED_BYTES = bindings.crypto_box_SEALBYTES + PLAIN_BYTES


def private_key(epoch_key: bytes) -> PrivateKey:
    """The inbox private key of the epoch whose key is ``epoch_key``."""
    if len(epoch_key) != aead.KEY_BYTES:
        raise ValueError("an epoch key is 32 bytes")
    return PrivateKey(hashlib.blake2b(b"inbox", key=epoch_key, digest_size=32, person=b"stash.inbox.x255").digest())


def public_text(chain: KeyChain) -> str:
    """The key ring's record of the current epoch's inbox public key."""
    return f"{chain.epoch}:{bytes(private_key(chain.current).public_key).hex()}"


def parse_public(text: str | None) -> tuple[int, bytes] | None:
    if text is None:
        return None
    epoch, _, hexkey = text.partition(":")
    try:
        key = bytes.fromhex(hexkey)
        return (int(epoch), key) if len(key) == PublicKey.SIZE else None
    except ValueError:
        return None


def _bind(store: str, grant_id: int, claim: int) -> bytes:
    return hashlib.blake2b(
        f"{store}|{grant_id}|{claim}".encode(), digest_size=BIND_BYTES, person=b"stash.inbox.bind"
    ).digest()


def seal(public: bytes, store: str, grant_id: int, claim: int, day: str, text: str) -> bytes:
    raw = text.encode()
    if len(raw) > TEXT_BYTES or len(day) != DAY_BYTES:
        raise ValueError("a note is at most 280 bytes and its day YYYY-MM-DD")
    plain = _bind(store, grant_id, claim) + day.encode() + len(raw).to_bytes(2, "big") + raw.ljust(TEXT_BYTES, b"\0")
    return SealedBox(PublicKey(public)).encrypt(plain)


def open_note(chain: KeyChain, epoch: int, sealed: bytes, store: str, grant_id: int, claim: int) -> tuple[str, str]:
    """``(day, text)`` of a sealed note, or :class:`aead.Unsealable` when it
    does not open with that epoch's key or was moved from another row,
    grant or memory."""
    try:
        plain = SealedBox(private_key(chain.key(epoch))).decrypt(sealed)
    except (CryptoError, KeyError):
        raise aead.Unsealable("an inbox note does not open") from None
    if len(plain) != PLAIN_BYTES or plain[:BIND_BYTES] != _bind(store, grant_id, claim):
        raise aead.Unsealable("an inbox note was moved or altered")
    body = plain[BIND_BYTES:]
    n = int.from_bytes(body[DAY_BYTES : DAY_BYTES + 2], "big")
    if n > TEXT_BYTES:
        raise aead.Unsealable("an inbox note has a bad length")
    return body[:DAY_BYTES].decode(), body[DAY_BYTES + 2 : DAY_BYTES + 2 + n].decode()


def grant_mac(chain: KeyChain, store: str, grant_id: int, tag: bytes, expires: str | None = None) -> bytes:
    """What proves an append grant was minted by a holder of the memory's
    keys: keyed by a subkey of epoch 0's key, so it holds across epochs. It
    binds the grant's expiry too, so one edited in the key ring to extend the
    grant no longer matches, and the fold refuses its notes."""
    key = hashlib.blake2b(b"append-grant", key=chain.base, digest_size=32, person=b"stash.append.mac").digest()
    bound = b"" if expires is None else b"|expires|" + expires.encode()
    return hashlib.blake2b(f"{store}|{grant_id}|".encode() + tag + bound, key=key, digest_size=32).digest()
