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

from pathlib import Path

from ..sqlite.pool import Pool
from .epochs import Epochs
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
    StaleGrant,
    cert_aad,
    expired,
    label_aad,
    label_key,
    now_utc,
    wrap_aad,
)
from .state_copies import HeadCopies

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
    "StaleGrant",
    "cert_aad",
    "expired",
    "label_aad",
    "label_key",
    "now_utc",
    "open_keyring",
    "wrap_aad",
]


class Keyring(Epochs, HeadCopies):
    """A user's key ring, by concern: the file and its reads (ring_file.py),
    the copies of the memory file's state (state_copies.py), owner-only data
    (owner.py), grants (grants.py), epochs and rotation (epochs.py)."""


def open_keyring(path: Path, user_id: str, pool: Pool | None = None) -> Keyring:
    """The key ring at ``path``; :class:`MissingFile` if it is not there.
    ``pool``: where its connection may be kept between requests."""
    return Keyring(path, user_id, pool=pool)
