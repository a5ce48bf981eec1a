"""Owner-only data in the key ring: the owner keys and their box, and what is
sealed to them (labels, last-used days, audit events; stash/crypto/owner_seal.py),
which no epoch key opens."""

from __future__ import annotations

import json

from ...core.errors import Conflict, Damaged
from ...crypto import aead, epochs
from ...crypto.epochs import KeyChain
from ...crypto.owner_seal import OwnerKeys, is_sealed
from ...crypto.owner_seal import seal as seal_to_owner
from ..disk_errors import DB_ERRORS
from ..sqlite.transactions import write_transaction
from .audit_chain import Trail
from .audit_chain import append as append_to_chain
from .audit_chain import check as check_chain
from .ring_file import (
    AUDIT_PAD,
    LABEL_PAD,
    OWNER_BOX,
    OWNER_PUB,
    OWNER_SEALED,
    SEALED_DAY,
    SEALED_EVENT,
    Grant,
    RingFile,
    label_aad,
    label_key,
    now_utc,
)
from .state_copies import AUDIT_HEAD

# The day each grant was last recorded as used by this process, so a sealed
# day (which no request but the owner's can read back) is written once a day
# per process rather than on every request.
_TOUCHED: dict[tuple[str, str, int], str] = {}


class OwnerData:
    """The owner keys, and the labels, days and events sealed to them, in
    ``ring``'s rows."""

    def __init__(self, ring: RingFile) -> None:
        self.ring = ring

    def owner_keys(self, grant: Grant, kek: bytes, chain: KeyChain) -> OwnerKeys | None:
        """The owner keys, for an owner grant: made with the store, or for a
        store made before them on the owner's first request to an owner route
        (boxed to its public key), and every
        label, audit event and last-used day written before then moved under
        them, in one transaction, once. None when the key ring cannot be
        written now (the data stays as it is, and the next owner request
        tries again) or ``grant`` is not the owner's."""
        if grant.scope != "owner":
            return None
        owner = self.open_owner_keys(grant, kek)
        if owner is not None and self.ring.meta(OWNER_SEALED) == "1":
            return owner
        try:
            with write_transaction(self.ring.conn):
                owner = self.open_owner_keys(grant, kek)
                if owner is None:
                    owner = OwnerKeys.new(self.ring.user_id)
                    self.put_owner_keys(grant.id, bytes(epochs.capability_private_key(kek).public_key), owner)
                self._seal_owner_data(owner, chain)
                self.mark_owner_sealed()
        except DB_ERRORS:
            return self.open_owner_keys(grant, kek)
        return owner

    def open_owner_keys(self, grant: Grant, kek: bytes) -> OwnerKeys | None:
        """The owner seeds in the owner box, when it is this grant's; None
        when the store has no box yet or it is another grant's."""
        text = self.ring.meta(OWNER_BOX)
        if text is None:
            return None
        gid, _, hexbox = text.partition(":")
        pending = self.ring.pending_owner()
        if gid != str(grant.id) and pending is not None and pending[1] == grant.id and pending[2] is not None:
            # A rotation's successor not yet presented (stash verify --token):
            # its copy of the owner seeds, boxed to it at the rotation.
            return OwnerKeys.unbox(self.ring.user_id, grant.id, epochs.capability_private_key(kek), pending[2])
        if gid != str(grant.id):
            return None
        try:
            box = bytes.fromhex(hexbox)
        except ValueError:
            raise aead.Unsealable("the owner box is unreadable") from None
        return OwnerKeys.unbox(self.ring.user_id, grant.id, epochs.capability_private_key(kek), box)

    def put_owner_keys(self, grant_id: int, grant_public: bytes, owner: OwnerKeys) -> None:
        for name, value in (
            (OWNER_PUB, owner.public.hex()),
            (OWNER_BOX, f"{grant_id}:{owner.box(grant_id, grant_public).hex()}"),
        ):
            self.ring.conn.execute(
                "INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                (name, value),
            )

    def mark_owner_sealed(self) -> None:
        self.ring.conn.execute(
            "INSERT INTO keyring_meta(name, value) VALUES (?, '1') "
            "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            (OWNER_SEALED,),
        )

    def _seal_owner_data(self, owner: OwnerKeys, chain: KeyChain) -> None:
        """Seal to ``owner`` every label, audit event and last-used day still
        in clear or under an epoch key (inside the caller's transaction).
        secure_delete overwrites the cells they leave."""
        public = owner.public
        if self.ring.has_notes():
            for grant_id, label, day in self.ring.conn.execute(
                "SELECT grant_id, label, last_used FROM grant_notes"
            ).fetchall():
                if label is not None and not is_sealed(label):
                    plain = aead.open_sealed(label_key(chain), label, label_aad(self.ring.user_id, grant_id))
                    self.ring.conn.execute(
                        "UPDATE grant_notes SET label = ? WHERE grant_id = ?",
                        (
                            seal_to_owner(self.ring.user_id, public, f"grant_label|{grant_id}", plain, pad=LABEL_PAD),
                            grant_id,
                        ),
                    )
                if day is not None and not day.startswith(SEALED_DAY):
                    self.ring.conn.execute(
                        "UPDATE grant_notes SET last_used = ? WHERE grant_id = ?",
                        (self._sealed_day(public, grant_id, day), grant_id),
                    )
        if self.ring.has_table("audit"):
            for rid, at, grant_id, event, detail in self.ring.conn.execute(
                "SELECT id, at, grant_id, event, detail FROM audit WHERE event != ?", (SEALED_EVENT,)
            ).fetchall():
                self.ring.conn.execute(
                    "UPDATE audit SET at = '', grant_id = 0, event = ?, detail = ? WHERE id = ?",
                    (SEALED_EVENT, self._sealed_event(public, at, grant_id, event, json.loads(detail)), rid),
                )

    def _sealed_day(self, public: bytes, grant_id: int, day: str) -> str:
        return SEALED_DAY + seal_to_owner(self.ring.user_id, public, f"last_used|{grant_id}", day.encode()).hex()

    def _sealed_event(self, public: bytes, at: str, grant_id: int, event: str, detail: object) -> str:
        plain = json.dumps({"at": at, "grant": grant_id, "event": event, "detail": detail}, sort_keys=True)
        return seal_to_owner(self.ring.user_id, public, "audit", plain.encode(), pad=AUDIT_PAD).hex()

    def label(self, grant_id: int, chain: KeyChain, owner: OwnerKeys | None = None) -> str | None:
        """The grant's label, opened; :class:`aead.Unsealable` when it was
        altered or moved from another grant, or is sealed to the owner and
        ``owner`` is not given."""
        sealed = self.ring.notes(grant_id).label
        if sealed is None:
            return None
        if is_sealed(sealed):
            if owner is None:
                raise aead.Unsealable("a label opens with the owner capability only")
            return owner.open(sealed, f"grant_label|{grant_id}").decode()
        return aead.open_sealed(label_key(chain), sealed, label_aad(self.ring.user_id, grant_id)).decode()

    def seal_label(self, grant_id: int, plain: bytes, chain: KeyChain) -> bytes:
        """A label sealed to the owner key; under the epoch's label key only
        in a store whose owner has not yet been given one."""
        public = self.ring.owner_public()
        if public is not None:
            return seal_to_owner(self.ring.user_id, public, f"grant_label|{grant_id}", plain, pad=LABEL_PAD)
        return aead.seal(label_key(chain), plain, label_aad(self.ring.user_id, grant_id))

    def reseal_labels(self, old: KeyChain, new: KeyChain) -> None:
        """Move every label still under the epoch's label key to the new
        epoch's (inside the epoch's write transaction), so a revoked
        capability reads no label minted or kept after its revocation. A
        label sealed to the owner stays as it is: no epoch key opens it."""
        if not self.ring.has_notes():
            return
        rows = self.ring.conn.execute("SELECT grant_id, label FROM grant_notes WHERE label IS NOT NULL").fetchall()
        for grant_id, sealed in rows:
            if is_sealed(sealed):
                continue
            aad = label_aad(self.ring.user_id, grant_id)
            plain = aead.open_sealed(label_key(old), sealed, aad)
            self.ring.conn.execute(
                "UPDATE grant_notes SET label = ? WHERE grant_id = ?", (aead.seal(label_key(new), plain, aad), grant_id)
            )

    def reseal_owner_labels(self, old: OwnerKeys, new: OwnerKeys) -> None:
        if not self.ring.has_notes():
            return
        for grant_id, label in self.ring.conn.execute(
            "SELECT grant_id, label FROM grant_notes WHERE label IS NOT NULL"
        ).fetchall():
            if is_sealed(label):
                what = f"grant_label|{grant_id}"
                self.ring.conn.execute(
                    "UPDATE grant_notes SET label = ? WHERE grant_id = ?",
                    (
                        seal_to_owner(self.ring.user_id, new.public, what, old.open(label, what), pad=LABEL_PAD),
                        grant_id,
                    ),
                )

    def last_used(self, grant_id: int, owner: OwnerKeys | None) -> str | None:
        """The grant's last-used day, opened with the owner keys."""
        day = self.ring.notes(grant_id).last_used
        if day is None or not day.startswith(SEALED_DAY):
            return day
        if owner is None:
            raise aead.Unsealable("a last-used day opens with the owner capability only")
        try:
            value = bytes.fromhex(day[len(SEALED_DAY) :])
        except ValueError:
            raise aead.Unsealable("a sealed last-used day is unreadable") from None
        return owner.open(value, f"last_used|{grant_id}").decode()

    def touch(self, grant_id: int, day: str) -> None:
        """Record ``day`` as the grant's last use, sealed to the owner key:
        written once a day per grant and process (a sealed day cannot be
        read back to compare), best effort like :meth:`HeadCopies.advance_head` (a full
        disk must not refuse a read), and not fsynced."""
        memo = (str(self.ring.path), self.ring.user_id, grant_id)
        if _TOUCHED.get(memo) == day:
            return
        public = self.ring.owner_public()
        if public is None and self.ring.notes(grant_id).last_used == day:
            _TOUCHED[memo] = day
            return
        value = day if public is None else self._sealed_day(public, grant_id, day)
        try:
            self.ring.conn.execute("PRAGMA synchronous = NORMAL")
            try:
                with write_transaction(self.ring.conn):
                    self.ring.ensure_notes()
                    self.ring.conn.execute(
                        "INSERT INTO grant_notes(grant_id, last_used) VALUES (?, ?) "
                        "ON CONFLICT(grant_id) DO UPDATE SET last_used = excluded.last_used",
                        (grant_id, value),
                    )
            finally:
                self.ring.conn.execute("PRAGMA synchronous = FULL")
        except (*DB_ERRORS, OSError):  # type: ignore[misc]  # a tuple of exception classes
            return
        if len(_TOUCHED) > 100_000:
            _TOUCHED.clear()
        _TOUCHED[memo] = day

    def record(self, grant_id: int, event: str, detail: dict[str, object], chain: KeyChain | None = None) -> None:
        """Append one audit event, in the caller's transaction when there is
        one (so a key-ring write and its event commit together). Its time,
        grant, kind and detail are sealed to the owner key, padded
        (:data:`AUDIT_PAD`), and with ``chain`` linked to the trail's MAC
        chain (:mod:`audit_chain`); in clear only in a store whose owner has
        not made a request since this release (the owner's next request
        seals them, :meth:`owner_keys`)."""
        public = self.ring.owner_public()
        with write_transaction(self.ring.conn):
            self.ring.ensure_table("audit")
            if public is None:
                row = (now_utc(), grant_id, event, json.dumps(detail, sort_keys=True))
            else:
                row = ("", 0, SEALED_EVENT, self._sealed_event(public, now_utc(), grant_id, event, detail))
            cur = self.ring.conn.execute("INSERT INTO audit(at, grant_id, event, detail) VALUES (?, ?, ?, ?)", row)
            if public is not None and chain is not None:
                try:
                    append_to_chain(self.ring.conn, self.ring.user_id, chain, int(cur.lastrowid or 0), row[3])
                except (Conflict, Damaged, ValueError):
                    # The event stays, unlinked: the write it records may have
                    # committed already, and the trail then says it is not
                    # intact (SECURITY.md, "Owner-only data").
                    pass

    def trail(self, owner: OwnerKeys, chain: KeyChain) -> tuple[list[dict[str, object]], Trail]:
        """Every audit event (:meth:`events`) and what the MAC chain says of
        them, read in one snapshot."""
        self.ring.conn.execute("BEGIN")  # one snapshot for the rows and the head
        try:
            out = self.events(owner)
            rows = (
                self.ring.conn.execute("SELECT id, at, detail FROM audit ORDER BY id").fetchall()
                if self.ring.has_table("audit")
                else []
            )
            head = self.ring.meta(AUDIT_HEAD)
        finally:
            self.ring.conn.execute("COMMIT")
        return out, check_chain(rows, head, self.ring.user_id, chain)

    def events(self, owner: OwnerKeys | None = None) -> list[dict[str, object]]:
        """Every audit event, oldest first; :class:`aead.Unsealable` when one
        sealed to the owner does not open with ``owner``."""
        if not self.ring.has_table("audit"):
            return []
        out: list[dict[str, object]] = []
        for i, at, g, e, d in self.ring.conn.execute("SELECT id, at, grant_id, event, detail FROM audit ORDER BY id"):
            if e != SEALED_EVENT:
                out.append({"id": i, "at": at, "grant": g, "event": e, "detail": json.loads(d)})
                continue
            if owner is None:
                raise aead.Unsealable("the audit opens with the owner capability only")
            try:
                sealed = bytes.fromhex(d)
            except ValueError:
                raise aead.Unsealable("a sealed audit event is unreadable") from None
            row = json.loads(owner.open(sealed, "audit"))
            out.append(
                {"id": i, "at": row["at"], "grant": row["grant"], "event": row["event"], "detail": row["detail"]}
            )
        return out
