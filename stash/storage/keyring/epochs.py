"""New key epochs (a revocation, an expiry) and owner rotation: each one
transaction that seals a fresh epoch key to every live grant, or files a
successor owner grant and retires its predecessor at its first use."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ...crypto import epochs, inbox_seal
from ...crypto.epochs import KeyChain
from ...crypto.owner_seal import OwnerKeys
from ..sqlite.transactions import write_transaction
from .grants import GrantKeys
from .owner import OwnerData
from .ring_file import EPOCH, OLDER_KEYS, OWNER_BOX, OWNER_NEXT, Grant, RingFile, expired
from .state_copies import rekey


class Epochs:
    """New key epochs, and the owner rotation that ends in one: the rows of
    ``ring``, ``grant_keys`` to file a rotation's new grant, ``owner`` to
    move the owner keys and labels to it."""

    def __init__(self, ring: RingFile, grant_keys: GrantKeys, owner: OwnerData) -> None:
        self.ring = ring
        self.grant_keys = grant_keys
        self.owner = owner

    def advance_epoch(
        self,
        chain: KeyChain,
        revoke: tuple[int, ...],
        *,
        mint: dict[str, Any] | None = None,
        owner: OwnerKeys | None = None,
        now: datetime | None = None,
    ) -> tuple[KeyChain, list[int], int | None]:
        """Start a new epoch: revoke the grants ``revoke`` (destroying their
        key columns), seal a fresh epoch key to every other live grant, keep
        the older keys under it, and with ``mint`` (keyword arguments of
        :meth:`GrantKeys.insert`) file a new grant in the same transaction (an owner
        rotation). Unmoved live grants cannot be reached without their
        secrets, so they are revoked too and returned. A grant whose expiry
        is at or before ``now`` (the clock when None) is revoked as well: it
        receives no key of this epoch or any later one, whatever clock a
        server that later opens these files keeps. One transaction: a crash
        leaves the old epoch or the new one, whole. Returns the new chain,
        the unmoved grants revoked with it, and the minted grant id. With
        ``owner`` (the owner keys, on a rotation) the minted owner grant gets
        them with a fresh seed added, and the labels move to that seed, so the
        rotated-away owner token opens nothing sealed to the owner after it."""
        if (
            mint is not None
            and mint.get("scope") == "owner"
            and owner is None
            and self.ring.meta(OWNER_BOX) is not None
        ):
            # The new owner grant would get no owner box, and everything
            # sealed to the owner so far would stay closed to it.
            raise ValueError("an owner rotation needs the owner keys")
        new = chain.advance()
        now = datetime.now(UTC) if now is None else now
        at = now.replace(microsecond=0).isoformat().replace("+00:00", "Z")
        stranded: list[int] = []
        minted = None
        with write_transaction(self.ring.conn):
            self.ring.select("LIMIT 0", ())
            self.ring.check_epoch(chain)
            for g in self.ring.select("WHERE revoked IS NULL ORDER BY id", ()):
                if g.id in revoke or not g.moved or expired(self.ring.notes(g.id).expires, now):
                    self.ring.conn.execute(
                        "UPDATE grants SET wrapped = NULL, kdf = NULL, tag = NULL, pub = NULL, box = NULL, "
                        "revoked = ? WHERE id = ?",
                        (at, g.id),
                    )
                    if g.id not in revoke and not g.moved:
                        stranded.append(g.id)
                else:
                    assert g.pub is not None  # a moved grant has its public key
                    self.ring.conn.execute(
                        "UPDATE grants SET box = ? WHERE id = ?",
                        (epochs.box_epoch(g.pub, new.epoch, new.current), g.id),
                    )
            self.owner.reseal_labels(chain, new)
            older = new.seal_older()
            assert older is not None  # a new epoch is past epoch 0
            for name, value in (
                (EPOCH, str(new.epoch)),
                (OLDER_KEYS, older.hex()),
                (inbox_seal.PUBLIC_META, inbox_seal.public_text(new)),
            ):
                self.ring.conn.execute(
                    "INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
                    "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                    (name, value),
                )
            rekey(self.ring.conn, self.ring.user_id, chain, new)  # a copy from before this epoch fails its MAC
            if mint is not None:
                minted = self.grant_keys.insert(chain=new, **mint)
                if owner is not None and mint.get("scope") == "owner":
                    fresh = owner.advance()
                    (grant,) = self.ring.select("WHERE id = ?", (minted,))
                    assert grant.pub is not None  # just minted in format 2
                    self.owner.put_owner_keys(minted, grant.pub, fresh)
                    self.owner.reseal_owner_labels(owner, fresh)
        return new, stranded, minted

    def rotate_owner(
        self, chain: KeyChain, old_id: int, mint: dict[str, Any], owner: OwnerKeys | None
    ) -> tuple[KeyChain, list[int], int]:
        """File a successor to owner grant ``old_id`` (keyword arguments of
        :meth:`GrantKeys.insert`) that reaches the current epoch, and record it as
        pending (:data:`OWNER_NEXT`, with the owner seeds boxed to it), in one
        transaction. The old grant stays the owner until the successor is first
        presented (:meth:`retire_owner`), so an answer lost to a crash or a cut
        connection never leaves the owner without a working token. A successor
        of an earlier rotation that was never presented is revoked here, with
        a new epoch, since its token may be in a lost answer. Returns the chain
        now current, the grants revoked with it and the successor's id."""
        if owner is None and self.ring.meta(OWNER_BOX) is not None:
            raise ValueError("an owner rotation needs the owner keys")
        with write_transaction(self.ring.conn):
            self.ring.select("LIMIT 0", ())
            self.ring.check_epoch(chain)
            stranded: list[int] = []
            pending = self.ring.pending_owner()
            earlier = [] if pending is None or pending[0] != old_id else [pending[1]]
            live_earlier = [
                g for g in earlier if any(x.id == g for x in self.ring.select("WHERE id = ? AND revoked IS NULL", (g,)))
            ]
            if live_earlier:
                chain, stranded, _ = self.advance_epoch(chain, tuple(live_earlier))
                stranded = [*live_earlier, *stranded]
            minted = self.grant_keys.insert(chain=chain, **mint)
            (grant,) = self.ring.select("WHERE id = ?", (minted,))
            assert grant.pub is not None  # just filed in format 2
            box = "" if owner is None else owner.box(minted, grant.pub).hex()
            self.ring.conn.execute(
                "INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                (OWNER_NEXT, f"{old_id}:{minted}:{box}"),
            )
        return chain, stranded, minted

    def retire_owner(
        self, chain: KeyChain, grant: Grant, kek: bytes, window_from: int | None = None
    ) -> tuple[KeyChain, list[int]] | None:
        """The first use of a rotation's successor ``grant`` (opened with
        ``kek``): revoke the owner grant it succeeds with a new epoch, and with
        it every live grant from id ``window_from`` on but ``grant`` (those
        minted since the rotation: storage/keyring/owner_handover.py), hand it the
        owner keys with a fresh seed and re-seal the labels to it (so the
        rotated-away token opens nothing sealed to the owner, or written,
        from now on), in one transaction. Returns the new chain and the
        grants ended with the old owner, or None when ``grant`` is no pending
        successor (retired already, by a concurrent first use: the caller
        opens the grant again)."""
        with write_transaction(self.ring.conn):
            pending = self.ring.pending_owner()
            if pending is None or pending[1] != grant.id or self.ring.epoch() != chain.epoch:
                return None
            old_id = pending[0]
            owner = self.owner.open_owner_keys(grant, kek)
            window = (
                []
                if window_from is None
                else [
                    g.id
                    for g in self.ring.select(
                        "WHERE revoked IS NULL AND id >= ? AND id != ? ORDER BY id", (window_from, grant.id)
                    )
                ]
            )
            new, _, _ = self.advance_epoch(chain, (old_id, *window))
            (fresh_grant,) = self.ring.select("WHERE id = ?", (grant.id,))
            if owner is not None:
                assert fresh_grant.pub is not None
                fresh = owner.advance()
                self.owner.put_owner_keys(grant.id, fresh_grant.pub, fresh)
                self.owner.reseal_owner_labels(owner, fresh)
            self.ring.conn.execute("DELETE FROM keyring_meta WHERE name = ?", (OWNER_NEXT,))
            self.end_owner_records()
        return new, window

    def end_owner_records(self) -> None:
        """Delete every Idempotency-Key record of the key ring (inside the
        caller's transaction) when its owner enrolment is retired: each is an
        owner route's, sealed to the retired token, and a rotation's holds
        the new token, so none may outlive the moment its token stops being
        the owner."""
        if self.ring.has_table("idempotency"):
            self.ring.conn.execute("DELETE FROM idempotency")
