"""The audit trail (``GET /audit``): which capability did what, and when —
never what it was about. Events are kept in the user's key ring, beside the
grants they name; a store's deletion, which removes that key ring, leaves its
receipt in the data folder, where the operator finds it. Which event a route
leaves, and its detail, is declared with the route; operation.perform records
it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import Damaged
from ..crypto import aead
from ..storage.keyring import now_utc

if TYPE_CHECKING:
    from .access import Session

EVENTS = (
    "mint",
    "revoke",
    "rotate",
    "erase",
    "export",
    "config",
    "forget",
    "import",
    "create",
    "fork",
    "delete",
    "takeover",
)
RECEIPTS = Path("receipts") / "deletions.jsonl"
"""Under the data folder: one JSON line per destroyed store (the user's
digest, time, the grant that destroyed it, how many memories it held), and
per destroyed memory of a store (the same, and the memory's digest)."""


def user_digest(user_id: str) -> str:
    """How a receipt names a destroyed store: nothing left on disk spells its
    user id, yet an operator asked about one finds its line with
    ``printf 'stash/v1|deleted-user|%s' USER_ID | sha256sum``."""
    return hashlib.sha256(f"stash/v1|deleted-user|{user_id}".encode()).hexdigest()


def trail(session: Session) -> dict[str, Any]:
    """Every event, and ``trail``: whether the MAC chain holds from
    ``chained_from`` on (storage/keyring/audit_chain.py); events before that id were
    written before the chain existed and are not covered."""
    assert session.owner is not None, "an owner route's session"
    try:
        events, chain = session.keyring.trail(session.owner, session.keys)
        return {"events": events, "trail": chain.as_dict()}
    except (aead.Unsealable, ValueError, KeyError, TypeError):
        raise Damaged(
            "An audit event in the key ring was altered or moved; restore the key ring from a backup."
        ) from None


def memory_digest(user_id: str, name: str) -> str:
    """How a receipt names a destroyed memory of a store: found with
    ``printf 'stash/v1|deleted-memory|%s/%s' USER_ID NAME | sha256sum``."""
    return hashlib.sha256(f"stash/v1|deleted-memory|{user_id}/{name}".encode()).hexdigest()


def deletion_receipt(
    data_dir: Path, answer: dict[str, Any], grant_id: int, user_id: str | None = None
) -> dict[str, Any]:
    """Keep the receipt of a destroyed store (or, with ``user_id``, of the
    destroyed memory ``answer["memory"]`` of that store) where an operator
    finds it, durably (what it speaks of is gone); returns the answer with it."""
    user = user_id or answer["user_id"]
    line = {
        "user_sha256": user_digest(user),
        "at": answer.get("at") or now_utc(),
        "grant": grant_id,
        "memories": answer.get("memories"),
    }
    if user_id is not None:
        line["memory_sha256"] = memory_digest(user_id, answer["memory"])
    path = Path(data_dir) / RECEIPTS
    path.parent.mkdir(mode=0o700, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return {**answer, "receipt": str(RECEIPTS)}
