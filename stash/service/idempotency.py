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

import contextlib
import hashlib
import hmac
import re
import time
from collections.abc import Callable, Iterator
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
    scope: str
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
    def make(
        cls, *, user_id: str, file: str, master: bytes, seal_root: bytes, route: str, key: str, body: dict[str, Any]
    ) -> Keyed:
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


@dataclass
class KeyRecord:
    """Where one write's Idempotency-Key record lives (``records``: the
    memory file's or the key ring's table) and the key it is filed under
    (``req``; None: the request sent no key). It is a step of the write, not
    its owner: service/operation.py opens the write's transaction on
    ``records``' file (:meth:`transaction`), looks the key up first
    (:meth:`replay`), runs the handler, and records its answer last
    (:meth:`remember`), all in that one transaction. So a crash leaves both
    the write and its record or neither, and of two concurrent requests with
    one key exactly one writes (the second waits for the file's write lock,
    then finds the first's record). A refusal raised by the handler rolls
    back and records nothing: a retry is checked afresh.

    Records older than WINDOW_SECONDS are deleted first, by every write keyed
    or not, so an exact retry after the window is a new request and an answer
    does not outlive the window by more than the file's next write; so are
    all but the newest MAX_RECORDS - 1 before a record is added.

    A write that changed nothing (a nap that only asks what is due, or
    settles a block already settled) records nothing: its retry simply runs
    again, which changes nothing either and answers the state of the moment,
    so a flood of keyed no-ops costs no storage."""

    records: Records
    req: Keyed | None
    now: float | None = None  # None: the clock's, when the transaction begins
    at: int = 0  # Unix seconds: when the transaction was asked for
    _changes: int = 0

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """The write's transaction on the record's file (its write lock held
        from the start). The table is made first, outside any transaction."""
        self.at = int(time.time() if self.now is None else self.now)
        self.records.ensure()
        with self.records.transaction():
            yield

    def replay(self) -> dict[str, Any] | None:
        """Inside :meth:`transaction`, before the handler: the answer
        recorded for this key, None when there is none (the handler runs);
        409 when the key was used for another request."""
        self.records.purge(self.at - WINDOW_SECONDS)
        if self.req is None:
            return None
        found = self.records.find(self.req.lookup)
        if found is not None:
            fingerprint, sealed = found
            if not hmac.compare_digest(fingerprint, self.req.fingerprint):
                raise Conflict(
                    f"This {HEADER} was used in the last {WINDOW_SECONDS // 3600} hours for a different request "
                    "(another route or body); nothing was written. Send a fresh key with each new request.",
                    code="idempotency.key_reused",
                )
            return self.req.open(sealed)
        self._changes = self.records.changes()
        return None

    def remember(self, body: dict[str, Any]) -> None:
        """Inside :meth:`transaction`, after the handler: record ``body``
        under the key, when the handler changed anything."""
        if self.req is not None and self.records.changes() != self._changes:
            self.records.keep_newest(MAX_RECORDS - 1)
            self.records.put(self.req.lookup, self.req.fingerprint, self.at, self.req.seal(body))


def key_record(
    session: Session, record: str, key: str | None, route: str, body: dict[str, Any], now: float | None = None
) -> KeyRecord:
    """The record of a write whose route keeps it in ``record``
    (service/operation.py's Effects): ``memory``, the memory file, sealed
    under the current epoch (a revocation drops these records with the rest
    of the epoch); for an append capability, which holds no key of the
    memory, the key ring (where its note waits), found and sealed with keys
    derived from its own token secret alone (``capability_key``) and
    fingerprinted like any other, so the same key with another text is
    refused, never replayed; ``keyring``, the key ring, sealed under the
    calling capability's own key, so the record of a minted token opens only
    for the owner's token presented again with the same Idempotency-Key;
    ``rotation``: see :func:`_rotation`. ``body`` is the request as sent.
    Opens the memory for a memory-file record of a read-capable session."""
    req: Keyed | None = None
    if record == "memory" and session.scope != "append":
        if key is not None:
            req = Keyed.make(
                user_id=session.user_id,
                file="memory",
                master=session.master,
                seal_root=keys.subkey(session.keys.current, b"idempotency"),
                route=route,
                key=key,
                body=body,
            )
        return KeyRecord(session.open_memory().mf.idempotency_records(), req, now)
    if key is not None:
        if record in ("memory", "keyring"):
            # An append capability holds no key of the memory: its record is found by its own key alone.
            master = session.capability_key if record == "memory" else session.master
            req = Keyed.make(
                user_id=session.user_id,
                file="keyring",
                master=master,
                seal_root=session.capability_key,
                route=route,
                key=key,
                body=body,
            )
        elif record == "rotation":
            req = _rotation(session.user_id, session.capability_key, key)
        else:
            raise ValueError(f"unknown record {record!r}")
    return KeyRecord(session.keyring.idempotency_records(), req, now)


def run(entry: KeyRecord, work: Callable[[], dict[str, Any]]) -> KeyedAnswer:
    """``work`` once per key, in :class:`KeyRecord`'s steps: what
    service/operation.py's ``perform`` does around a route's handler, for a
    write made outside a route."""
    with entry.transaction():
        found = entry.replay()
        if found is not None:
            return KeyedAnswer(found, replayed=True)
        body = work()
        entry.remember(body)
    return KeyedAnswer(body)


def memory_write(
    session: Session,
    key: str | None,
    route: str,
    body: dict[str, Any],
    work: Callable[[], dict[str, Any]],
    now: float | None = None,
) -> KeyedAnswer:
    """A write to the session's memory file, once per Idempotency-Key."""
    return run(key_record(session, "memory", key, route, body, now), work)


def keyring_write(
    session: Session,
    key: str | None,
    route: str,
    body: dict[str, Any],
    work: Callable[[], dict[str, Any]],
    now: float | None = None,
) -> KeyedAnswer:
    """A write to the session's key ring, once per Idempotency-Key."""
    return run(key_record(session, "keyring", key, route, body, now), work)


ROTATE_ROUTE = "POST /rotate"


def _rotation(user_id: str, capability_key: bytes, key: str) -> Keyed:
    """The record of one rotation (``POST /rotate``): its answer, new token
    included, is recorded in the key ring in the transaction that files the
    new owner grant (so a crash leaves both or neither), found and sealed
    with keys derived from the old owner token's secret alone
    (``capability_key``) and the Idempotency-Key: the server keeps no token
    in the clear, and only that old token, resent with the key, finds and
    opens it, as an ordinary replay, and only while it is still the owner
    (until the new token's first use, which revokes it and deletes the
    record: Keyring.retire_owner)."""
    return Keyed.make(
        user_id=user_id,
        file="keyring",
        master=capability_key,
        seal_root=capability_key,
        route=ROTATE_ROUTE,
        key=key,
        body={},
    )
