"""A user's key ring: the grants, and the key of the current epoch sealed to each.

The key ring is plain SQLite because it has to be read before any key is
known. Nothing in it opens anything without a token's secret. A grant row holds
a keyed hash of the secret (to find the row cheaply), the capability's X25519
public key, a *certificate* (the public key sealed under the argon2id KEK of the
secret, with user, grant id and scope in the associated data, so editing the
scope or swapping the public key makes it fail), and a *box*: the current
epoch's key sealed to that public key (stash/crypto/epochs.py). The older
epochs' keys are kept in keyring_meta, sealed under the current epoch's key.
Labels, last-used days and audit events are sealed to the owner key
(stash/crypto/owner_seal.py), which no epoch key opens.

Format 1 (before epochs) held the store's one key wrapped under each KEK in
``wrapped`` and had no ``pub``/``box`` columns; such a grant is *unmoved*. Its
key is epoch 0's key, so it keeps working until a revocation, and it moves to
the new scheme the next time its token is used (the only moment its secret is
present): :meth:`Keyring.move_grant`.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from ...crypto.chain import Head
from ...crypto.epochs import KeyChain
from ...crypto.keys import KdfParams
from ...crypto.owner_seal import OwnerKeys
from ..sqlite.pool import Pool
from .audit_chain import Trail
from .epochs import Epochs
from .grants import GrantKeys
from .owner import OwnerData
from .ring_file import (
    AUDIT_PAD,
    EPOCH,
    FORMAT,
    HEAD_COPY,
    LABEL_KEY,
    LABEL_PAD,
    MEMORY_PAGES,
    OLDER_KEYS,
    OWNER_BOX,
    OWNER_NEXT,
    OWNER_PUB,
    OWNER_SEALED,
    SCOPES,
    SEALED_DAY,
    SEALED_EVENT,
    STATE_COPY,
    Grant,
    GrantNotes,
    Opened,
    RingFile,
    StaleGrant,
    cert_aad,
    expired,
    label_aad,
    label_key,
    now_utc,
    wrap_aad,
)
from .state_copies import Copies, HeadCopies

__all__ = [
    "AUDIT_PAD",
    "EPOCH",
    "FORMAT",
    "HEAD_COPY",
    "LABEL_KEY",
    "LABEL_PAD",
    "MEMORY_PAGES",
    "OLDER_KEYS",
    "OWNER_BOX",
    "OWNER_NEXT",
    "OWNER_PUB",
    "OWNER_SEALED",
    "SCOPES",
    "SEALED_DAY",
    "SEALED_EVENT",
    "STATE_COPY",
    "Grant",
    "GrantNotes",
    "Keyring",
    "Opened",
    "RingFile",
    "StaleGrant",
    "cert_aad",
    "expired",
    "label_aad",
    "label_key",
    "now_utc",
    "open_keyring",
    "wrap_aad",
]


class Keyring(RingFile):
    """A user's key ring: its file and the reads every part shares (the base,
    ring_file.py), and the parts it holds, each given that file: ``owner``
    (owner-only data, owner.py), ``grant_keys`` (grants filed, opened and
    moved, grants.py), ``epochs`` (new epochs and owner rotation, epochs.py)
    and ``head_copies`` (the copies of the memory file's state,
    state_copies.py). Its methods are the parts' public ones, passed on."""

    def __init__(
        self,
        path: Path,
        user_id: str,
        *,
        create: bool = False,
        pool: Pool | None = None,
        ring_page_bytes: int | None = None,
    ) -> None:
        super().__init__(path, user_id, create=create, pool=pool, ring_page_bytes=ring_page_bytes)
        self.owner = OwnerData(self)
        self.grant_keys = GrantKeys(self, self.owner)
        self.epochs = Epochs(self, self.grant_keys, self.owner)
        self.head_copies = HeadCopies(self)

    # Grants (grants.py)

    def add(
        self,
        *,
        scope: str,
        tag: bytes,
        secret: bytes,
        chain: KeyChain,
        kdf: KdfParams,
        expires: str | None = None,
        label: str | None = None,
    ) -> int:
        return self.grant_keys.add(
            scope=scope, tag=tag, secret=secret, chain=chain, kdf=kdf, expires=expires, label=label
        )

    def withdraw(self, grant_id: int) -> bytes | None:
        return self.grant_keys.withdraw(grant_id)

    def open_grant(self, grant: Grant, secret: bytes) -> Opened:
        return self.grant_keys.open_grant(grant, secret)

    def move_grant(self, grant: Grant, opened: Opened) -> bool:
        return self.grant_keys.move_grant(grant, opened)

    # Owner-only data (owner.py)

    def owner_keys(self, grant: Grant, kek: bytes, chain: KeyChain) -> OwnerKeys | None:
        return self.owner.owner_keys(grant, kek, chain)

    def open_owner_keys(self, grant: Grant, kek: bytes) -> OwnerKeys | None:
        return self.owner.open_owner_keys(grant, kek)

    def label(self, grant_id: int, chain: KeyChain, owner: OwnerKeys | None = None) -> str | None:
        return self.owner.label(grant_id, chain, owner)

    def last_used(self, grant_id: int, owner: OwnerKeys | None) -> str | None:
        return self.owner.last_used(grant_id, owner)

    def touch(self, grant_id: int, day: str) -> None:
        self.owner.touch(grant_id, day)

    def record(self, grant_id: int, event: str, detail: dict[str, object], chain: KeyChain | None = None) -> None:
        self.owner.record(grant_id, event, detail, chain)

    def trail(self, owner: OwnerKeys, chain: KeyChain) -> tuple[list[dict[str, object]], Trail]:
        return self.owner.trail(owner, chain)

    def events(self, owner: OwnerKeys | None = None) -> list[dict[str, object]]:
        return self.owner.events(owner)

    # Key epochs and owner rotation (epochs.py)

    def advance_epoch(
        self,
        chain: KeyChain,
        revoke: tuple[int, ...],
        *,
        mint: dict[str, Any] | None = None,
        owner: OwnerKeys | None = None,
        now: datetime | None = None,
    ) -> tuple[KeyChain, list[int], int | None]:
        return self.epochs.advance_epoch(chain, revoke, mint=mint, owner=owner, now=now)

    def rotate_owner(
        self, chain: KeyChain, old_id: int, mint: dict[str, Any], owner: OwnerKeys | None
    ) -> tuple[KeyChain, list[int], int]:
        return self.epochs.rotate_owner(chain, old_id, mint, owner)

    def retire_owner(
        self, chain: KeyChain, grant: Grant, kek: bytes, window_from: int | None = None
    ) -> tuple[KeyChain, list[int]] | None:
        return self.epochs.retire_owner(chain, grant, kek, window_from)

    def end_owner_records(self) -> None:
        self.epochs.end_owner_records()

    # The copies of the memory file's state (state_copies.py)

    def log_head(self) -> Head | None:
        return self.head_copies.log_head()

    def state_version(self) -> int | None:
        return self.head_copies.state_version()

    def erased_count(self) -> int:
        return self.head_copies.erased_count()

    def advance_head(
        self, head: Head, state_version: int | None = None, *, chain: KeyChain | None = None, erased: int | None = None
    ) -> bool:
        return self.head_copies.advance_head(head, state_version, chain=chain, erased=erased)

    def copies(self, chain: KeyChain) -> Copies:
        return self.head_copies.copies(chain)


def open_keyring(path: Path, user_id: str, pool: Pool | None = None) -> Keyring:
    """The key ring at ``path``; :class:`MissingFile` if it is not there.
    ``pool``: where its connection may be kept between requests."""
    return Keyring(path, user_id, pool=pool)
