"""The OpenAPI 3.1 document served at ``GET /openapi.json``.

Paths, methods, scopes and summaries come from the ROUTES table itself, so a
route cannot exist without appearing here. What a table of handlers cannot say
— request fields, answer shapes, the error codes each route can return — is
written below, one entry per route, from the code of the handlers and the
service layer (and kept in step with API-REFERENCE.md).
"""

from __future__ import annotations

from typing import Any

from ..core import sizes
from ..core.blocks import BATCH_MAX
from ..core.recall import MAX_PATTERN_BYTES
from ..crypto import tokens
from ..service import idempotency
from .jsonio import BODY_CAP, IMPORT_BODY_CAP, NAP_BODY_CAP

Schema = dict[str, Any]

_BLOCK_ID = r"^[0-9]+-[0-9]+$"
_LINE = r"^#([0-9]+ [0-9]{4}-[0-9]{2}-[0-9]{2}|[0-9]+-[0-9]+) "
_DATE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
_SECURED = ("read", "full", "owner")
# One line of text (lines.py): something besides spaces, and no control character
# or line break anywhere. The limit is in UTF-8 bytes; maxLength (characters) is
# the part of it a schema can say.
_PLAIN = "[^\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]*"
_ONE_LINE = {"minLength": 1, "maxLength": sizes.SIZES["ENTRY_CHARS"].high, "pattern": f"^{_PLAIN}\\S{_PLAIN}$"}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(props: dict[str, Schema], required: list[str] | None = None, **extra: Any) -> Schema:
    """A closed object: the server refuses unknown request fields and adds
    none to its answers beyond those listed."""
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False, **extra}


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def _int(lo: int | None = None, hi: int | None = None, description: str | None = None) -> Schema:
    s: Schema = {"type": "integer"}
    if lo is not None:
        s["minimum"] = lo
    if hi is not None:
        s["maximum"] = hi
    if description:
        s["description"] = description
    return s


def _str(description: str | None = None, **extra: Any) -> Schema:
    s: Schema = {"type": "string", **extra}
    if description:
        s["description"] = description
    return s


_SIZES_PROPS = {
    name: _int(s.low, s.high, f"{s.meaning} (default {s.default})") for name, s in sizes.SIZES.items()
}

SCHEMAS: dict[str, Schema] = {
    "Error": _obj(
        {
            "error": _str("A stable dotted code, like request.unknown_field; branch on this, never on the message."),
            "message": _str("One sentence for a human or an agent that says what to do next."),
        },
        description="Every refusal. Some codes add fields: see WakeRefusal, NapConflict and IndexedError.",
    ),
    "IndexedError": _obj(
        {
            "error": _str(),
            "message": _str(),
            "index": _int(0, description="Position in `entries` of the entry that was refused."),
        },
        description="An import refusal that names the entry at fault; nothing of the batch was written.",
    ),
    "WakeRefusal": _obj(
        {
            "error": {"const": "wake.needs_nap"},
            "message": _str(),
            "needs": _str("The block the document needs and has no summary for.", pattern=_BLOCK_ID),
            "nap": _nullable(_ref("Nap")) | {"description": "The first due compression; null for a read "
                                                           "capability, which cannot write it."},
        },
        description="The wake cannot be rendered until the due compressions are done; `nap` is the first.",
    ),
    "NapConflict": _obj(
        {
            "error": {"const": "nap.wrong_block"},
            "message": _str(),
            "due": _str("The block that is due.", pattern=_BLOCK_ID),
            "nap": _ref("Nap"),
            "index": _int(0, description="In a batch of `summaries`: the position of the one out of order."),
        },
        required=["error", "message", "due", "nap"],
        description="A summary was sent for a block that is not the one due; in a batch, nothing was written.",
    ),
    "BlockId": _str("A block, inclusive at both ends: an aligned power-of-two range of at least two memories, "
                    "like 0-1, 4-7, 128-255.", pattern=_BLOCK_ID, examples=["16-31"]),
    "Line": _str("A rendered line: `#i YYYY-MM-DD text` for a memory, `#lo-hi text` for a summary.",
                 pattern=_LINE, examples=["#147 2026-08-19 chose jade over chrome", "#128-143 the migration"]),
    "Nap": _obj(
        {
            "block": _ref("BlockId"),
            "source": {"type": "array", "items": _ref("Line"), "minItems": 2,
                       "description": "What to compress: the raw memories for a block of at most 16, "
                                      "otherwise its two halves' summaries."},
            "remaining": _int(0, description="Compressions still due after this one."),
            "max_bytes": _int(1, sizes.SIZES["ENTRY_CHARS"].high,
                              "The longest summary accepted, in UTF-8 bytes (ENTRY_CHARS)."),
            "prompt": _str("The instruction, ending with the command that answers it."),
        },
        description="The due compression: write one line that summarises `source` and send it to POST /nap.",
    ),
    "BatchItem": _obj(
        {
            "block": _ref("BlockId"),
            "source": {"type": "array", "items": _ref("Line"), "minItems": 2,
                       "description": "What to compress, as in the nap object."},
            "max_bytes": _int(1, sizes.SIZES["ENTRY_CHARS"].high, "The longest summary accepted (ENTRY_CHARS)."),
        },
        description="One block of a batch: everything it is written from is settled already.",
    ),
    "Head": _obj(
        {
            "count": _int(0, description="How many memories the log holds."),
            "digest": _str("The running digest after the last memory: 64 hex digits.", pattern="^[0-9a-f]{64}$"),
            "state": _nullable(_int(0, description="The memory file's whole-state version at the same moment: it "
                                                   "grows with every write of anything (memories, summaries, "
                                                   "config, erasures).")),
            "pin": _str("`count:digest:state`, ready to send back as the Stash-Pin header (`count:digest` is "
                        "accepted too).", pattern="^[0-9]{1,18}:[0-9a-f]{64}(:[0-9]{1,18})?$"),
        },
        description="The log's head: a keyed running digest over every memory ever appended. A client that keeps "
                    "it and sends it back as Stash-Pin is refused (409 store.pin_mismatch) by a log that was "
                    "rolled back or replaced.",
    ),
    "Sizes": _obj(_SIZES_PROPS),
    "Timestamp": _str("A UTC time, like 2026-08-19T14:03:07Z.", pattern="^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z$"),
    "Grant": _obj({
        "id": _int(1, description="The capability's number; the owner's is the first."),
        "scope": {"enum": ["read", "full", "owner"]},
        "label": _nullable(_str("What the owner said it is for (1-64 bytes of printable text).")),
        "created": _ref("Timestamp"),
        "expires": _nullable(_ref("Timestamp")) | {"description": "When it stops opening anything; null: never."},
        "revoked": _nullable(_ref("Timestamp")),
        "expired": {"type": "boolean", "description": "True once `expires` has passed."},
        "live": {"type": "boolean", "description": "False once revoked or expired."},
        "last_used": _nullable(_str("The UTC day of its last authenticated request.", pattern=r"^\d{4}-\d{2}-\d{2}$")),
        "you": {"type": "boolean", "description": "True for the capability that made this request."},
    }),
    "Receipt": _obj({
        "receipt": _int(1, description="The receipt's number."),
        "ids": {"type": "array", "items": _int(0), "description": "The ids asked for, sorted, once each."},
        "erased": {"type": "array", "items": _int(0), "description": "Those erased by this call (the others "
                                                                        "were erased before)."},
        "dropped": _int(0, description="How many summaries were dropped with them."),
        "at": _ref("Timestamp"),
    }),
    "SizeChanges": {
        "type": "object",
        "properties": {name: _nullable(p) for name, p in _SIZES_PROPS.items()},
        "additionalProperties": False,
        "minProperties": 1,
        "description": "The sizes to change; null restores a default. One bad value refuses the whole change.",
    },
}

_NAP_OR_NULL = _nullable(_ref("Nap"))
_LINES = {"type": "array", "items": _ref("Line")}


class R:
    """What one route takes and answers, beyond what its RouteSpec says."""

    def __init__(
        self,
        answer: Schema | None = None,
        *,
        status: int = 200,
        media: str = "application/json",
        query: dict[str, tuple[Schema, bool]] | None = None,
        path: dict[str, Schema] | None = None,
        body: Schema | None = None,
        body_required: bool = False,
        body_cap: str = "max_body",  # the Settings field that caps this route's body
        errors: dict[int, list[str]] | None = None,
        special: dict[int, tuple[str, str, list[str]]] | None = None,
        description: str = "",
        idempotent: bool = False,
    ) -> None:
        self.answer = answer
        self.idempotent = idempotent  # takes an Idempotency-Key header
        self.status = status
        self.media = media
        self.query = query  # name -> (schema, required); None: the query string is not read
        self.path = path or {}
        self.body = body  # None: the body is not read
        self.body_required = body_required
        self.body_cap = body_cap
        self.errors = errors or {}
        # status -> (words, schema name, codes) for refusals that carry extra fields
        self.special = special or {}
        self.description = description


def _twins(path: str, fields: dict[str, Schema], required: tuple[str, ...], answer: Schema,
           errors: dict[int, list[str]], description: str, **kw: Any) -> dict[tuple[str, str], R]:
    """A read-only route and its POST twin: the same fields, as query or JSON body."""
    query = {name: (schema, name in required) for name, schema in fields.items()}
    return {
        ("GET", path): R(answer, query=query, errors=errors, description=description, **kw),
        ("POST", path): R(answer, body=_obj(fields, required=list(required)), body_required=bool(required),
                          errors=errors,
                          description=description + " POST twin of the GET route: the same fields as a JSON body.",
                          **kw),
    }


_MISSING = {400: ["request.missing_field"]}
_TEXT_CODES = ["text.type", "text.multiline", "text.control", "text.bidi", "text.invisible", "text.empty",
               "text.too_long"]
_IMPORT_INDEXED = ["import.bad_entry", "import.bad_date", "import.out_of_order", "import.before_log", *_TEXT_CODES]
_CONFIG = _obj({"sizes": _ref("Sizes"), "defaults": _ref("Sizes")})

SPECS: dict[tuple[str, str], R] = {
    **_twins(
        "/health",
        {"ready": _int(0, 1, "1: also probe readiness (create, write, sync and remove a file in the data folder). "
                             "Default 0: liveness only.")},
        (),
        _obj({"ok": {"const": True}, "version": _str(),
              "content_cipher": {"const": "xchacha20-poly1305"},
              "file_cipher": {"enum": ["sqlcipher", "none"]},
              "ready": {"enum": [True, None], "description": "true with ready=1 (the data folder can be written); "
                                                            "null when readiness was not asked."}}),
        {422: ["request.bad_value"], 503: ["ready.unwritable"]},
        "Liveness: 200 whenever the process serves HTTP. With ready=1, readiness for a load balancer: "
        "503 when the data folder cannot be written (full disk, read-only mount, folder gone).",
    ),
    ("POST", "/init"): R(
        _obj({
            "user_id": _str("Public id of the new memory.", pattern="^[0-9a-f]{16}$"),
            "token": _str("The owner capability. Shown once, never stored: the only key to this memory.",
                          pattern=f"^{tokens.TOKEN_PATTERN}$"),
            "content_cipher": {"const": "xchacha20-poly1305"},
            "file_cipher": {"enum": ["sqlcipher", "none"]},
            "note": _str("What to do with the token."),
            "prompt": _str("The block to paste into AGENTS.md, with the server's address filled in."),
        }),
        status=201,
        body=_obj({
            "url": _str("The address written into `prompt` (http:// or https://, at most 2000 characters). "
                        "Default: the server's --url, else the address this request was made to.", maxLength=2000,
                        pattern="^https?://"),
            "invite": _str("The operator's invite secret; needed when the server runs with --init invite."),
        }, required=[]),
        errors={403: ["init.disabled", "init.invite_required"], 422: ["init.bad_url", "request.bad_value"],
                429: ["rate_limited", "quota.identities"], 503: ["store.read_only", "store.unreadable"],
                507: ["store.full"]},
        description="Mints an identity: a new, empty memory and its owner token.",
    ),
    **_twins(
        "/wake", {
            "part": _int(1, description="Which part to read, from 1 (default 1)."),
            "T": _int(0, description="The snapshot to cut parts from: the `T` of part 1 (default: the log now)."),
        }, (),
        _obj({
            "T": _int(0, description="The snapshot this part was rendered from."),
            "part": _int(1), "parts": _int(1),
            "lines": _LINES,
            "awake": {"type": "boolean", "description": "True on the last part only."},
            "nap": _NAP_OR_NULL | {"description": "The due compression, if any; only ever on the last part."},
            "next": _nullable(_str("The command that fetches the next part; null on the last part.")),
            "message": _str("`You are awake.` on the last part, otherwise how to go on."),
            "head": _ref("Head") | {"description": "The log's head now (not at `T`): pin it."},
        }),
        {422: ["request.bad_value", "wake.bad_t", "wake.no_part"]},
        "The bounded, hierarchical read of the whole log, cut into parts. Refused (409) only when the document "
        "needs a summary that is not written yet.",
        special={409: ("a summary the document needs is not written yet", "WakeRefusal", ["wake.needs_nap"])},
    ),
    ("POST", "/note"): R(
        _obj({"id": _int(0, description="The new memory's position in the log."), "nap": _NAP_OR_NULL,
              "head": _ref("Head") | {"description": "The log's head just after this memory: pin it."}}),
        idempotent=True,
        body=_obj({"text": _str("One line of at most ENTRY_CHARS UTF-8 bytes, no control character; "
                                "surrounding spaces are removed.", **_ONE_LINE)}),
        body_required=True,
        errors={400: ["request.empty_body", "request.missing_field"], 403: ["quota.memories", "quota.bytes"],
                422: _TEXT_CODES},
        description="Appends one memory dated with the server's UTC day. `nap` is the compression now due, if any.",
    ),
    ("POST", "/nap"): R(
        {"anyOf": [
            _obj({"saved": _nullable(_ref("BlockId")) | {"description": "The block saved; null when nothing was "
                                                                        "written."},
                  "nap": _NAP_OR_NULL | {"description": "What is due now (after saving, if something was saved)."},
                  "message": _str()}, description="The answer to {} or {block, text}."),
            _obj({"saved": {"type": "null"},
                  "nap": _NAP_OR_NULL | {"description": "The first pending block."},
                  "batch": {"type": "array", "maxItems": BATCH_MAX, "items": _ref("BatchItem"),
                            "description": "The due blocks that can be written at once, in settling order."},
                  "prompt": _nullable(_str("The instruction, ending with the command that settles them all.")),
                  "message": _str()}, description="The answer to {batch: k}."),
            _obj({"saved": {"type": "array", "maxItems": BATCH_MAX, "items": _ref("BlockId"),
                            "description": "The blocks this request wrote, in order."},
                  "nap": _NAP_OR_NULL | {"description": "What is due now."},
                  "message": _str()}, description="The answer to {summaries: [...]}."),
        ]},
        idempotent=True,
        body=_obj({"block": _ref("BlockId"),
                   "text": _str("The summary: one line of at most ENTRY_CHARS bytes.", **_ONE_LINE),
                   "batch": _int(1, BATCH_MAX, "List up to this many due blocks that can be written at once."),
                   "summaries": {"type": "array", "minItems": 1, "maxItems": BATCH_MAX,
                                 "items": _obj({"block": _ref("BlockId"),
                                                "text": _str("One line of at most ENTRY_CHARS bytes.", **_ONE_LINE)}),
                                 "description": "Summaries to settle in order, all or nothing."}},
                  required=[]),
        errors={422: ["nap.missing_block", "nap.mixed", "nap.bad_batch", "nap.bad_summaries", "block.invalid",
                      "block.beyond_log", *_TEXT_CODES]},
        special={409: ("the block sent is not the one due", "NapConflict", ["nap.wrong_block"])},
        body_cap="max_nap_body",
        description="An empty body or {} asks what is due; {block, text} settles the due block; {batch: k} lists up "
                    "to k due blocks that can be written at once; {summaries: [...]} settles them in order, all or "
                    "nothing. A block that is already settled answers 200 and writes nothing.",
    ),
    **_twins(
        "/recall", {"q": _str(f"A regular expression: RE2 syntax, always case-insensitive; 1 to "
                              f"{MAX_PATTERN_BYTES} UTF-8 bytes.", minLength=1, maxLength=MAX_PATTERN_BYTES),
                     "before": _int(0, description="Search only the memories before this id: the `more` of the "
                                                   "previous page (default: the whole log).")}, ("q",),
        _obj({"matches": {**_LINES, "description": "The newest matching memories that fit PART_CHARS bytes, "
                                                   "oldest first."},
              "total": _int(0, description="How many memories match in the range searched (the whole log, or "
                                           "those before `before`)."),
              "more": _nullable(_int(0, description="The `before` of the next older page: the id of the oldest "
                                                    "match shown, when older ones were left out.")),
              "message": _str("The count line (`15 matches.`, `1 match.`, `No match.`), and when the answer was "
                              "cut, the command that fetches the older matches.")}),
        {**_MISSING, 422: ["recall.bad_pattern", "recall.too_slow", "request.bad_value"]},
        "Searches the verbatim log (never the summaries), each memory rendered as `#i DATE text`. A search that "
        "runs past its time bound (5 s plus 10 µs per memory) is refused with recall.too_slow.",
    ),
    **_twins(
        "/zoom", {"block": _ref("BlockId")}, ("block",),
        _obj({"block": _ref("BlockId"), "lines": {**_LINES, "minItems": 1, "maxItems": 2}}),
        {**_MISSING, 422: ["block.invalid", "block.beyond_log"]},
        "The block's two halves as the wake would show them; a half wholly beyond the log is omitted.",
    ),
    ("POST", "/forget"): R(
        _obj({"dropped": {"type": "array", "items": _ref("BlockId"), "minItems": 1, "description": "Smallest first."}}),
        body=_obj({"block": _ref("BlockId")}),
        body_required=True,
        errors={400: ["request.empty_body", "request.missing_field"], 404: ["forget.no_summary"],
                422: ["block.invalid", "block.beyond_log"]},
        description="Drops a summary and every summary built on it; the log is untouched.",
    ),
    ("GET", "/config"): R(_CONFIG, query={}),
    ("POST", "/config"): R(
        _CONFIG,
        body=_ref("SizeChanges"),
        body_required=True,
        errors={400: ["request.empty_body"], 422: ["config.empty", "config.unknown_name", "config.out_of_range"]},
        description="Changes sizes; nothing is recomputed. Answers the sizes now in force, like GET /config.",
    ),
    ("POST", "/import"): R(
        _obj({"first": _int(0, description="Id of the first memory imported."),
              "last": _int(0, description="Id of the last memory imported."),
              "pending": _int(0, description="Compressions now due."),
              "head": _ref("Head") | {"description": "The log's head just after the batch: pin it."}}),
        idempotent=True,
        body=_obj({"entries": {
            "type": "array", "minItems": 1, "description": "Oldest first; the whole batch or nothing.",
            "items": _obj({"date": _str("A real calendar date, not in the future (UTC).", pattern=_DATE,
                                        format="date"),
                           "text": _str("One line of at most ENTRY_CHARS bytes.", **_ONE_LINE)}),
        }}),
        body_required=True,
        body_cap="max_import_body",
        errors={400: ["request.empty_body", "request.missing_field"], 403: ["quota.memories", "quota.bytes"],
                422: ["import.empty"]},
        special={422: ("or an entry was refused (`index` names it) and nothing was imported", "IndexedError",
                       _IMPORT_INDEXED)},
        description="Bulk-appends dated memories, validating every entry before writing any.",
    ),
    ("GET", "/grants"): R(
        _obj({"grants": {"type": "array", "items": _ref("Grant"), "description": "Oldest first, owner included."}}),
        query={},
        description="Every capability of this memory, live and revoked. Never a token or a secret.",
    ),
    ("POST", "/grants"): R(
        _obj({
            "id": _int(1), "scope": {"enum": ["read", "full"]}, "label": _nullable(_str()),
            "created": _ref("Timestamp"), "expires": _nullable(_ref("Timestamp")),
            "token": _str("The new capability. Shown once, never stored.", pattern=f"^{tokens.TOKEN_PATTERN}$"),
            "note": _str(),
        }),
        status=201,
        idempotent=True,
        body=_obj({"scope": {"enum": ["read", "full"], "description": "read may look; full may also write."},
                   "label": _str("What it is for: 1 to 64 bytes of printable text.", minLength=1),
                   "expires": _str("An RFC 3339 UTC time after now, like 2027-01-31T18:00:00Z; from then on the "
                                   "token is refused like a revoked one.")}, required=["scope"]),
        body_required=True,
        errors={400: ["request.empty_body", "request.missing_field"], 409: ["grants.busy"],
                422: ["grants.bad_scope", "grants.bad_label", "grants.bad_expires"]},
        description="Mints a capability over this memory: the current key epoch's key sealed to a key pair "
                    "derived from a fresh secret. Owner is never transferable: no route mints an owner capability.",
    ),
    ("DELETE", "/grants/{grant_id}"): R(
        _obj({"id": _int(1), "scope": {"enum": ["read", "full"]}, "revoked": _ref("Timestamp"),
              "already": {"type": "boolean", "description": "True when it was revoked before this call."},
              "also_revoked": {"type": "array", "items": _int(1),
                               "description": "Capabilities that had not moved to key epochs (not used since "
                                              "the upgrade) and end with this revocation."},
              "epoch": _int(0, description="The store's key epoch after this call.")}),
        path={"grant_id": _int(1, description="The `id` from GET /grants.")},
        errors={404: ["grants.unknown"], 409: ["grants.owner", "grants.busy"]},
        description="Revokes one capability: destroys its key columns (its listing row stays) and starts a new "
                    "key epoch that only the other live capabilities reach, so nothing written from now on opens "
                    "with it, whatever copies of the files it is given. Revoking a revoked capability answers 200 "
                    "with `already: true`.",
    ),
    ("POST", "/rotate"): R(
        _obj({"id": _int(1, description="The new owner capability."), "scope": {"const": "owner"},
              "created": _ref("Timestamp"),
              "token": _str("The new owner token. Shown once, never stored.", pattern=f"^{tokens.TOKEN_PATTERN}$"),
              "revoked": _int(1, description="The owner capability this call ended."),
              "also_revoked": {"type": "array", "items": _int(1),
                               "description": "Capabilities that had not moved to key epochs and end with it."},
              "epoch": _int(1, description="The store's key epoch after this call."),
              "note": _str()}),
        body=_obj({}),
        errors={409: ["grants.busy"]},
        description="Rotates the owner token: a new owner capability in a new key epoch, and the calling one "
                    "ends as a revoked one does. A read or full capability is rotated by minting a new one and "
                    "revoking the old.",
    ),
    ("POST", "/erase"): R(
        _ref("Receipt"),
        body=_obj({"ids": {"type": "array", "minItems": 1, "maxItems": 10_000,
                           "items": _int(0, description="A memory id, below T.")}}),
        body_required=True,
        errors={400: ["request.empty_body", "request.missing_field"], 409: ["erase.busy"],
                422: ["erase.bad_ids", "erase.unknown_id"]},
        description="Shreds memories for good: each one's key is destroyed, its line stays as `[erased]` with "
                    "its date, and only the summaries that contain one of them are dropped: the blocks on its path "
                    "to the root, at most one per level (the next naps rewrite them). Answers a receipt.",
    ),
    ("GET", "/erasures"): R(
        _obj({"erasures": {"type": "array", "items": _ref("Receipt")}}),
        query={},
        description="Every erasure receipt, oldest first. Never any content.",
    ),
    ("GET", "/audit"): R(
        _obj({"events": {"type": "array", "items": _obj({
            "id": _int(1), "at": _ref("Timestamp"),
            "grant": _int(1, description="The capability that did it (see GET /grants)."),
            "event": {"enum": ["mint", "revoke", "rotate", "erase", "export", "config", "forget", "import"]},
            "detail": {"type": "object", "description": "Numbers, block ids and size names only; never content."},
        })}}),
        query={},
        description="The audit trail, oldest first: which capability minted, revoked, rotated, erased, exported, "
                    "changed the config, forgot or imported, and when. Never any memory text.",
    ),
    ("DELETE", "/store"): R(
        _obj({"user_id": _str(pattern="^[0-9a-f]{16}$"), "destroyed": {"const": True},
              "memories": _nullable(_int(0, description="How many memories the store held.")),
              "at": _ref("Timestamp"),
              "receipt": _str("Where, under the server's data folder, the operator finds this receipt "
                              "(receipts/deletions.jsonl).")}),
        body=_obj({}),
        description="Destroys the whole memory: every wrapped key and the memory file. Every token of it stops "
                    "working at once. There is no undo.",
    ),
    ("GET", "/export"): R(
        None, media="application/gzip", query={},
        description="A tar.gz holding memory/LOG.txt, memory/TREE/<size>, memory/config and README.txt, "
                    "readable by OptMem with MEMORY_DIR=memory, and manifest.json: counts, the SHA-256 of every "
                    "other member and one digest over them (GET /reference, Export archive).",
    ),
    ("GET", "/openapi.json"): R({"type": "object", "description": "This document.",
                                 "required": ["openapi", "info", "paths", "components"],
                                 "properties": {"openapi": {"const": "3.1.0"}, "info": {"type": "object"},
                                                "servers": {"type": "array", "description": "This server's public "
                                                            "address: --url, else the address it was called at."},
                                                "paths": {"type": "object"}, "components": {"type": "object"}},
                                 "additionalProperties": False}),
    ("GET", "/client"): R(_str("The client's Python source."), media="text/x-python"),
    ("GET", "/skill"): R(_str("skill/SKILL.md: how an agent wakes, notes, naps (one at a time or in batches), "
                              "recalls and zooms."), media="text/markdown",
                         description="The skill, the whole protocol for an agent, served so that an agent with only "
                                     "the AGENTS.md block can read it. Public."),
    ("GET", "/reference"): R(_str("API-REFERENCE.md: every route, field, error code and client verb."),
                             media="text/markdown",
                             description="The field-by-field API reference this document is kept in step with. "
                                         "Public."),
    **_twins(
        "/shape", {"T": _int(0, 10**15, "How many memories (default 0)."),
                   "lines": _int(1, 1000, "The line budget (default 96).")}, (),
        _obj({
            "T": _int(0), "lines": _int(1),
            "blocks": {"type": "array", "description": "cover(T, lines), oldest first, each [first, last] inclusive.",
                       # A pair of equal schemas, so items + min/maxItems says it without prefixItems,
                       # which some OpenAPI 3.1 tools (schemathesis 4, issue 3842) cannot load.
                       "items": {"type": "array", "items": _int(0), "minItems": 2, "maxItems": 2}},
        }),
        {422: ["request.bad_value", "shape.out_of_range"]},
        "The block boundaries a wake of T memories shows with a budget of `lines`. Reads no memory.",
    ),
    ("GET", "/metrics"): R(
        _str("Prometheus text format 0.0.4."), media="text/plain",
        errors={403: ["auth.operator"], 429: ["rate_limited"]},
        description="Loopback only, unless the server has a metrics token (STASH_METRICS_TOKEN): then that token "
                    "as a bearer, from anywhere.",
    ),
    ("GET", "/"): R(_str("The landing page."), media="text/html"),
}


_IDEMPOTENCY_KEY = {
    "name": idempotency.HEADER,
    "in": "header",
    "required": False,
    "description": f"Makes a retry safe: an exact retry (same route and JSON body) within "
                   f"{idempotency.WINDOW_SECONDS // 3600} hours answers the first answer and writes nothing; the "
                   "same key with another request is 409 idempotency.key_reused. Keys are per user. Send a fresh "
                   "random key (a UUID) with each new request, and the same one with each retry of it.",
    "schema": {"type": "string", "minLength": 1, "maxLength": idempotency.KEY_MAX_CHARS,
               "pattern": "^[\\x21-\\x7e]+$"},
}

_STATUS_WORDS = {
    400: "Unparseable or wrongly shaped request",
    401: "Missing, malformed, unknown or revoked token (always the same answer)",
    403: "Not allowed",
    404: "Nothing there",
    409: "Conflict",
    413: "Body too large",
    422: "Valid JSON with an invalid value",
    429: "Too many requests; wait Retry-After seconds",
    500: "The server failed, or stored data failed its integrity check",
    503: "The storage cannot serve this now (read-only folder, missing or unreadable file; for /health?ready=1, "
         "the data folder cannot be written); nothing was changed",
    507: "The server's disk is full; nothing was written",
}


def error_codes(route, spec: R | None = None) -> dict[int, list[str]]:
    """Every error code the route can answer, by status: those every route of
    its kind shares, then its own."""
    spec = spec or SPECS[(route.method, route.path)]
    out: dict[int, list[str]] = {400: ["auth.token_in_query"], 500: ["internal"]}

    def add(status: int, *codes: str) -> None:
        for code in codes:
            if code not in out.setdefault(status, []):
                out[status].append(code)

    if spec.query is not None:
        add(400, "request.duplicate_field", "request.unknown_field")
    if spec.body is not None:
        add(400, "request.malformed", "request.bad_json", "request.unknown_field")
        add(413, "request.too_large")
    if route.scope in _SECURED:
        add(401, "auth.invalid")
        add(429, "rate_limited")
        add(400, "request.bad_pin")
        add(409, "store.pin_mismatch", "store.rekeyed")
        add(500, "store.damaged", "store.rolled_back")
        add(503, "store.missing", "store.read_only", "store.unreadable")
        add(507, "store.full")
    if route.scope in _SECURED:
        add(429, "busy.user")
    if getattr(route, "slow", False):
        add(429, "busy.slow", "busy.server")
    if route.scope in ("full", "owner"):
        add(403, "auth.scope")
    if spec.idempotent:
        add(400, "idempotency.bad_key")
        add(409, "idempotency.key_reused")
    for status, codes in spec.errors.items():
        add(status, *codes)
    for status, (_, _, codes) in spec.special.items():
        add(status, *codes)
    return dict(sorted(out.items()))


def _operation(route, spec: R, caps: dict[str, int]) -> dict:
    op: dict[str, Any] = {
        "operationId": route.method.lower() + "_" + (route.path.strip("/").replace(".", "_") or "landing"),
        "summary": route.summary,
        "x-stash-scope": route.scope,
    }
    words = spec.description
    if route.scope in _SECURED:
        op["security"] = [{"bearerAuth": []}]
        words += f" Needs a capability of scope {route.scope} or above."
    elif route.scope == "operator":
        op["security"] = [{"operatorToken": []}, {}]
    else:
        op["security"] = []
    if words.strip():
        op["description"] = words.strip()
    params = [{"name": name, "in": "path", "required": True, "schema": schema} for name, schema in spec.path.items()]
    params += [
        {"name": name, "in": "query", "required": required, "schema": schema}
        for name, (schema, required) in (spec.query or {}).items()
    ]
    if spec.idempotent:
        params.append(_IDEMPOTENCY_KEY)
    if route.scope in _SECURED:
        params.append({
            "name": "Stash-Pin", "in": "header", "required": False,
            "schema": _str(pattern="^[0-9]{1,18}:[0-9a-f]{64}(:[0-9]{1,18})?$"),
            "description": "A head this client saw (`head.pin` of an earlier answer). The request is refused "
                           "with 409 store.pin_mismatch unless the log is that one or grew from it and the "
                           "memory's whole state is at least at the pinned version.",
        })
    if params:
        op["parameters"] = params
    if spec.body is not None:
        op["requestBody"] = {
            "required": spec.body_required,
            "description": f"A JSON object of at most {caps[spec.body_cap]} bytes (this server's cap); "
                           "an unknown field is refused.",
            "content": {"application/json": {"schema": spec.body}},
        }
    ok: dict[str, Any] = {"description": "Success", "content": {spec.media: {}}}
    if spec.answer is not None:
        ok["content"][spec.media]["schema"] = spec.answer
    if spec.idempotent:
        ok["headers"] = {idempotency.REPLAYED_HEADER: {
            "description": "`true` when this is the recorded answer to an earlier request with the same "
                           "Idempotency-Key, replayed without writing; absent otherwise.",
            "schema": {"const": "true"},
        }}
    responses: dict[str, Any] = {str(spec.status): ok}
    for status, codes in error_codes(route, spec).items():
        schema = _ref("Error")
        text = _STATUS_WORDS[status]
        if status in spec.special:
            extra, name, special_codes = spec.special[status]
            plain = [c for c in codes if c not in special_codes]
            schema = {"oneOf": [_ref("Error"), _ref(name)]} if plain else _ref(name)
            text += f"; {extra}"
        resp: dict[str, Any] = {
            "description": f"{text}. Codes: {', '.join(codes)}.",
            "x-error-codes": codes,
            "content": {"application/json": {"schema": schema}},
        }
        if status == 429:
            resp["headers"] = {"Retry-After": {"description": "Seconds to wait.", "schema": _int(1)}}
        responses[str(status)] = resp
    op["responses"] = responses
    return op


def document(routes, version: str, caps: dict[str, int] | None = None, server: str | None = None) -> dict:
    """The OpenAPI 3.1 document of ``routes`` (the ROUTES table); ``caps``
    are this server's body caps by Settings field name; ``server`` is its
    public address (``--url``, else the address it was called at), named in
    ``servers`` so a generated client or a broker calls the right host."""
    caps = {"max_body": BODY_CAP, "max_import_body": IMPORT_BODY_CAP, "max_nap_body": NAP_BODY_CAP, **(caps or {})}
    paths: dict[str, dict] = {}
    for route in routes:
        spec = SPECS.get((route.method, route.path)) or R(description="Not described yet.")
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, spec, caps)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Stash",
            "version": version,
            "summary": "Permanent, encrypted memory for AI agents.",
            "description": "JSON in, JSON out. Every refusal is {\"error\": code, \"message\": sentence} with the "
                           "status of its kind. The field-by-field contract is GET /reference on this server; "
                           "the protocol for an agent is GET /skill.",
        },
        **({"servers": [{"url": server}]} if server else {}),
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http", "scheme": "bearer", "bearerFormat": "stash1",
                    "description": f"A capability token, matching {tokens.TOKEN_PATTERN}. Never in a query string.",
                },
                "operatorToken": {
                    "type": "http", "scheme": "bearer",
                    "description": "The operator's metrics token (STASH_METRICS_TOKEN); without one, /metrics "
                                   "answers on loopback only.",
                },
            },
        },
    }
