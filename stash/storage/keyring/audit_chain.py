"""The audit trail's MAC chain: each event sealed to the owner is linked to
the one before it by a MAC under the key of the epoch it was written in,
and the key ring's audit head (count, last id, a MAC) closes the chain, so
an event deleted, inserted, reordered or moved is caught when the owner
reads the trail (``GET /audit`` answers ``trail.intact``).

Every capability records events (a full one's import, a read one's
export), so the chain key comes from the epoch key, which every live
capability reaches, not from the owner key, which only the owner does:
forging a link takes a capability live in that epoch, and a revoked one
forges nothing written after its revocation (the links that follow are
under a key it never had). The audit head is one of the key ring's
authenticated copies (:mod:`state_copies`), so deleting the newest events
together with the head takes putting back an older copy of the whole key
ring's copies (SECURITY.md, "Limits").

A link is kept in the event row's ``at`` column (which a sealed event
leaves empty: its time is inside the seal) as ``chain:<epoch>:<hex>``;
events from before the chain existed have none and come first.
"""

from __future__ import annotations

import hashlib
import hmac
import sqlite3
from dataclasses import dataclass

from ...crypto import keys
from ...crypto.epochs import KeyChain
from .state_copies import AUDIT_HEAD, put

LINK = "chain:"
MAC_BYTES = 32


def _mac(epoch_key: bytes, *parts: object) -> bytes:
    h = hashlib.blake2b(key=keys.subkey(epoch_key, b"audit-chain"), digest_size=MAC_BYTES, person=b"stash.audit")
    for part in parts:
        b = part if isinstance(part, bytes) else str(part).encode()
        h.update(len(b).to_bytes(8, "big"))
        h.update(b)
    return h.digest()


def _link(user_id: str, chain: KeyChain, epoch: int, prev: bytes, rid: int, sealed: str) -> bytes:
    return _mac(chain.key(epoch), "link", user_id, epoch, prev, rid, sealed)


def _head_mac(user_id: str, chain: KeyChain, epoch: int, count: int, rid: int, last: bytes) -> bytes:
    return _mac(chain.key(epoch), "head", user_id, epoch, count, rid, last)


@dataclass(frozen=True)
class Trail:
    """What the chain says of the trail: ``intact`` when every event from
    ``chained_from`` on is linked and the last matches the audit head;
    ``problem`` says what broke, else None."""

    intact: bool
    chained_from: int | None
    problem: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {"intact": self.intact, "chained_from": self.chained_from, "problem": self.problem}


def _parse_head(text: str | None) -> tuple[int, int, int, bytes] | None:
    if text is None:
        return None
    count, rid, epoch, mac = text.split(":")
    return int(count), int(rid), int(epoch), bytes.fromhex(mac)


def _last(conn: sqlite3.Connection) -> tuple[int, bytes]:
    """The chain so far, from the audit head (two indexed reads, however long
    the trail): how many events it links and the last link."""
    row = conn.execute("SELECT value FROM keyring_meta WHERE name = ?", (AUDIT_HEAD,)).fetchone()
    head = _parse_head(None if row is None else row[0])
    if head is None:
        return 0, b""
    last = conn.execute("SELECT at FROM audit WHERE id = ?", (head[1],)).fetchone()
    if last is None or not str(last[0]).startswith(LINK):
        raise ValueError("the audit head names no linked event")
    return head[0], bytes.fromhex(str(last[0]).split(":")[2])


def append(conn: sqlite3.Connection, user_id: str, chain: KeyChain, rid: int, sealed: str) -> None:
    """Link event ``rid`` (just inserted, its sealed text ``sealed``) to the
    chain and move the audit head to it, inside the caller's transaction.
    The head is written first: it checks the key ring's sealed copies, and
    when they do not hold (altered, or a revocation committed while this
    request ran) the event is left unlinked, never the head half moved."""
    count, prev = _last(conn)
    link = _link(user_id, chain, chain.epoch, prev, rid, sealed)
    head = _head_mac(user_id, chain, chain.epoch, count + 1, rid, link)
    put(conn, user_id, chain, {AUDIT_HEAD: f"{count + 1}:{rid}:{chain.epoch}:{head.hex()}"})
    conn.execute("UPDATE audit SET at = ? WHERE id = ?", (f"{LINK}{chain.epoch}:{link.hex()}", rid))


def check(rows: list[tuple[int, str, str]], head_text: str | None, user_id: str, chain: KeyChain) -> Trail:
    """Walk ``rows`` (id, at, sealed text; every audit row, oldest first)
    and the audit head; the trail's state. Never raises on what it finds."""
    prev, count, first, last_id, last_epoch = b"", 0, None, None, 0
    for rid, at, sealed in rows:
        if not at.startswith(LINK):
            if first is not None:
                return Trail(False, first, f"event {rid} is not linked to the events before it (inserted)")
            continue
        try:
            _, epoch_text, mac_hex = at.split(":")
            epoch, mac = int(epoch_text), bytes.fromhex(mac_hex)
            expected = _link(user_id, chain, epoch, prev, rid, sealed) if last_epoch <= epoch <= chain.epoch else b""
        except (ValueError, IndexError):
            expected, mac, epoch = b"", b"x", 0
        if not expected or not hmac.compare_digest(mac, expected):
            return Trail(
                False,
                first if first is not None else rid,
                f"event {rid} does not follow the events before it (one was deleted, inserted or altered)",
            )
        prev, count, last_id, last_epoch = mac, count + 1, rid, epoch
        if first is None:
            first = rid
    try:
        head = _parse_head(head_text)
    except ValueError:
        return Trail(False, first, "the audit head is unreadable")
    if head is None:
        return Trail(count == 0, first, None if count == 0 else "the audit head is missing")
    n, rid, epoch, mac = head
    try:
        ok = epoch <= chain.epoch and hmac.compare_digest(mac, _head_mac(user_id, chain, epoch, n, rid, prev))
    except ValueError:
        ok = False
    if not ok or n != count or rid != last_id:
        return Trail(
            False,
            first,
            f"the trail ends at {count} linked events but its head records {n} "
            "(the newest events were deleted, or the head was altered)",
        )
    return Trail(True, first)
