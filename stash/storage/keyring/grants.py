"""Filing, opening and moving grants: the certificate and box of each
capability (stash/crypto/epochs.py), and the move of a format-1 grant to
the epoch scheme at its next use."""

from __future__ import annotations

import json

import argon2.exceptions

from ...crypto import aead, epochs, keys
from ...crypto.epochs import KeyChain
from ...crypto.owner_seal import OwnerKeys
from ..disk_errors import DB_ERRORS
from ..sqlite.transactions import write_transaction
from .owner import OwnerData
from .ring_file import OWNER_BOX, SCOPES, Grant, Opened, RingFile, StaleGrant, cert_aad, now_utc, wrap_aad


class GrantKeys:
    """Grants filed, opened with a token's secret, and moved to key epochs:
    the rows of ``ring``, and ``owner`` to seal a new grant's label and to
    give the store's first owner grant the owner keys."""

    def __init__(self, ring: RingFile, owner: OwnerData) -> None:
        self.ring = ring
        self.owner = owner

    def insert(
        self,
        *,
        scope: str,
        tag: bytes,
        secret: bytes,
        chain: KeyChain,
        kdf: keys.KdfParams,
        expires: str | None = None,
        label: str | None = None,
    ) -> int:
        """File a grant whose box holds ``chain``'s current key (inside a
        write transaction). The id is allotted first because the certificate
        binds it (and ``expires``, when given); ``label`` is sealed under the
        current epoch's label key, bound to the user and the grant id."""
        if scope not in SCOPES:
            raise ValueError("unknown scope")
        salt = keys.new_salt()
        kek = keys.derive_kek(secret, salt, kdf)
        pub = bytes(epochs.capability_private_key(kek).public_key)
        cur = self.ring.conn.execute(
            "INSERT INTO grants(tag, scope, created) VALUES (?, ?, ?)", (tag, scope, now_utc())
        )
        grant_id = int(cur.lastrowid or 0)
        self.ring.conn.execute(
            "UPDATE grants SET kdf = ?, wrapped = ?, pub = ?, box = ? WHERE id = ?",
            (
                json.dumps({**kdf.as_dict(), "salt": salt.hex()}),
                aead.seal(kek, pub, cert_aad(self.ring.user_id, grant_id, scope, expires)),
                pub,
                epochs.box_epoch(pub, chain.epoch, chain.current),
                grant_id,
            ),
        )
        if expires is not None or label is not None:
            sealed = None if label is None else self.owner.seal_label(grant_id, label.encode(), chain)
            self.ring.ensure_notes()
            self.ring.conn.execute(
                "INSERT INTO grant_notes(grant_id, label, expires) VALUES (?, ?, ?)", (grant_id, sealed, expires)
            )
        return grant_id

    def add(
        self,
        *,
        scope: str,
        tag: bytes,
        secret: bytes,
        chain: KeyChain,
        kdf: keys.KdfParams,
        expires: str | None = None,
        label: str | None = None,
    ) -> int:
        """A new capability that reaches the current epoch. Refused (409) if a
        revocation moved the epoch since ``chain`` was opened: the new box
        would hold a key that is no longer current."""
        with write_transaction(self.ring.conn):
            self.ring.select("LIMIT 0", ())  # a format-1 ring gets its columns first
            self.ring.check_epoch(chain)
            grant_id = self.insert(
                scope=scope, tag=tag, secret=secret, chain=chain, kdf=kdf, expires=expires, label=label
            )
            if scope == "owner" and self.ring.meta(OWNER_BOX) is None:
                # A new store's owner key, from its first moment, so that no
                # event or day is ever written in clear.
                (grant,) = self.ring.select("WHERE id = ?", (grant_id,))
                assert grant.pub is not None  # just filed in format 2
                self.owner.put_owner_keys(grant_id, grant.pub, OwnerKeys.new(self.ring.user_id))
                self.owner.mark_owner_sealed()
            return grant_id

    def withdraw(self, grant_id: int) -> bytes | None:
        """End a read or full grant whose token nobody may hold (an MCP
        host's approval never redeemed, or its code redeemed twice:
        service/oauth.py), without the owner's keys: its key columns and tag
        destroyed as a revocation destroys them, so its token opens nothing
        here and finds no grant. The new key epoch a revocation also starts
        needs the owner's keys: it comes with the next revocation or
        rotation. Its tag; None when it was revoked already (or is the
        owner's, which is never withdrawn)."""
        with write_transaction(self.ring.conn):
            self.ring.select("LIMIT 0", ())  # a format-1 ring gets its columns first
            row = self.ring.conn.execute("SELECT tag, scope, revoked FROM grants WHERE id = ?", (grant_id,)).fetchone()
            if row is None or row[1] == "owner" or row[2] is not None:
                return None
            self.ring.conn.execute(
                "UPDATE grants SET wrapped = NULL, kdf = NULL, tag = NULL, pub = NULL, box = NULL, "
                "revoked = ? WHERE id = ?",
                (now_utc(), grant_id),
            )
        return None if row[0] is None else bytes(row[0])

    def open_grant(self, grant: Grant, secret: bytes) -> Opened:
        """Every epoch key this grant reaches, or :class:`aead.Unsealable` when
        the row was altered (scope, id, public key, certificate or box) or
        belongs to someone else, or :class:`StaleGrant` when its box is from
        an older epoch than the key ring's (a revoked row put back)."""
        if grant.wrapped is None or grant.kdf is None:
            raise aead.Unsealable("grant holds no key")
        try:
            params = json.loads(grant.kdf)
            salt = bytes.fromhex(params["salt"])
            kdf = keys.KdfParams.from_dict(params)
            kek = keys.derive_kek(secret, salt, kdf)
        except (ValueError, KeyError, TypeError, OverflowError, argon2.exceptions.HashingError):
            raise aead.Unsealable("grant key derivation parameters are unreadable") from None
        n = self.ring.epoch()
        if not grant.moved:
            key = aead.open_sealed(kek, grant.wrapped, wrap_aad(self.ring.user_id, grant.id, grant.scope))
            if n != 0:
                # A revocation revokes every unmoved grant with it, so a live
                # one past epoch 0 was put back from an older copy.
                raise StaleGrant()
            return Opened(KeyChain(self.ring.user_id, (key,)), True, kek)
        private = epochs.capability_private_key(kek)
        expires = self.ring.notes(grant.id).expires
        pub = aead.open_sealed(kek, grant.wrapped, cert_aad(self.ring.user_id, grant.id, grant.scope, expires))
        if pub != grant.pub or pub != bytes(private.public_key) or grant.box is None:
            raise aead.Unsealable("the grant's public key does not match its certificate")
        boxed, current = epochs.open_box(private, grant.box)
        if boxed < n:
            raise StaleGrant()
        if boxed != n:
            raise aead.Unsealable("the grant's box is from an epoch the key ring has not reached")
        return Opened(KeyChain.open(self.ring.user_id, n, current, self.ring.older_keys()), False, kek)

    def move_grant(self, grant: Grant, opened: Opened) -> bool:
        """Move an unmoved (format-1) grant to the epoch scheme: public key,
        certificate and a box of epoch 0, replacing the wrap of the store's
        key. Only while the key ring is at epoch 0 (past it an unmoved grant
        is revoked). Best effort: False when the ring cannot be written now;
        the next use tries again."""
        if grant.moved or opened.chain.epoch != 0:
            return False
        pub = bytes(epochs.capability_private_key(opened.kek).public_key)
        try:
            with write_transaction(self.ring.conn):
                if self.ring.epoch() != 0:
                    return False
                cur = self.ring.conn.execute(
                    "UPDATE grants SET wrapped = ?, pub = ?, box = ? WHERE id = ? AND wrapped = ? AND pub IS NULL",
                    (
                        aead.seal(opened.kek, pub, cert_aad(self.ring.user_id, grant.id, grant.scope)),
                        pub,
                        epochs.box_epoch(pub, 0, opened.chain.current),
                        grant.id,
                        grant.wrapped,
                    ),
                )
        except DB_ERRORS:
            return False
        return cur.rowcount == 1
