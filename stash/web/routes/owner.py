"""What the owner token alone may call on an identity: grants and their
revocation, key rotation, erasure and its undo, the audit trail, export
and the identity's destruction."""

from __future__ import annotations

from ...core.errors import NotFound
from ...crypto import tokens
from ...service import audit, grants, memories, undo
from ...service.access import MAIN, NAME_PATTERN, Session
from ...service.export import export_archive
from ...service.operation import Event
from ...service.ops.replica import replica_history_ends
from ..dispatch import Call
from ..fields import Field, Fields
from ..schemas import (
    SCHEMAS,
    integer,
    nullable,
    obj,
    ref,
    string,
)
from .declare import FLUSHED, NO_FIELDS, UNOPENED, Answer, Args, Declarations

OWNER = Declarations()
route = OWNER.route


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@route(
    "GET",
    "/grants",
    "owner",
    "Every capability, live and revoked; never a secret",
    fields=NO_FIELDS,
    answer=obj(
        {
            "grants": {"type": "array", "items": ref("Grant"), "description": "Oldest first, owner included."},
            "unopened": UNOPENED,
        }
    ),
    description="Every capability of every memory of the identity, live and revoked, each naming its memory. "
    "Never a token or a secret.",
)
def grants_list(s: Session, f: Args, call: Call) -> Answer:
    return memories.every_grant(call.vault, s, call.token)


@route(
    "POST",
    "/grants",
    "owner",
    "Mint a read, append or full capability; its token is shown once",
    status=201,
    fields=Fields(
        (
            Field(
                "scope",
                {"enum": ["read", "append", "full"]},
                "`read` may look; `append` may only note; `full` may also write",
                required=True,
            ),
            Field(
                "memory",
                string(pattern=f"^{NAME_PATTERN}$"),
                "the memory it is bound to (default `main`); its `prompt` names the address ending in `/m/{name}`",
            ),
            Field(
                "label",
                string(minLength=1),
                "what it is for: 1 to 64 bytes of printable text (no control or "
                "separator character; surrounding spaces removed)",
            ),
            Field(
                "expires",
                string(),
                "an RFC 3339 time in UTC after now, like `2027-01-31T18:00:00Z`; from then "
                "on the token is refused like a revoked one",
            ),
            Field(
                "url",
                string(maxLength=2000, pattern="^https?://"),
                "the address written into `prompt`, as for `POST /init`. Default: the server's `--url`, else the "
                "address this request was made to",
            ),
        )
    ),
    answer=obj(
        {
            "id": integer(1),
            "scope": {"enum": ["read", "append", "full"]},
            "label": nullable(string()),
            "memory": string("the memory it is bound to"),
            "created": ref("Timestamp"),
            "expires": nullable(ref("Timestamp")),
            "token": string("The new capability. Shown once, never stored.", pattern=f"^{tokens.TOKEN_PATTERN}$"),
            "note": string("what to do with the token"),
            "prompt": string(
                "the block for the AGENTS.md of the agent the capability is for: `skill/AGENTS.md` for "
                "`full`; for `read`, `skill/AGENTS-read.md`, which says the capability is read-only "
                "and has no note or nap section"
            ),
        }
    ),
    errors=("grants.busy", "grants.bad_scope", "grants.bad_label", "grants.bad_expires", "grants.bad_url"),
    description="Mints a capability over this memory: the current key epoch's key sealed to a key pair "
    "derived from a fresh secret. Owner is never transferable: no route mints an owner capability.",
    record="keyring",
    event=Event("mint", lambda s, f, a: {"grant": a["id"], "scope": a["scope"], "memory": s.memory_name}),
    memory_from="memory",
)
def grants_mint(s: Session, f: Args, call: Call) -> Answer:
    return grants.mint(
        s,
        call.vault,
        f["scope"],
        f.get("label"),
        f.get("expires"),
        call.block_address(f.get("url")),
        keyed=call.key is not None,
    )


@route(
    "DELETE",
    "/grants/{grant_id}",
    "owner",
    "Revoke one capability: a new key epoch it never reaches",
    path_params=(("grant_id", integer(1, description="The `id` from GET /grants.")),),
    answer=obj(
        {
            "id": integer(1),
            "scope": {"enum": ["read", "append", "full"]},
            "revoked": ref("Timestamp"),
            "already": {"type": "boolean", "description": "True when it was revoked before this call."},
            "also_revoked": {
                "type": "array",
                "items": integer(1),
                "description": "Capabilities that had not moved to key epochs (not used since "
                "the upgrade) and end with this revocation.",
            },
            "epoch": integer(0, description="The store's key epoch after this call."),
            "flushed": FLUSHED,
        }
    ),
    errors=("grants.unknown", "grants.owner", "grants.busy"),
    description="Revokes one capability: destroys its key columns (its listing row stays) and starts a new "
    "key epoch that only the other live capabilities reach, so nothing written from now on opens "
    "with it, whatever copies of the files it is given. Revoking a revoked capability answers 200 "
    "with `already: true`.",
    record="keyring",
    cleanup="epoch",
    unknown=lambda: NotFound("No such capability; list them with GET /grants.", code="grants.unknown"),
    event=Event("revoke", lambda s, f, a: None if a["already"] else {"grant": f["grant_id"], "memory": s.memory_name}),
    memory_of=lambda vault, user, f: memories.memory_of_grant(vault, user, f["grant_id"]),
)
def grants_revoke(s: Session, f: Args, call: Call) -> Answer:
    revoked: Answer = call.vault.revoke_grant(s, f["grant_id"])
    return revoked


@route(
    "POST",
    "/rotate",
    "owner",
    "A new owner token; its first use ends the old one as a revocation does",
    fields=NO_FIELDS,
    answer=obj(
        {
            "id": integer(1, description="The new owner capability."),
            "scope": {"const": "owner"},
            "created": ref("Timestamp"),
            "token": string("The new owner token. Shown once, never stored.", pattern=f"^{tokens.TOKEN_PATTERN}$"),
            "retires": integer(
                1,
                description="The owner capability (the caller) that the new token's "
                "first use ends, as a revocation does.",
            ),
            "also_revoked": {
                "type": "array",
                "items": integer(1),
                "description": "Capabilities ended now: the successor of an earlier rotation "
                "that was never used, and those that had not moved to key epochs.",
            },
            "epoch": integer(0, description="The key epoch now; the new token's first use starts the next."),
            "note": string(),
            "update": {
                "const": "STASH_TOKEN",
                "description": "The environment variable to set to `token` wherever the old owner token is set.",
            },
            "message": string("What to do next: update `STASH_TOKEN` everywhere the old token is set."),
            "flushed": FLUSHED,
        }
    ),
    errors=("grants.busy",),
    description="Rotates the owner token: a new owner capability, and the calling one ends as a revoked one "
    "does (a new key epoch, in every memory) at the new token's first use, so a lost answer never "
    "leaves the owner without a working token. Until then the old token is still the owner; what it "
    "mints meanwhile ends at that first use too, and a memory it creates or forks meanwhile passes "
    "to the new token (an audit `takeover` event in it and in main). A read or full capability is "
    "rotated by minting a new one and revoking the old.",
    record="rotation",
    cleanup="epoch",
    event=Event("rotate", lambda s, f, a: {"new_grant": a["id"], "epoch": a["epoch"]}),
)
def rotate(s: Session, f: Args, call: Call) -> Answer:
    return grants.rotate(s, call.vault)


@route(
    "POST",
    "/erase",
    "owner",
    "Shred individual notes for good; answers a receipt",
    fields=Fields(
        (
            Field(
                "ids",
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 10_000,
                    "items": integer(0, description="A note id, below T."),
                },
                "the notes to erase, each `0 ≤ id < T`; duplicates are allowed",
                required=True,
            ),
        )
    ),
    answer=obj(
        {**SCHEMAS["Receipt"]["properties"], "flushed": FLUSHED}, required=[*SCHEMAS["Receipt"]["required"], "flushed"]
    ),
    errors=("erase.bad_ids", "erase.unknown_id"),
    description="Shreds notes for good: each one's key is destroyed, its line stays as `[erased]` with "
    "its date, and only the summaries that contain one of them are dropped: the blocks on its path "
    "to the root, at most one per level (the next naps rewrite them). Answers a receipt.",
    record="memory",
    cleanup="memory",
    event=Event(
        "erase", lambda s, f, a: {"receipt": a["receipt"], "erased": len(a["erased"]), "dropped": a["dropped"]}
    ),
)
def erase(s: Session, f: Args, call: Call) -> Answer:
    receipt = s.open_memory().erase(f["ids"])
    if call.replicating:
        receipt["replicas_until"] = replica_history_ends(receipt["at"])
    return receipt


@route(
    "POST",
    "/erase/undo",
    "owner",
    "Undo a capability: erase what it wrote, or a range, a slice at a time",
    fields=Fields(
        (
            Field(
                "grant",
                integer(1, description="A capability's `id` from GET /grants."),
                "erase only the notes this capability wrote (live or revoked)",
            ),
            Field(
                "first",
                integer(0),
                "the first id of the range (default 0); send the answer's `more` here for the next slice",
            ),
            Field(
                "last",
                integer(0),
                "the last id of the range, inclusive (default: the newest); without `grant` "
                "it is required, so the whole log is never a default",
            ),
        )
    ),
    answer=obj(
        {
            "receipt": nullable(
                integer(
                    1, description="The erasure's receipt (GET /erasures); null when this slice held nothing to erase."
                )
            ),
            "ids": {"type": "array", "items": integer(0), "description": "The ids this slice erased."},
            "erased": {"type": "array", "items": integer(0), "description": "Those erased by this call."},
            "dropped": integer(0, description="How many summaries were dropped with them."),
            "at": nullable(ref("Timestamp")),
            "more": nullable(
                integer(
                    0,
                    description="Send it as `first`, with the same other fields, for the "
                    "next slice; null when the range is done.",
                )
            ),
            "message": string("what was done and what to send next"),
            "replicas_until": ref("Timestamp") | {"description": "as in POST /erase"},
            "flushed": FLUSHED,
        },
        required=["receipt", "ids", "erased", "dropped", "at", "more", "message", "flushed"],
    ),
    errors=("undo.bad_range", "grants.unknown"),
    description="The owner's way back after a capability wrote what it should not have: erases, as POST /erase "
    "does, the notes of the range `first`..`last` that `grant` wrote (every one of them without "
    "`grant`), at most 10,000 per call and looking at most 100,000 ids. Erased notes need no nap "
    "and do not count against `--quota-memories`, so once `more` is null the wake and the quota "
    "are as if they had never been written. Revoke the capability first (DELETE /grants/{id}).",
    record="memory",
    cleanup="memory",
    event=Event(
        "erase",
        lambda s, f, a: (
            None
            if a["receipt"] is None
            else {"receipt": a["receipt"], "erased": len(a["erased"]), "dropped": a["dropped"]}
        ),
    ),
    # At the root, what a capability wrote is undone in the memory it is bound to; a range, in main.
    unknown=lambda: NotFound("No such capability; list them with GET /grants.", code="grants.unknown"),
    memory_of=lambda vault, user, f: (
        memories.memory_of_grant(vault, user, f["grant"]) if _whole(f.get("grant")) else MAIN
    ),  # a grant that is no id is undo's to refuse
)
def erase_undo(s: Session, f: Args, call: Call) -> Answer:
    answer = undo.undo(s.open_memory(), f.get("grant"), f.get("first"), f.get("last"), memories.grant_ids(s))
    if call.replicating and answer["at"] is not None:
        answer["replicas_until"] = replica_history_ends(answer["at"])
    return answer


@route(
    "GET",
    "/erasures",
    "owner",
    "Erasure receipts, never content",
    fields=NO_FIELDS,
    answer=obj({"erasures": {"type": "array", "items": ref("Receipt")}}),
    description="Every erasure receipt, oldest first. Never any content.",
)
def erasures(s: Session, f: Args, call: Call) -> Answer:
    return s.open_memory().erasures()


@route(
    "GET",
    "/audit",
    "owner",
    "Who did what and when, never content",
    fields=NO_FIELDS,
    answer=obj(
        {
            "events": {
                "type": "array",
                "items": obj(
                    {
                        "id": integer(1),
                        "at": ref("Timestamp"),
                        "grant": integer(1, description="The capability that did it (see GET /grants)."),
                        "event": {"enum": list(audit.EVENTS)},
                        "detail": {
                            "type": "object",
                            "description": "Numbers, block ids and size names only; never content.",
                        },
                        "memory": string("the memory it touched (each memory numbers its own events from 1)"),
                    }
                ),
            },
            "trail": obj(
                {
                    "intact": {
                        "type": "boolean",
                        "description": "True when, in every memory, every event from `chained_from` "
                        "on is linked to the one before it by its MAC and the last is the one that memory's key ring's "
                        "audit head records: none was deleted, inserted, altered or reordered. False: a key ring was "
                        "edited; the events are still listed, but are not the trail as written.",
                    },
                    "chained_from": nullable(
                        integer(
                            1,
                            description="The first event of memory main the chain covers; earlier "
                            "ones were written before the chain existed (an earlier "
                            "release).",
                        )
                    ),
                    "problem": nullable(string("What broke a chain, and in which memory, when one is broken.")),
                }
            ),
            "unopened": UNOPENED,
        }
    ),
    description="The audit trail of every memory of the identity, oldest first: which capability minted, "
    "revoked, rotated, erased, exported, changed the config, forgot or imported, in which memory, "
    "and when, and whether each memory's MAC chain holds (`trail.intact`). Never the text of a note.",
)
def audit_trail(s: Session, f: Args, call: Call) -> Answer:
    return memories.every_event(call.vault, s, call.token)


@route(
    "DELETE",
    "/store",
    "owner",
    "Destroy the whole identity; answers a receipt",
    fields=NO_FIELDS,
    answer=obj(
        {
            "user_id": string(pattern="^[0-9a-f]{16}$"),
            "destroyed": {"const": True},
            "memories": nullable(integer(0, description="How many notes the log of memory `main` held.")),
            "at": ref("Timestamp"),
            "receipt": string(
                "Where, under the server's data folder, the operator finds this receipt (receipts/deletions.jsonl)."
            ),
        }
    ),
    description="Destroys the whole identity: every memory's wrapped keys and files. Every token of it stops "
    "working at once. There is no undo.",
)
def destroy(s: Session, f: Args, call: Call) -> Answer:
    grant_id = s.grant_id
    return audit.deletion_receipt(call.vault.data_dir, call.vault.destroy_store(s), grant_id)


@route(
    "GET",
    "/export",
    "owner",
    "The whole memory as an OptMem-readable tar.gz",
    slow=True,
    fields=NO_FIELDS,
    media="application/gzip",
    description="A tar.gz holding memory/LOG.txt, memory/TREE/<size>, memory/config and README.txt, "
    "readable by OptMem with MEMORY_DIR=memory, and manifest.json: counts, the SHA-256 of every "
    "other member and one digest over them (GET /reference, Export archive).",
    event=Event("export", lambda s, f, a: {"memories": s.open_memory().count()}),
    headers=(("Content-Disposition", 'attachment; filename="optmem-memory.tar.gz"'),),
)
def export(s: Session, f: Args, call: Call) -> bytes:
    return export_archive(s.open_memory())
