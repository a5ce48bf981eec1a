"""Idempotency-Key: a retried write answers its first answer and writes nothing.

A client that lost the answer to a write cannot know whether it happened; in
an append-only log, guessing wrong is a duplicate forever. So the writes
(POST /note, /nap, /import, /grants) take an ``Idempotency-Key`` header: the
first request with a key runs and its answer is recorded, in the same
transaction as the write; an exact retry within :data:`WINDOW_SECONDS` gets
that answer back and writes nothing; the same key with another route or body
is refused (409).

What a record holds, per user (the memory file for memory writes, the key
ring for grants), none of it readable without the key itself:

* ``lookup`` — BLAKE2b of the key, keyed by a subkey of the user's master key;
* ``fingerprint`` — BLAKE2b of the route and the canonical JSON body, keyed by
  the same subkey;
* ``sealed`` — the answer, padded to a multiple of :data:`PAD_BYTES`, sealed
  with XChaCha20-Poly1305 under a key derived from the Idempotency-Key and a
  *seal root*: for memory writes a subkey of the current epoch's key (a
  revocation drops these records with the rest of the epoch); for grants, whose
  answer holds a new token, a key derived from the owner's own token secret,
  which the server never stores. Associated data binds the value to its user,
  file and lookup.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import orjson

from ..core.errors import Conflict, Damaged, Malformed
from ..crypto import aead, keys
from ..crypto.epochs import KeyChain
from ..storage.idempotency_table import Records


class _HasRecords(Protocol):
    def idempotency_records(self) -> Records: ...


class _HasMemoryFile(Protocol):
    @property
    def mf(self) -> _HasRecords: ...


class Session(Protocol):
    """What a keyed write needs of service.access's Session (named here, not
    imported: access imports this module)."""

    user_id: str
    master: bytes
    capability_key: bytes
    @property
    def keyring(self) -> _HasRecords: ...

    @property
    def keys(self) -> KeyChain: ...

    def open_memory(self) -> _HasMemoryFile: ...

WINDOW_SECONDS = 24 * 60 * 60
MAX_RECORDS = 10_000  # per file: the newest keyed writes within the window; older ones are dropped first
KEY_MAX_CHARS = 255
# A record's sealed answer is padded to a multiple of this. 1 KiB keeps a note's or a nap's answer (a
# prompt quoting two 280-byte lines) in about 2 KiB, stored inside the table's pages: at 4 KiB padding
# every record spilled into an overflow page of its own, about 19 KiB each on 16 KiB pages.
PAD_BYTES = 1024
HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
_KEY = re.compile(rf"[\x21-\x7e]{{1,{KEY_MAX_CHARS}}}")


def parse_key(values: list[str]) -> str | None:
    """The request's Idempotency-Key, None when it sent none. 1 to 255
    visible ASCII characters (no space), sent once."""
    if not values:
        return None
    if len(values) > 1 or not _KEY.fullmatch(values[0]):
        raise Malformed(
            f"The {HEADER} header must be sent once, as 1 to {KEY_MAX_CHARS} visible ASCII characters without "
            "spaces (a random UUID is a good key); nothing was written.",
            code="idempotency.bad_key",
        )
    return values[0]


@dataclass(frozen=True)
class KeyedAnswer:
    body: dict[str, Any]
    replayed: bool = False


def _hash(data: bytes, key: bytes, person: bytes) -> bytes:
    return hashlib.blake2b(data, key=key, digest_size=32, person=person).digest()


def _pad(payload: bytes) -> bytes:
    """A 4-byte length, the payload, zeros up to a multiple of PAD_BYTES, so a
    stored answer's size says little about the memory text it quotes."""
    n = 4 + len(payload)
    return len(payload).to_bytes(4, "big") + payload + bytes(-n % PAD_BYTES)


def _unpad(padded: bytes) -> bytes:
    n = int.from_bytes(padded[:4], "big")
    if n > len(padded) - 4:
        raise aead.Unsealable("padded answer has an impossible length")
    return padded[4 : 4 + n]


@dataclass(frozen=True)
class Keyed:
    """One keyed request, reduced to what its record is found and checked by.
    The key itself is kept only as the sealing key it derives."""

    user_id: str
    file: str  # "memory" | "keyring", part of the associated data
    lookup: bytes
    fingerprint: bytes
    seal_key: bytes = field(repr=False)

    @classmethod
    def make(cls, *, user_id: str, file: str, master: bytes, seal_root: bytes, route: str, key: str,
             body: dict[str, Any]) -> Keyed:
        if len(seal_root) != aead.KEY_BYTES:
            raise ValueError("an idempotency record needs a 32-byte seal root")
        store = keys.subkey(master, b"idempotency")
        raw = key.encode("ascii")
        canonical = route.encode() + b"\n" + orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
        return cls(
            user_id=user_id,
            file=file,
            lookup=_hash(raw, store, b"stash.idem.look"),
            fingerprint=_hash(canonical, store, b"stash.idem.req"),
            seal_key=_hash(raw, seal_root, b"stash.idem.seal"),
        )

    def _aad(self) -> bytes:
        return f"stash/v1|{self.user_id}|{self.file}|idempotency|{self.lookup.hex()}".encode()

    def seal(self, body: dict[str, Any]) -> bytes:
        return aead.seal(self.seal_key, _pad(orjson.dumps(body)), self._aad())

    def open(self, sealed: bytes) -> dict[str, Any]:
        try:
            return cast(dict[str, Any], orjson.loads(_unpad(aead.open_sealed(self.seal_key, sealed, self._aad()))))
        except (aead.Unsealable, orjson.JSONDecodeError):
            raise Damaged(
                "The recorded answer to this Idempotency-Key failed its integrity check and was not replayed; "
                "nothing was written. Check the memory (wake) before writing again with a fresh key."
            ) from None


def run(records: Records, req: Keyed | None, work: Callable[[], dict[str, Any]],
        now: float | None = None) -> KeyedAnswer:
    """Run ``work`` once per key: inside the file's write lock, find the key's
    record; replay it, refuse a different request under it, or run ``work``
    and record its answer in the same transaction as what ``work`` wrote.
    So a crash leaves both or neither, and of two concurrent requests with
    one key exactly one writes. A refusal raised by ``work`` rolls back and
    records nothing: a retry is checked afresh. Records older than
    WINDOW_SECONDS are deleted first, by every write keyed or not (``req``
    None), so an exact retry after the window is a new request and an
    answer does not outlive the window by more than the file's next write;
    so are all but the newest MAX_RECORDS - 1 before a record is added.

    A write that changed nothing (a nap that only asks what is due, or
    settles a block already settled) records nothing: its retry simply runs
    again, which changes nothing either and answers the state of the moment,
    so a flood of keyed no-ops costs no storage."""
    at = int(time.time() if now is None else now)
    records.ensure()
    with records.transaction():
        records.purge(at - WINDOW_SECONDS)
        if req is None:
            return KeyedAnswer(work())
        found = records.find(req.lookup)
        if found is not None:
            fingerprint, sealed = found
            if not hmac.compare_digest(fingerprint, req.fingerprint):
                raise Conflict(
                    f"This {HEADER} was used in the last {WINDOW_SECONDS // 3600} hours for a different request "
                    "(another route or body); nothing was written. Send a fresh key with each new request.",
                    code="idempotency.key_reused",
                )
            return KeyedAnswer(req.open(sealed), replayed=True)
        changes = records.changes()
        body = work()
        if records.changes() != changes:
            records.keep_newest(MAX_RECORDS - 1)
            records.put(req.lookup, req.fingerprint, at, req.seal(body))
    return KeyedAnswer(body)


def memory_write(session: Session, key: str | None, route: str, body: dict[str, Any],
                 work: Callable[[], dict[str, Any]], now: float | None = None) -> KeyedAnswer:
    """A write to the session's memory file, once per Idempotency-Key."""
    req = None
    if key is not None:
        req = Keyed.make(user_id=session.user_id, file="memory", master=session.master,
                         seal_root=keys.subkey(session.keys.current, b"idempotency"), route=route, key=key,
                         body=body)
    return run(session.open_memory().mf.idempotency_records(), req, work, now)


def keyring_write(session: Session, key: str | None, route: str, body: dict[str, Any],
                  work: Callable[[], dict[str, Any]], now: float | None = None) -> KeyedAnswer:
    """A write to the session's key ring, once per Idempotency-Key. The answer
    is sealed under the calling capability's own key (derived from its token
    secret), so the record of a minted token opens only for the owner's
    token presented again with the same Idempotency-Key."""
    req = None
    if key is not None:
        req = Keyed.make(user_id=session.user_id, file="keyring", master=session.master,
                         seal_root=session.capability_key, route=route, key=key, body=body)
    return run(session.keyring.idempotency_records(), req, work, now)


def append_write(session: Session, key: str | None, route: str, body: dict[str, Any],
                 work: Callable[[], dict[str, Any]], now: float | None = None) -> KeyedAnswer:
    """An append capability's note, once per Idempotency-Key. It holds no
    key of the memory, so its record lives in the key ring (where its note
    waits), found and sealed with keys derived from its own token secret
    alone (``capability_key``), and fingerprinted like any other: the same
    key with another text is refused, never replayed."""
    req = None
    if key is not None:
        req = Keyed.make(user_id=session.user_id, file="keyring", master=session.capability_key,
                         seal_root=session.capability_key, route=route, key=key, body=body)
    return run(session.keyring.idempotency_records(), req, work, now)


ROTATE_ROUTE = "POST /rotate"


def _rotation(user_id: str, capability_key: bytes, key: str) -> Keyed:
    """The record of one rotation: found and sealed with keys derived from
    the old owner token's secret alone (``capability_key``): only that
    token, resent with the key, finds and opens it, and only while it is
    still the owner (until the new token's first use, which revokes it and
    deletes the record: Keyring.retire_owner)."""
    return Keyed.make(user_id=user_id, file="keyring", master=capability_key, seal_root=capability_key,
                      route=ROTATE_ROUTE, key=key, body={})


def rotation_write(session: Session, key: str | None, work: Callable[[], dict[str, Any]],
                   now: float | None = None) -> KeyedAnswer:
    """``POST /rotate`` once per Idempotency-Key: its answer, new token
    included, is recorded in the key ring in the transaction that files the
    new owner grant (so a crash leaves both or neither), sealed under a key
    derived from the old owner token's secret and the Idempotency-Key; the
    server keeps no token in the clear, and only that old token resent with
    that key opens it, as an ordinary replay (:func:`_rotation`)."""
    req = None if key is None else _rotation(session.user_id, session.capability_key, key)
    return run(session.keyring.idempotency_records(), req, work, now)
