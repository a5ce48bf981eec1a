"""What the owner does with capabilities, as answers: a capability minted
with its terms checked and the AGENTS.md block of the agent it is for; the
owner token rotated with what to update. The key work is the vault's
(access.py); this module says what the owner is handed."""

from __future__ import annotations

from datetime import UTC, datetime

from ..core.errors import Invalid
from ..storage.keyring import inbox
from ..storage.memories import MAIN
from . import grant_label_expiry, memories, onboarding
from .access import Session, Vault
from .onboarding import BAD_URL

MINTABLE = ("read", "full", "append")


def mint(
    session: Session, vault: Vault, scope: object, label: object, expires: object, address: str | None, keyed: bool
) -> dict[str, object]:
    """A new read, append or full capability. Its terms (label, expiry, for
    every scope) are checked before anything is written; ``address`` is the
    server address its AGENTS.md block names (None: the one given was
    refused); ``keyed``: the request carried an Idempotency-Key, so the
    token can be shown again to an exact retry."""
    if scope not in MINTABLE:
        raise Invalid(
            'scope must be "read", "append" or "full"; ownership is never transferable.', code="grants.bad_scope"
        )
    label = grant_label_expiry.check_label(label)
    expires = grant_label_expiry.check_expires(expires, datetime.now(UTC))
    if address is None:
        raise Invalid(BAD_URL, code="grants.bad_url")
    if session.memory_name != MAIN:
        address = f"{address.rstrip('/')}/m/{session.memory_name}"
    # The block before the grant: a mint whose block cannot be made writes nothing, rather than a live grant
    # whose token nobody was handed.
    prompt = onboarding.agents_block(address.rstrip("/"), scope)
    if scope == "append":
        grant_id, token = memories.mint_append(vault, session, label, expires)
        created = next(g.created for g in inbox.grants(session.keyring.conn) if g.id == grant_id)
    else:
        grant_id, token = vault.mint_grant(session, scope, label, expires)
        created = next(g for g in vault.list_grants(session) if g["id"] == grant_id)["created"]
    shown = (
        "shown once, and again only to an exact retry with the same Idempotency-Key within 24 hours "
        "(from a copy sealed under the owner's token); it is never stored in the clear"
        if keyed
        else "shown once and never stored"
    )
    return {
        "id": grant_id,
        "scope": scope,
        "label": label,
        "created": created,
        "expires": expires,
        "memory": session.memory_name,
        "token": token,
        "note": f"This token is {shown}; hand it to the agent it is for as STASH_TOKEN, with the block in prompt "
        f"for its AGENTS.md; revoke it with DELETE /grants/{grant_id}.",
        "prompt": prompt,
    }


def rotate(session: Session, vault: Vault) -> dict[str, object]:
    """A new owner token. The answer names the variable to update, since the
    old token now opens nothing and every shell and host that holds it must
    take the new one."""
    answer = vault.rotate_owner(session)
    answer["update"] = "STASH_TOKEN"
    answer["message"] = (
        "Update STASH_TOKEN to this token wherever the old owner token is set (this shell, your "
        "agent's environment, every host that used it): the old one opens nothing from now on."
    )
    return answer
