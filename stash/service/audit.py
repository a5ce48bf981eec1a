"""The audit trail (``GET /audit``): which capability did what, and when —
never what it was about. Events are kept in the user's key ring, beside the
grants they name; a store's deletion, which removes that key ring, leaves its
receipt in the data folder, where the operator finds it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..core.errors import Damaged
from ..crypto import aead
from ..storage.keyring import now_utc
from . import idempotency

EVENTS = ("mint", "revoke", "rotate", "erase", "export", "config", "forget", "import")
RECEIPTS = Path("receipts") / "deletions.jsonl"
"""Under the data folder: one JSON line per destroyed store (the user's
digest, time, the grant that destroyed it, how many memories it held)."""


def user_digest(user_id: str) -> str:
    """How a receipt names a destroyed store: nothing left on disk spells its
    user id, yet an operator asked about one finds its line with
    ``printf 'stash/v1|deleted-user|%s' USER_ID | sha256sum``."""
    return hashlib.sha256(f"stash/v1|deleted-user|{user_id}".encode()).hexdigest()


def record(session, event: str, **detail: object) -> None:
    """Append ``event`` done by the session's capability. ``detail`` holds
    numbers, block ids and size names only, never memory text."""
    if event not in EVENTS:
        raise ValueError(f"unknown audit event {event}")
    session.keyring.record(session.grant_id, event, detail)


def trail(session) -> dict:
    try:
        return {"events": session.keyring.events(session.owner)}
    except (aead.Unsealable, ValueError, KeyError, TypeError):
        raise Damaged("An audit event in the key ring was altered or moved; restore the key ring from a "
                      "backup.") from None


def deletion_receipt(data_dir: Path, answer: dict, grant_id: int) -> dict:
    """Keep the receipt of a destroyed store where an operator finds it,
    durably (the store it speaks of is gone); returns the answer with it."""
    line = {"user_sha256": user_digest(answer["user_id"]), "at": answer.get("at") or now_utc(), "grant": grant_id,
            "memories": answer.get("memories")}
    path = Path(data_dir) / RECEIPTS
    path.parent.mkdir(mode=0o700, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return {**answer, "receipt": str(RECEIPTS)}


# ---------------------------------------------------------------- the audited operations
# Each does one route's work and records its event; a refusal records nothing.


def forget(session, block: object) -> dict:
    answer = session.memory.forget(block)
    record(session, "forget", block=answer["dropped"][0], dropped=len(answer["dropped"]))
    return answer


def set_config(session, changes: object) -> dict:
    answer = session.memory.set_config(changes)
    record(session, "config", names=sorted(changes) if isinstance(changes, dict) else [])
    return answer


def import_entries(session, entries: object) -> dict:
    answer = session.memory.import_entries(entries)
    record(session, "import", first=answer["first"], last=answer["last"])
    return answer


def erase(session, ids: object, key: str | None = None) -> idempotency.Answer:
    """The erasure commits whole (with its Idempotency-Key record), then its
    cleanup runs: the WAL is flushed (files.flush), and ``flushed`` says
    whether that is done. A resend with the same key answers the same
    receipt and tries the flush again."""
    def work() -> dict:
        return session.memory.erase(ids, now_utc())

    answer = idempotency.memory_write(session, key, "POST /erase", {"ids": ids}, work)
    if not answer.replayed:
        body = answer.body
        record(session, "erase", receipt=body["receipt"], erased=len(body["erased"]), dropped=body["dropped"])
    return idempotency.Answer({**answer.body, "flushed": session.flush_memory()}, answer.replayed)


def export(session, build) -> bytes:
    archive = build(session.memory)
    record(session, "export", memories=session.memory.mf.count())
    return archive


def revoke(session, vault, grant_id: int, key: str | None = None) -> idempotency.Answer:
    """The revocation commits in the key ring whole, with its event and its
    Idempotency-Key record; then the memory file is re-sealed and the key
    ring flushed (Vault.finish_epoch), ``flushed`` saying whether that is done."""
    def work() -> dict:
        answer = vault.revoke_grant(session, grant_id)
        if not answer["already"]:
            record(session, "revoke", grant=grant_id)
        return answer

    answer = idempotency.keyring_write(session, key, f"DELETE /grants/{grant_id}", {}, work)
    return idempotency.Answer({**answer.body, "flushed": vault.finish_epoch(session)}, answer.replayed)


def rotate(session, vault, key: str | None = None) -> idempotency.Answer:
    """A new owner token; recorded against the old owner grant that asked, in
    the transaction that moves the epoch, with the answer's sealed copy for a
    resend (idempotency.rotation_write). The answer names the variable to
    update, since the old token now opens nothing and every shell and host
    that holds it must take the new one."""
    grant_id = session.grant_id

    def work() -> dict:
        answer = vault.rotate_owner(session)
        session.keyring.record(grant_id, "rotate", {"new_grant": answer["id"], "epoch": answer["epoch"]})
        answer["update"] = "STASH_TOKEN"
        answer["message"] = ("Update STASH_TOKEN to this token wherever the old owner token is set (this shell, "
                             "your agent's environment, every host that used it): the old one opens nothing from "
                             "now on.")
        return answer

    answer = idempotency.rotation_write(session, key, work)
    return idempotency.Answer({**answer.body, "flushed": vault.finish_epoch(session)}, answer.replayed)


def destroy(session, vault, data_dir: Path) -> dict:
    grant_id = session.grant_id
    return deletion_receipt(data_dir, vault.destroy_store(session), grant_id)
