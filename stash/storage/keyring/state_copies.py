"""The key ring's copies, authenticated: what it keeps of the memory file
(its log head and state version) and of its own audit trail (the audit
head), so that rolling back either alone is caught (docs/DESIGN.md,
"Whole-state authentication").

The copies are plain ``keyring_meta`` rows; one more row, ``copies_mac``,
holds a MAC over all of them under a key derived from the current key
epoch's key, which only a capability live in that epoch reaches. So a copy
edited, deleted, or put back from before a revocation fails the MAC, and a
``copies_mac`` deleted is caught by the memory file, whose own
authenticated format (mark 3) says the key ring holds one. A key ring
written before this release has the plain rows only; the first session
that opens its memory seals them as they are (they are as trustworthy at
that moment as they ever were) and only then moves the memory file to
mark 3, so a crash between the two leaves a pair that still opens.

What stays possible: putting back the copies together with the rows they
describe, from an older copy of the same key ring within one key epoch — a
rollback of the store as a whole, which a client's pin catches
(SECURITY.md, "Limits").
"""

from __future__ import annotations

import hashlib
import hmac
import sqlite3
from dataclasses import dataclass

from ...core.errors import Conflict, Damaged
from ...crypto import keys
from ...crypto.chain import Head
from ...crypto.epochs import KeyChain
from ..disk_errors import DB_ERRORS
from ..sqlite.transactions import write_transaction
from .ring_file import ERASED_COPY, HEAD_COPY, STATE_COPY, RingFile

AUDIT_HEAD = "audit_head"  # "<count>:<last id>:<epoch>:<hex>" (storage/keyring/audit_chain.py)
COPIES_MAC = "copies_mac"  # "<epoch>:<hex of a 32-byte MAC over every name in COPIED>"
COPIED = (HEAD_COPY, STATE_COPY, AUDIT_HEAD)
MAC_BYTES = 32

ALTERED = (
    "The key ring's copies of this memory's state were altered, deleted or put back from an older copy. "
    "Nothing was served; the operator should run `stash verify` and restore this store from a backup."
)
MISSING = (
    "The key ring's authenticated copy of this memory's state is missing, while the memory file's "
    "authenticated format says it was written. Nothing was served; the operator should run `stash verify` "
    "and restore this store from a backup."
)


@dataclass(frozen=True)
class Copies:
    """The key ring's copies as read in one snapshot: ``authenticated`` when
    their MAC was there and held."""

    head: Head | None
    state: int | None
    audit: str | None
    authenticated: bool


def _mac(user_id: str, epoch: int, epoch_key: bytes, values: dict[str, str | None]) -> bytes:
    h = hashlib.blake2b(key=keys.subkey(epoch_key, b"keyring-copies"), digest_size=MAC_BYTES, person=b"stash.copies")
    for part in (user_id, str(epoch), *(f"{name}={values.get(name)}" for name in COPIED)):
        b = part.encode()
        h.update(len(b).to_bytes(8, "big"))
        h.update(b)
    return h.digest()


def _values(conn: sqlite3.Connection) -> tuple[dict[str, str | None], str | None]:
    """Every copied row and the MAC row, in one statement (one snapshot: a
    writer publishing meanwhile is seen whole or not at all)."""
    rows = dict(
        conn.execute(
            f"SELECT name, value FROM keyring_meta WHERE name IN ({', '.join('?' * 4)})", (*COPIED, COPIES_MAC)
        ).fetchall()
    )
    return {name: rows.get(name) for name in COPIED}, rows.get(COPIES_MAC)


def _verify(user_id: str, chain: KeyChain, values: dict[str, str | None], text: str) -> None:
    """Raise unless ``text`` is the MAC of ``values`` under ``chain``'s
    current epoch: a MAC of a later epoch is a revocation that committed
    while this request opened (retry); one of an earlier epoch was put back
    from before a revocation, which re-seals the copies in its own
    transaction (:func:`rekey`)."""
    epoch_text, _, mac_hex = text.partition(":")
    try:
        epoch, mac = int(epoch_text), bytes.fromhex(mac_hex)
    except ValueError:
        raise Damaged(ALTERED) from None
    if epoch > chain.epoch:
        raise Conflict(
            "A capability was revoked while this request was being opened, so nothing was done; retry it.",
            code="store.rekeyed",
        )
    if epoch != chain.epoch or not hmac.compare_digest(mac, _mac(user_id, epoch, chain.current, values)):
        raise Damaged(ALTERED)


def read(conn: sqlite3.Connection, user_id: str, chain: KeyChain) -> Copies:
    """The copies, checked: :class:`Damaged` when their MAC is there and
    fails, or a copy is unreadable."""
    values, text = _values(conn)
    if text is not None:
        _verify(user_id, chain, values, text)
    head, head_text, state_text = None, values[HEAD_COPY], values[STATE_COPY]
    if head_text is not None:
        head = Head.parse(head_text)
        if head is None:
            raise Damaged(ALTERED)
    try:
        state = None if state_text is None else int(state_text)
    except ValueError:
        raise Damaged(ALTERED) from None
    return Copies(head, state, values[AUDIT_HEAD], text is not None)


def state_required(conn: sqlite3.Connection, copies: Copies) -> bool:
    """Whether the memory file must hold its authenticated state head: the
    key ring has a copy of its version (plain or sealed), or shows a format
    that came with or after the state head (a key epoch past 0, a recorded
    page size). Only a store from before 0.2.0 that no release since has
    opened lacks all of these."""
    if copies.state is not None or copies.authenticated:
        return True
    meta = dict(conn.execute("SELECT name, value FROM keyring_meta WHERE name IN ('epoch', 'memory_page_bytes')"))
    return meta.get("epoch", "0") != "0" or "memory_page_bytes" in meta


def put(conn: sqlite3.Connection, user_id: str, chain: KeyChain, changes: dict[str, str]) -> None:
    """Write ``changes`` to the copies and seal them all (inside the caller's
    write transaction). The copies as they stand are checked first, so an
    edit made meanwhile is never sealed as if it were ours; plain copies of
    a key ring written before the MAC existed are sealed as they are."""
    values, text = _values(conn)
    if text is not None:
        _verify(user_id, chain, values, text)
    values.update(changes)
    for name, value in changes.items():
        conn.execute(
            "INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            (name, value),
        )
    mac = _mac(user_id, chain.epoch, chain.current, values)
    conn.execute(
        "INSERT INTO keyring_meta(name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value",
        (COPIES_MAC, f"{chain.epoch}:{mac.hex()}"),
    )


def rekey(conn: sqlite3.Connection, user_id: str, old: KeyChain, new: KeyChain) -> None:
    """Re-seal the copies under ``new``'s epoch (inside the transaction that
    starts it), after checking them under ``old``'s; a key ring without the
    MAC yet stays without it, and one whose copies fail it keeps failing."""
    values, text = _values(conn)
    if text is None:
        return
    try:
        _verify(user_id, old, values, text)
    except Damaged:
        return  # left as it is (failing): an edit of the copies must not stop a revocation
    mac = _mac(user_id, new.epoch, new.current, values)
    conn.execute("UPDATE keyring_meta SET value = ? WHERE name = ?", (f"{new.epoch}:{mac.hex()}", COPIES_MAC))


class HeadCopies:
    """The copies of the head and state version in ``ring``'s meta rows,
    read and moved forward."""

    def __init__(self, ring: RingFile) -> None:
        self.ring = ring

    def log_head(self) -> Head | None:
        """The copy of the memory log's head kept here, outside the memory
        file, so that rolling back that file alone is caught."""
        text = self.ring.meta(HEAD_COPY)
        if text is None:
            return None
        head = Head.parse(text)
        if head is None:
            raise ValueError("the key ring's copy of the log head is unreadable")
        return head

    def state_version(self) -> int | None:
        """The copy of the memory file's state version kept here (see
        State.digest, memfile/state.py), or None before the file had one."""
        text = self.ring.meta(STATE_COPY)
        try:
            return None if text is None else int(text)
        except ValueError:
            raise ValueError("the key ring's copy of the state version is unreadable") from None

    def erased_count(self) -> int:
        """How many memories of the log are erased, as the last write recorded
        it (0 before any did): counted out of the identity's quota."""
        try:
            return max(0, int(self.ring.meta(ERASED_COPY) or 0))
        except ValueError:
            return 0

    def advance_head(
        self, head: Head, state_version: int | None = None, *, chain: KeyChain | None = None, erased: int | None = None
    ) -> bool:
        """Record ``head`` as the copy unless the copy is already as far: it
        only moves forward, so concurrent writers finishing out of order leave
        the furthest one. Best effort (False when it could not be written, as
        on a full disk): a copy that lags is accepted by the next open when
        the log extends it, and the next write brings it up to date. For the
        same reason its commit is not fsynced (a power cut may lose it, which
        is a lag): that keeps the cost of a note at one fsync, not two.
        With ``chain`` the copies are sealed too (:func:`put`);
        without it, a key ring whose copies are sealed is left as it is (a
        lag), never given a copy its MAC does not cover. ``erased``: how
        many memories of the file are erased now, kept beside the copies
        (:meth:`erased_count`)."""
        try:
            self.ring.conn.execute("PRAGMA synchronous = NORMAL")
            try:
                with write_transaction(self.ring.conn):
                    if erased is not None and erased != self.erased_count():
                        self.ring.conn.execute(
                            "INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
                            "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                            (ERASED_COPY, str(erased)),
                        )
                    if chain is not None:
                        return self._advance_sealed_copies(head, state_version, chain)
                    if self.ring.meta(COPIES_MAC) is not None:
                        return False
                    current = self.log_head()
                    if current is None or current.count < head.count:
                        self.ring.conn.execute(
                            "INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
                            "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                            (HEAD_COPY, head.pin()),
                        )
                    copy = self.state_version()
                    if state_version is not None and (copy is None or copy < state_version):
                        self.ring.conn.execute(
                            "INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
                            "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                            (STATE_COPY, str(state_version)),
                        )
            finally:
                self.ring.conn.execute("PRAGMA synchronous = FULL")
        except (*DB_ERRORS, ValueError, OSError):  # type: ignore[misc]  # a tuple of exception classes
            return False
        return True

    def _advance_sealed_copies(self, head: Head, state_version: int | None, chain: KeyChain) -> bool:
        """:meth:`advance_head`'s work with the copies sealed, inside its
        transaction: each copy only moves forward, and the MAC is written
        even when neither moves (a key ring whose copies were never sealed)."""
        try:
            copies = read(self.ring.conn, self.ring.user_id, chain)
        except (Damaged, Conflict):
            return False  # altered meanwhile, or a newer epoch's: the next open says which
        changes = {}
        if copies.head is None or copies.head.count < head.count:
            changes[HEAD_COPY] = head.pin()
        if state_version is not None and (copies.state is None or copies.state < state_version):
            changes[STATE_COPY] = str(state_version)
        if changes or not copies.authenticated:
            put(self.ring.conn, self.ring.user_id, chain, changes)
        return True

    def copies(self, chain: KeyChain) -> Copies:
        """The copies kept here, checked against their MAC (:func:`put`)."""
        return read(self.ring.conn, self.ring.user_id, chain)
