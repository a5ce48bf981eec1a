"""The JSON Schemas of the HTTP surface (OpenAPI 3.1 schemas are JSON Schema
2020-12): the shared component schemas and the helpers the route
declarations in :mod:`stash.web.routes` write their fields and answers with."""

from __future__ import annotations

from typing import Any

from ..core import sizes

Schema = dict[str, Any]

BLOCK_ID = r"^[0-9]+-[0-9]+$"
_LINE = r"^#([0-9]+ [0-9]{4}-[0-9]{2}-[0-9]{2}|[0-9]+-[0-9]+) "
DATE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
# One line of text (lines.py): something besides spaces, and no control character
# or line break anywhere. The limit is in UTF-8 bytes; maxLength (characters) is
# the part of it a schema can say.
_PLAIN = "[^\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]*"
ONE_LINE: Schema = {"minLength": 1, "maxLength": sizes.SIZES["ENTRY_CHARS"].high, "pattern": f"^{_PLAIN}\\S{_PLAIN}$"}


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(props: dict[str, Schema], required: list[str] | None = None, **extra: Any) -> Schema:
    """A closed object: the server refuses unknown request fields and adds
    none to its answers beyond those listed."""
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
        **extra,
    }


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def integer(lo: int | None = None, hi: int | None = None, description: str | None = None) -> Schema:
    s: Schema = {"type": "integer"}
    if lo is not None:
        s["minimum"] = lo
    if hi is not None:
        s["maximum"] = hi
    if description:
        s["description"] = description
    return s


def string(description: str | None = None, **extra: Any) -> Schema:
    s: Schema = {"type": "string", **extra}
    if description:
        s["description"] = description
    return s


SIZES_PROPS = {name: integer(s.low, s.high, f"{s.meaning} (default {s.default})") for name, s in sizes.SIZES.items()}

RUN: Schema = {
    "type": "array",
    "items": {"$ref": "#/components/schemas/Step"},
    "description": "The next steps this answer hands over, in the order its text gives them (each one "
    "`Run:` line of the text): see [Next steps](#next-steps).",
}

SCHEMAS: dict[str, Schema] = {
    "Error": obj(
        {
            "error": string("A stable dotted code, like request.unknown_field; branch on this, never on the message."),
            "message": string("One sentence for a human or an agent that says what to do next."),
        },
        description="Every refusal. Some codes add fields: see WakeRefusal, NapConflict and IndexedError; a "
        "refusal that hands over what to run carries it as data (`nap`, `run`).",
    ),
    "Step": obj(
        {
            "method": {"enum": ["GET", "POST"]},
            "path": string("The route, like `/nap`; never a query string.", pattern="^/[a-z]+$"),
            "fields": {
                "type": "object",
                "description": "The JSON body a program sends (`{}`: none), its placeholders still in it.",
            },
            "plain": nullable(
                string(
                    "The same request as a `text/plain` body, one line per line, placeholders "
                    "still in it; `null` when the step has nothing to fill in."
                )
            ),
            "placeholders": {
                "type": "array",
                "items": string(),
                "description": "The strings of `fields` and `plain` the caller replaces with its own "
                "text, like `<your line>`.",
            },
        },
        description="One next step as data. Clients render their own command from it; the curl text beside it "
        "in the answer is rendered from it too.",
    ),
    "IndexedError": obj(
        {
            "error": string(),
            "message": string(),
            "index": integer(0, description="Position in `entries` of the entry that was refused."),
        },
        description="An import refusal that names the entry at fault; nothing of the batch was written.",
    ),
    "WakeRefusal": obj(
        {
            "error": {"const": "wake.needs_nap"},
            "message": string(),
            "needs": string("The block the document needs and has no summary for.", pattern=BLOCK_ID),
            "nap": nullable(ref("Nap"))
            | {"description": "The first due compression; null for a read capability, which cannot write it."},
            "run": RUN | {"description": "The wake to run again once nothing is due; empty for a read capability."},
        },
        description="The wake cannot be rendered until the due compressions are done; `nap` is the first.",
    ),
    "ZoomRefusal": obj(
        {
            "error": {"const": "block.beyond_log"},
            "message": string(),
            "run": RUN
            | {
                "description": "A zoom that opens (the block the message suggests), or the wake when "
                "the log has no block yet."
            },
        },
        description="The block starts beyond the log; `run` is the order that helps, as memo names one.",
    ),
    "NapConflict": obj(
        {
            "error": {"const": "nap.wrong_block"},
            "message": string(),
            "due": string("The block that is due.", pattern=BLOCK_ID),
            "nap": ref("Nap"),
            "index": integer(0, description="In a batch of `summaries`: the position of the one out of order."),
        },
        required=["error", "message", "due", "nap"],
        description="A summary was sent for a block that is not the one due; in a batch, nothing was written.",
    ),
    "BlockId": string(
        "A block, inclusive at both ends: an aligned power-of-two range of at least two notes, like 0-1, 4-7, 128-255.",
        pattern=BLOCK_ID,
        examples=["16-31"],
    ),
    "Line": string(
        "A rendered line: `#i YYYY-MM-DD text` for a note, `#lo-hi text` for a summary.",
        pattern=_LINE,
        examples=["#147 2026-08-19 chose jade over chrome", "#128-143 the migration"],
    ),
    "Nap": obj(
        {
            "block": ref("BlockId") | {"description": "the block to summarise"},
            "source": {
                "type": "array",
                "items": ref("Line"),
                "minItems": 2,
                "description": "for a block of at most 16 notes, its notes as written (`#i DATE text`); "
                "for a larger block, its two halves' summaries (`#lo-hi text`)",
            },
            "remaining": integer(0, description="compressions still due after this one"),
            "max_bytes": integer(
                1, sizes.SIZES["ENTRY_CHARS"].high, "the longest summary accepted, in UTF-8 bytes (`ENTRY_CHARS`)"
            ),
            "prompt": string(
                "the instruction: OptMem's nap prompt byte for byte up to its command, then each "
                "command of `run` as a `Run:` line of its own (the nap, then the batch offer)"
            ),
            "run": RUN
            | {
                "description": "the nap (a `block text` line to fill), then, when more than one block "
                'can be written at once, the batch offer (`{"batch": k}`)'
            },
        },
        description="The due compression: write one line that summarises `source` and send it to POST /nap.",
    ),
    "BatchItem": obj(
        {
            "block": ref("BlockId"),
            "source": {
                "type": "array",
                "items": ref("Line"),
                "minItems": 2,
                "description": "What to compress, as in the nap object.",
            },
            "max_bytes": integer(1, sizes.SIZES["ENTRY_CHARS"].high, "The longest summary accepted (ENTRY_CHARS)."),
        },
        description="One block of a batch: everything it is written from is settled already.",
    ),
    "Head": obj(
        {
            "count": integer(0, description="How many notes the log holds."),
            "digest": string("The running digest after the last note: 64 hex digits.", pattern="^[0-9a-f]{64}$"),
            "state": nullable(
                integer(
                    0,
                    description="The memory file's whole-state version at the same moment: it "
                    "grows with every write of anything (notes, summaries, "
                    "config, erasures).",
                )
            ),
            "pin": string(
                "`count:digest:state`, ready to send back as the Stash-Pin header (`count:digest` is accepted too).",
                pattern="^[0-9]{1,18}:[0-9a-f]{64}(:[0-9]{1,18})?$",
            ),
        },
        description="The log's head: a keyed running digest over every note ever appended. A client that keeps "
        "it and sends it back as Stash-Pin is refused (409 store.pin_mismatch) by a log that was "
        "rolled back or replaced.",
    ),
    "Sizes": obj(SIZES_PROPS),
    "Timestamp": string("A UTC time, like 2026-08-19T14:03:07Z.", pattern="^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z$"),
    "Grant": obj(
        {
            "id": integer(1, description="the capability's number (use it to revoke); the owner's is the first"),
            "scope": {"enum": ["read", "append", "full", "owner"]},
            "memory": string("the memory it is bound to (the owner reaches every one; listed once, in main)"),
            "label": nullable(string()) | {"description": "what the owner said it is for, when minted with one"},
            "created": ref("Timestamp") | {"description": "when it was minted"},
            "expires": nullable(ref("Timestamp")) | {"description": "from when it opens nothing; `null`: never"},
            "revoked": nullable(ref("Timestamp")) | {"description": "when it was revoked"},
            "expired": {"type": "boolean", "description": "`true` once `expires` has passed"},
            "live": {"type": "boolean", "description": "`false` once revoked or expired"},
            "last_used": nullable(string(pattern=r"^\d{4}-\d{2}-\d{2}$"))
            | {
                "description": "the UTC day (`YYYY-MM-DD`) of its last authenticated request; "
                "`null` if never used since the server recorded it"
            },
            "you": {"type": "boolean", "description": "`true` for the capability making this request"},
        }
    ),
    "Unopened": obj(
        {
            "name": string("the memory's name"),
            "error": string(
                "the refusal it got, as its own routes answer it: `store.damaged` (altered, or the owner "
                "not enrolled in it), `store.rolled_back` (an older copy put back), `store.missing`, "
                "`store.unreadable`"
            ),
            "message": string("what to do next: restore it from a backup, or delete it (`DELETE /memories/{name}`)"),
        },
        description="A memory of the identity that an owner listing could not open: named, never left out, "
        "while every other memory is listed.",
    ),
    "Receipt": obj(
        {
            "receipt": integer(1, description="The receipt's number."),
            "ids": {"type": "array", "items": integer(0), "description": "The ids asked for, sorted, once each."},
            "erased": {
                "type": "array",
                "items": integer(0),
                "description": "Those erased by this call (the others were erased before).",
            },
            "dropped": integer(0, description="How many summaries were dropped with them."),
            "at": ref("Timestamp"),
            "replicas_until": ref("Timestamp")
            | {
                "description": "on a replicated host (`stash serve --replicate`), and only in the answer to the erase: "
                "when the replica's history no longer holds the erased notes (its retention after "
                "`at`); absent elsewhere"
            },
        },
        required=["receipt", "ids", "erased", "dropped", "at"],
    ),
    "SizeChanges": {
        "type": "object",
        "properties": {name: nullable(p) for name, p in SIZES_PROPS.items()},
        "additionalProperties": False,
        "minProperties": 1,
        "description": "The sizes to change; null restores a default. One bad value refuses the whole change.",
    },
}


NAP_OR_NULL = nullable(ref("Nap"))
LINES = {"type": "array", "items": ref("Line")}
CONFIG = obj({"sizes": ref("Sizes"), "defaults": ref("Sizes")})
