"""Every route of the HTTP surface (docs/DESIGN.md, "HTTP surface"), each
declared once, right above its handler. A declaration (:class:`RouteSpec`,
:mod:`stash.web.dispatch`) says how the route is called and guarded, what it
reads and answers, its own refusals, and what happens around its handler:
its Idempotency-Key record, the notes it adds against the quotas, its
audit event, its cleanup. The handler takes the parsed fields (and, for a
route that needs a capability, the authenticated session) and returns the
answer from one call into the service layer; everything else is done from
the declaration.

Adding a route: one declaration and its handler here, its service function,
its tests; then ``python -m stash.web.refgen --write`` regenerates the
reference's tables and the client's list of keyed writes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace as _replace
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, PlainTextResponse, Response

from .. import __version__
from ..core import blocks, words
from ..core.blocks import BATCH_MAX
from ..core.errors import Invalid, Malformed, NotFound, Unavailable
from ..core.recall import MAX_PATTERN_BYTES
from ..crypto import tokens
from ..service import admission, append, audit, docs, erase_across, grants, memories, onboarding, quotas, undo
from ..service.access import MAIN, NAME_PATTERN, Session
from ..service.export import export_archive
from ..service.operation import Event, Limits
from ..service.ops import replication_status
from ..service.ops.replica import replica_history_ends
from . import consent, mcp_transport, oauth_answers, pages, plaintext
from .dispatch import MAX_IMPORT_BODY, MAX_NAP_BODY, MEMORY_PREFIX, Call
from .dispatch import RouteSpec as RouteSpec  # the declaration's class, named where the declarations are
from .fields import Field, Fields, Refusal, Special
from .jsonio import parse_int
from .openapi import document
from .schemas import (
    CONFIG,
    DATE,
    LINES,
    NAP_OR_NULL,
    ONE_LINE,
    RUN,
    SCHEMAS,
    integer,
    nullable,
    obj,
    ref,
    string,
)

CONTENT_CIPHER = "xchacha20-poly1305"
# In every owner listing over the identity's memories (GET /memories, /grants, /audit).
UNOPENED = {
    "type": "array",
    "items": ref("Unopened"),
    "description": "The memories this answer could not open, each named with its refusal; empty when every "
    "memory opened. The rest is listed all the same.",
}
ROUTES: list[RouteSpec] = []
"""Every route, in the order of /openapi.json and the reference."""

Handler = Callable[..., Any]
Args = dict[str, Any]  # a request's fields, read as its route declares them
Answer = dict[str, Any]


def route(method: str, path: str, scope: str, summary: str, **kw: Any) -> Callable[[Handler], Handler]:
    """Declare the route the decorated function handles."""

    def declare(handler: Handler) -> Handler:
        ROUTES.append(RouteSpec(method, path, scope, summary, handler, **kw))
        return handler

    return declare


def twins(
    path: str, scope: str, summaries: tuple[str, str], fields: Fields, description: str, **kw: Any
) -> Callable[[Handler], Handler]:
    """Declare a read-only route and its POST twin (docs/DESIGN.md, "HTTP surface"), sharing one declaration
    of their fields: query parameters of the one, JSON body of the other."""

    def declare(handler: Handler) -> Handler:
        ROUTES.append(
            RouteSpec("GET", path, scope, summaries[0], handler, fields=fields, description=description, **kw)
        )
        ROUTES.append(
            RouteSpec(
                "POST",
                path,
                scope,
                summaries[1],
                handler,
                fields=fields,
                description=description + " POST twin of the GET route: the same fields as a JSON body.",
                **kw,
            )
        )
        return handler

    return declare


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _entries(f: Args) -> int | None:
    """The notes an import adds; None leaves a body that is no list to the service's own refusal."""
    return len(f["entries"]) if isinstance(f["entries"], list) else None


FLUSHED = {
    "type": "boolean",
    "description": "`true`: the write-ahead logs holding the destroyed keys were "
    "flushed into their files and emptied; after an erasure, those of every file of each memory it erased "
    "in (`memory.db`, its key ring, where append notes wait, and `recall.db`), so nothing of an erased "
    "memory is left in any file of its folder. `false`: the action is in force, the flush is still pending "
    "(every later close of the file retries it; a resend with the same Idempotency-Key tries again).",
}

_LINE_CODES = (
    "text.type",
    "text.multiline",
    "text.control",
    "text.bidi",
    "text.invisible",
    "text.empty",
    "text.too_long",
    "text.reserved",
)  # an imported line's
_TEXT_CODES = (*_LINE_CODES, "text.placeholder")  # a line an agent writes: a note's, a summary's
_BLOCK_CODES = ("block.invalid", "block.beyond_log")
_SHAPE_RANGE = Refusal("shape.out_of_range", "T must be 0 to 10^15 and lines 1 to 1000.")

NO_FIELDS = Fields()


HEALTH_FIELDS = Fields(
    (
        Field(
            "ready",
            integer(0, 1),
            "`1`: also probe readiness — create, write, fsync and remove a temporary file "
            "(`.ready-*`) in the data folder's `users/`; `0`: liveness only",
            whole=True,
            default=0,
            default_doc="`0`",
            refuse=Refusal("request.bad_value", "ready must be 0 or 1."),
        ),
    )
)


@twins(
    "/health",
    "public",
    ("Liveness, version and this host's ciphers", "Liveness and readiness (POST twin of GET /health)"),
    HEALTH_FIELDS,
    "Liveness: 200 whenever the process serves HTTP. With ready=1, readiness for a load balancer: "
    "503 when the data folder cannot be written (full disk, read-only mount, folder gone), or, on a host that "
    "replicates, when replication is down, failing or behind (`ready.replication`).",
    answer=obj(
        {
            "ok": {"const": True},
            "version": string("the server's version, e.g. `0.4.0`"),
            "content_cipher": {"const": "xchacha20-poly1305", "description": "how every row is sealed"},
            "file_cipher": {
                "enum": ["sqlcipher", "none"],
                "description": "whether new memory files are also encrypted whole on this host",
            },
            "ready": {"enum": [True, None], "description": "`true`: the probe passed; `null`: readiness was not asked"},
            "placement_epoch": nullable(integer(1))
            | {"description": "the epoch of the fleet placement this host serves by; `null`: not a host of a fleet"},
            "drained": {
                "type": ["object", "null"],
                "description": "while a shard of this host drains for `stash fleet move`: the placement `epoch`, "
                "the `shards` drained and whether everything written was `shipped` to the replica; `null` otherwise",
            },
        }
    ),
    errors=("ready.unwritable", "ready.replication"),
)
async def health(f: Args, call: Call) -> Answer:
    """Liveness; with ``ready=1`` also readiness: 503 when the data folder
    cannot be written."""
    answer = {
        "ok": True,
        "version": __version__,
        "content_cipher": CONTENT_CIPHER,
        "file_cipher": call.vault.file_cipher,
        "ready": None,
        "placement_epoch": call.vault.placement_epoch(),
        "drained": call.vault.drained(),
    }
    if f["ready"]:
        if not await run_in_threadpool(call.vault.ready):
            raise Unavailable(
                "The server cannot write its data folder (full, read-only or missing), so writes "
                "would fail; send traffic elsewhere and tell the operator.",
                code="ready.unwritable",
            )
        if call.replicating:
            lagging = replication_status.problem(replication_status.read(call.vault.data_dir))
            if lagging is not None:
                raise Unavailable(
                    f"Replication is not keeping up ({lagging}), so new writes may not reach the "
                    "replica; send traffic elsewhere and tell the operator.",
                    code="ready.replication",
                )
        answer["ready"] = True
    return answer


@route(
    "POST",
    "/init",
    "public",
    "Mint an identity; the token is shown once",
    status=201,
    fields=Fields(
        (
            Field(
                "url",
                string(maxLength=2000, pattern="^https?://"),
                "an `http://…` or `https://…` address, written into `prompt`. Default: the server's `--url`; "
                "without one, the scheme, host "
                "and port this request was made to (a `Host` header that is not a plain `host[:port]` is "
                "replaced by `https://stash.example`, as on the landing page)",
            ),
            Field(
                "invite",
                string(),
                "the operator's invite secret; required when the server runs `--init invite`, ignored otherwise",
                refuse=Refusal("request.bad_value", "invite must be a string: the operator's invite secret."),
            ),
        )
    ),
    answer=obj(
        {
            "user_id": string("the identity's public id: 16 hex digits", pattern="^[0-9a-f]{16}$"),
            "token": string(
                "the owner capability, the only key to this identity and every memory of it. **Shown once, "
                "never stored**",
                pattern=f"^{tokens.TOKEN_PATTERN}$",
            ),
            "content_cipher": {"const": "xchacha20-poly1305"},
            "file_cipher": {"enum": ["sqlcipher", "none"], "description": "the cipher of memory `main`'s file"},
            "note": string("what to do with the token"),
            "prompt": string(
                "the block to paste into AGENTS.md (`skill/AGENTS.md` with `{url}` and the byte limit filled in)"
            ),
        }
    ),
    errors=(
        "init.disabled",
        "init.invite_required",
        "init.bad_url",
        "fleet.elsewhere",
        "rate_limited",
        "quota.identities",
        "store.read_only",
        "store.unreadable",
        "store.full",
    ),
    description="Mints an identity: its owner token and its first memory, `main`, empty.",
)
async def init(f: Args, call: Call) -> Answer:
    # A non-string invite is refused by its field in every mode, so it never goes unseen.
    address = call.block_address(f.get("url"))
    admission.admit(call.settings, call.limiter, call.client, f.get("invite"), address)
    assert address is not None
    prompt = onboarding.agents_block(address)  # before the identity, as a grant's (service/grants.py)
    ident = await run_in_threadpool(call.vault.create_identity)
    return onboarding.init_answer(ident, prompt, CONTENT_CIPHER)


WAKE_FIELDS = Fields(
    (
        Field("part", integer(1), "which part to read, from 1", whole=True, default=1, default_doc="1"),
        Field(
            "T",
            integer(0),
            "the snapshot to cut the parts from; pass the `T` of part 1 when fetching later parts",
            whole=True,
            nullable=True,
            default_doc="the log's size now",
        ),
    )
)


@twins(
    "/wake",
    "read",
    ("The wake document, one part at a time", "The wake (POST twin of GET /wake)"),
    WAKE_FIELDS,
    "The bounded, hierarchical read of the whole log, cut into parts. Refused (409) only when the document "
    "needs a summary that is not written yet.",
    answer=obj(
        {
            "T": integer(0, description="the snapshot this part was rendered from"),
            "part": integer(1, description="this part's number"),
            "parts": integer(1, description="how many parts the document has"),
            "lines": LINES | {"description": "this part's lines, oldest first"},
            "awake": {"type": "boolean", "description": "`true` on the last part only"},
            "nap": NAP_OR_NULL | {"description": "the due compression; only ever set on the last part"},
            "next": nullable(
                string("the curl command of `run[0]`, which fetches the next part; `null` on the last part")
            ),
            "message": string(
                "last part: `You are awake.`; other parts: `Not awake yet: read the next part.`; "
                "empty memory: how to record the first note (the command is in `run`), then "
                "`You are awake.`. For a read capability, `You are awake.` follows a line saying it "
                "is read-only and what to do instead of noting or napping (tell the user; recall)"
            ),
            "run": RUN
            | {
                "description": 'the next part\'s request (`{"part", "T"}`) on every part but the '
                "last; for an empty memory, the `POST /note` that records the first note"
            },
            "head": ref("Head")
            | {
                "description": "the log's head **now** (not at the snapshot `T`), on every part: "
                "see [The log head](#the-log-head-and-stash-pin)"
            },
        }
    ),
    errors=("wake.bad_t", "wake.no_part"),
    special=(Special(409, "a summary the document needs is not written yet", "WakeRefusal", ("wake.needs_nap",)),),
)
def wake(s: Session, f: Args, call: Call) -> Answer:
    return s.open_memory().wake(f["part"], f["T"])


@route(
    "POST",
    "/note",
    "append",
    "Append one note",
    fields=Fields(
        (
            Field(
                "text",
                string(**ONE_LINE),
                "one line of at most `ENTRY_CHARS` bytes of UTF-8, checked as in "
                "[Note and summary text](#note-and-summary-text); surrounding spaces are removed",
                required=True,
            ),
        ),
        plain=plaintext.note_body,
        plain_doc="the note: one line",
    ),
    answer=obj(
        {
            "id": integer(0, description="The new note's position in the log."),
            "nap": NAP_OR_NULL,
            "head": ref("Head") | {"description": "The log's head just after this note: pin it."},
        }
    ),
    errors=("quota.memories", "quota.bytes", "append.not_ready", *_TEXT_CODES),
    description="Appends one note dated with the server's UTC day. `nap` is the compression now due, if any. "
    'An append capability\'s answer is `{"id", "nap": null}` only: no head, nothing of the memory.',
    record="memory",
    adds=lambda f: 1,
)
def note(s: Session, f: Args, call: Call) -> Answer:
    if s.scope == "append":
        return append.note(s, f["text"], Limits(call.settings.quota_memories, call.settings.quota_bytes))
    return s.open_memory().note(f["text"])


@route(
    "POST",
    "/nap",
    "full",
    "Ask what is due, or settle the due block",
    body_cap=MAX_NAP_BODY,
    fields=Fields(
        (
            Field(
                "block",
                ref("BlockId"),
                "the block being summarised; absent or `null` (with no `text`): ask what is due",
            ),
            Field(
                "text",
                string(**ONE_LINE),
                "the summary: one line of at most `ENTRY_CHARS` bytes, checked as a note's text",
            ),
            Field("batch", integer(1, BATCH_MAX), "list up to this many due blocks that can be written at once"),
            Field(
                "summaries",
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": BATCH_MAX,
                    "items": obj(
                        {"block": ref("BlockId"), "text": string("One line of at most ENTRY_CHARS bytes.", **ONE_LINE)}
                    ),
                },
                "summaries to settle in this order, all or nothing",
            ),
        ),
        plain=plaintext.nap_body,
        plain_doc="`lo-hi text` lines: none asks what is due, one settles that block, several settle them in "
        "order (a batch)",
    ),
    answer={
        "anyOf": [
            obj(
                {
                    "saved": nullable(ref("BlockId"))
                    | {"description": "The block saved; null when nothing was written."},
                    "nap": NAP_OR_NULL | {"description": "What is due now (after saving, if something was saved)."},
                    "message": string(),
                    "settled": ref("BlockId")
                    | {
                        "description": "Only when the block sent was settled already: its "
                        "summary stands, so a resend is done (nothing written)."
                    },
                },
                required=["saved", "nap", "message"],
                description="The answer to {} or {block, text}.",
            ),
            obj(
                {
                    "saved": {"type": "null"},
                    "nap": NAP_OR_NULL | {"description": "The first pending block."},
                    "batch": {
                        "type": "array",
                        "maxItems": BATCH_MAX,
                        "items": ref("BatchItem"),
                        "description": "The due blocks that can be written at once, in settling order.",
                    },
                    "prompt": nullable(string("The instruction, ending with the command that settles them all.")),
                    "run": RUN
                    | {
                        "description": "The command that settles them all: one `block text` line per "
                        "block. Empty when nothing is due."
                    },
                    "message": string(),
                },
                description="The answer to {batch: k}.",
            ),
            obj(
                {
                    "saved": {
                        "type": "array",
                        "maxItems": BATCH_MAX,
                        "items": ref("BlockId"),
                        "description": "The blocks this request wrote, in order.",
                    },
                    "nap": NAP_OR_NULL | {"description": "What is due now."},
                    "message": string(),
                },
                description="The answer to {summaries: [...]}.",
            ),
        ]
    },
    errors=(
        "nap.missing_block",
        "nap.missing_text",
        "nap.mixed",
        "nap.bad_batch",
        "nap.bad_summaries",
        *_BLOCK_CODES,
        *_TEXT_CODES,
    ),
    special=(Special(409, "the block sent is not the one due", "NapConflict", ("nap.wrong_block",)),),
    description="An empty body or {} asks what is due; {block, text} settles the due block; {batch: k} lists up "
    "to k due blocks that can be written at once; {summaries: [...]} settles them in order, all or "
    "nothing. A block that is already settled answers 200 and writes nothing.",
    record="memory",
)
def nap(s: Session, f: Args, call: Call) -> Answer:
    return s.open_memory().nap(f.get("block"), f.get("text"), f.get("batch"), f.get("summaries"))


RECALL_FIELDS = Fields(
    (
        Field(
            "q",
            string(minLength=1, maxLength=MAX_PATTERN_BYTES),
            f"the pattern: a regular expression (RE2 syntax, always case-insensitive) of 1 to {MAX_PATTERN_BYTES} "
            "bytes of UTF-8; see [Recall syntax](#recall-syntax). Send `q` or `words`, not both",
            default_doc="required unless `words` is sent",
        ),
        Field(
            "words",
            string(minLength=1, maxLength=words.MAX_QUERY_BYTES),
            f"words instead of a pattern (1 to {words.MAX_QUERY_BYTES} bytes, at most {words.MAX_WORDS} different "
            "words): each word matches as the prefix of a word of the note, case- and accent-folded, best "
            "first; see [Word search](#word-search)",
            default_doc="none: a regex search",
        ),
        Field(
            "before",
            {"anyOf": [integer(0), string(maxLength=words.MAX_CURSOR_BYTES)]},
            "with `q`: search only the notes before this id; with `words`: the cursor of the next page; "
            "in both, the `more` of the previous page",
            nullable=True,
            default_doc="the whole log, the first page",
        ),
    ),
    plain=plaintext.recall_body,
    plain_doc="the pattern, exactly as its first line holds it; for a later page, a second line `before N`. "
    "Or words on the first line and a second line `#words` (a later page: `#words before CURSOR`)",
)


@twins(
    "/recall",
    "read",
    ("Regex or words search of the verbatim log", "Regex or words search (POST twin of GET /recall)"),
    RECALL_FIELDS,
    "Searches the verbatim log (never the summaries), each note rendered as `#i DATE text`: by a regex "
    "(`q`: every match, newest kept, oldest first) or by words (`words`: ranked, best first, with `scores`; "
    "see [Word search](#word-search)). A search that runs past its time bound (5 s plus 10 µs per note) is "
    "refused with recall.too_slow.",
    slow=True,
    answer=obj(
        {
            "matches": {
                **LINES,
                "description": "the **newest** matching notes (of those before `before`, when "
                "given) whose lines fit in `PART_CHARS` bytes (each line costs its "
                "UTF-8 bytes + 1), returned oldest first. A single matching line "
                "longer than `PART_CHARS` leaves `matches` empty",
            },
            "total": integer(
                0, description="how many notes match in the range searched: the whole log, or the notes before `before`"
            ),
            "more": {
                "anyOf": [integer(0), string(), {"type": "null"}],
                "description": "when older matches were left out, the `before` of the next page (the id of the "
                "oldest match shown); `null` when this page holds every match of its range. For "
                "`words`: a cursor string naming the next page, `null` on the last",
            },
            "scores": {
                "type": "array",
                "items": {"type": "number", "minimum": 0, "exclusiveMaximum": 2},
                "description": "`words` only: one score per match, non-increasing; 1 or more when the note "
                "holds every word of the query, below 1 otherwise (see [Word "
                "search](#word-search))",
            },
            "message": string(
                "the count line, as OptMem prints it — `15 matches.`, `1 match.`, `No match.` "
                "(`… before #N.` on a later page) — and, when the answer was cut, that the command in "
                "`run` fetches the older matches"
            ),
            "run": RUN
            | {
                "description": "when `more` is set: the next older page, with `<the same regex>` to fill "
                "in (`<the same words>` for words); else empty"
            },
        },
        required=["matches", "total", "more", "message", "run"],
    ),
    errors=(
        "request.missing_field",
        "request.bad_value",
        "recall.bad_pattern",
        "recall.bad_words",
        "recall.q_and_words",
        "recall.too_slow",
    ),
)
def recall(s: Session, f: Args, call: Call) -> Answer:
    before = f.get("before")
    if f.get("words") is not None:
        if f.get("q") is not None:
            raise Invalid("Send q (a regex) or words, not both.", code="recall.q_and_words")
        return s.open_memory().recall_words(f["words"], before)
    if f.get("q") is None:
        raise Malformed(
            "Missing q: send the pattern to search for (or words=, to search by words).", code="request.missing_field"
        )
    return s.open_memory().recall(f["q"], None if before is None else parse_int("before", before))


ZOOM_FIELDS = Fields(
    (
        Field(
            "block",
            ref("BlockId"),
            "the block to open",
            required=True,
            missing="Missing block: send the block to open, as a #lo-hi line of the wake names it.",
        ),
    ),
    plain=plaintext.zoom_body,
    plain_doc="the block, like `16-31`",
)


@twins(
    "/zoom",
    "read",
    ("Open a block into its two halves", "Open a block (POST twin of GET /zoom)"),
    ZOOM_FIELDS,
    "The block's two halves as the wake would show them; a half wholly beyond the log is omitted.",
    answer=obj({"block": ref("BlockId"), "lines": {**LINES, "minItems": 1, "maxItems": 2}}),
    errors=_BLOCK_CODES,
    special=(Special(422, "a block beyond the log carries the zoom that helps", "ZoomRefusal", ("block.beyond_log",)),),
)
def zoom(s: Session, f: Args, call: Call) -> Answer:
    return s.open_memory().zoom(f["block"])


@route(
    "POST",
    "/forget",
    "full",
    "Drop a summary, its containing blocks and every later one of their sizes",
    fields=Fields(
        (
            Field(
                "block",
                ref("BlockId"),
                "the block whose summary to drop; it must be complete (`hi ≤ T`)",
                required=True,
            ),
        )
    ),
    answer=obj(
        {
            "dropped": {
                "type": "array",
                "items": ref("BlockId"),
                "minItems": 1,
                "description": "Every summary dropped, smallest first.",
            },
            "nap": NAP_OR_NULL | {"description": "The compression now due: the first dropped summary to write again."},
        }
    ),
    errors=("forget.no_summary", *_BLOCK_CODES),
    description="Drops the block's summary, the summary of the block containing it at each larger size, and "
    "every later summary of each of those sizes, so each size's summaries stay a dense prefix "
    '(docs/DESIGN.md, "Forget"). The log is untouched; the next naps write them again, and the '
    "answer carries the first of those naps.",
    event=Event("forget", lambda s, f, a: {"block": a["dropped"][0], "dropped": len(a["dropped"])}),
)
def forget(s: Session, f: Args, call: Call) -> Answer:
    return s.open_memory().forget(f["block"])


@route("GET", "/config", "read", "The sizes and their defaults", fields=NO_FIELDS, answer=CONFIG)
def config_get(s: Session, f: Args, call: Call) -> Answer:
    return s.open_memory().config()


@route(
    "POST",
    "/config",
    "full",
    "Change sizes; null restores a default",
    fields=Fields(open_schema=ref("SizeChanges"), empty_ok=False),
    answer=CONFIG,
    errors=("config.empty", "config.unknown_name", "config.out_of_range"),
    description="Changes sizes; nothing is recomputed. Answers the sizes now in force, like GET /config.",
    event=Event("config", lambda s, f, a: {"names": sorted(f)}),
)
def config_set(s: Session, f: Args, call: Call) -> Answer:
    return s.open_memory().set_config(f)


@route(
    "POST",
    "/import",
    "full",
    "Bulk-append dated notes, oldest first",
    slow=True,
    body_cap=MAX_IMPORT_BODY,
    fields=Fields(
        (
            Field(
                "entries",
                {
                    "type": "array",
                    "minItems": 1,
                    "items": obj(
                        {
                            "date": string(
                                "A real calendar date, not in the future (UTC).", pattern=DATE, format="date"
                            ),
                            "text": string("One line of at most ENTRY_CHARS bytes.", **ONE_LINE),
                        }
                    ),
                },
                "the notes, oldest first, each with exactly `date` (`YYYY-MM-DD`) and `text`; the whole batch or "
                "nothing (see [Import rules](#import-rules))",
                required=True,
            ),
        ),
        plain=plaintext.import_body,
        plain_doc="`YYYY-MM-DD text` lines, oldest first",
    ),
    answer=obj(
        {
            "first": integer(0, description="id of the first note imported"),
            "last": integer(0, description="id of the last note imported"),
            "pending": integer(0, description="how many compressions are due now"),
            "head": ref("Head") | {"description": "the log's head just after the batch: pin it"},
            "run": RUN
            | {
                "description": "when compressions are due, the request that hands over the "
                "first (`{}` to POST /nap); else empty"
            },
        }
    ),
    errors=("quota.memories", "quota.bytes", "quota.import_request", "quota.import_day", "import.empty"),
    special=(
        Special(
            422,
            "or an entry was refused (`index` names it) and nothing was imported",
            "IndexedError",
            ("import.bad_entry", "import.bad_date", "import.out_of_order", "import.before_log", *_LINE_CODES),
        ),
    ),
    description="Bulk-appends dated notes, validating every entry before writing any.",
    record="memory",
    adds=_entries,
    event=Event("import", lambda s, f, a: {"first": a["first"], "last": a["last"]}),
)
def import_(s: Session, f: Args, call: Call) -> Answer:
    return quotas.bounded_import(s, f["entries"], call.settings.import_per_request, call.settings.import_per_day)


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


@route(
    "GET",
    "/openapi.json",
    "public",
    "This server's OpenAPI 3.1 document",
    answer={
        "type": "object",
        "description": "This document.",
        "required": ["openapi", "info", "paths", "components"],
        "properties": {
            "openapi": {"const": "3.1.0"},
            "info": {"type": "object"},
            "servers": {
                "type": "array",
                "description": "This server's public address: --url, else the address it was called at.",
            },
            "paths": {"type": "object"},
            "components": {"type": "object"},
        },
        "additionalProperties": False,
    },
)
async def openapi(f: Args, call: Call) -> Answer:
    address = call.page_address(call.settings.public_url)
    # A Host that is not a plain host[:port] names no server rather than a made-up one.
    return document(
        ROUTES, __version__, call.settings, server=None if address == pages.PLACEHOLDER_ADDRESS else address
    )


@route(
    "GET",
    "/client",
    "public",
    "The single-file stash client",
    answer=string("The client's Python source."),
    media="text/x-python",
    headers=(("Content-Disposition", 'attachment; filename="stash"'),),
)
async def client(f: Args, call: Call) -> str:
    return pages.client_source()


@route(
    "GET",
    "/skill",
    "public",
    "The skill: the whole protocol for an agent, as Markdown",
    fields=NO_FIELDS,
    media="text/markdown",
    answer=string("skill/SKILL.md: how an agent wakes, notes, naps (one at a time or in batches), recalls and zooms."),
    description="The skill, the whole protocol for an agent, served so that an agent with only the AGENTS.md "
    "block can read it. Public.",
)
async def skill(f: Args, call: Call) -> str:
    return docs.skill()


REFERENCE_FIELDS = Fields(
    (
        Field(
            "part",
            integer(1),
            "which part to read, from 1: the reference cut into parts of at most 20,000 bytes, "
            "each but the last ending with the order that fetches the next",
            whole=True,
            nullable=True,
            default_doc="the whole document",
        ),
    )
)


@twins(
    "/reference",
    "public",
    (
        "This API reference (API-REFERENCE.md), as Markdown",
        "This API reference, a part at a time (POST twin of GET /reference)",
    ),
    REFERENCE_FIELDS,
    "The field-by-field API reference; its field tables, scope matrix and error-code table are generated from "
    "the same route declarations as this document. Public. Whole for a browser or a program; with `part`, cut "
    "as a wake is, for an agent whose harness cuts long output: part 1 starts with the contents (which part "
    "holds each section).",
    media="text/markdown",
    answer=string("API-REFERENCE.md, or one part of it: every route, field, error code and client verb."),
    errors=("reference.no_part",),
)
async def reference(f: Args, call: Call) -> str:
    part = f.get("part")
    return docs.reference() if part is None else docs.reference_part(part)


SHAPE_FIELDS = Fields(
    (
        Field("T", integer(0, 10**15), "how many notes", whole=True, default=0, default_doc="0", refuse=_SHAPE_RANGE),
        Field(
            "lines", integer(1, 1000), "the line budget", whole=True, default=96, default_doc="96", refuse=_SHAPE_RANGE
        ),
    )
)


@twins(
    "/shape",
    "public",
    ("Block boundaries of cover(T, lines); no data", "Block boundaries (POST twin of GET /shape)"),
    SHAPE_FIELDS,
    "The block boundaries a wake of T notes shows with a budget of `lines`. Reads no memory.",
    answer=obj(
        {
            "T": integer(0),
            "lines": integer(1),
            "blocks": {
                "type": "array",
                "description": "cover(T, lines), oldest first, each [first, last] inclusive.",
                # A pair of equal schemas, so items + min/maxItems says it without prefixItems,
                # which some OpenAPI 3.1 tools (schemathesis 4, issue 3842) cannot load.
                "items": {"type": "array", "items": integer(0), "minItems": 2, "maxItems": 2},
            },
        }
    ),
)
async def shape(f: Args, call: Call) -> Answer:
    T, budget = f["T"], f["lines"]
    return {"T": T, "lines": budget, "blocks": [[lo, hi - 1] for lo, hi in blocks.cover(T, budget)]}


@route(
    "GET",
    "/metrics",
    "operator",
    "Prometheus text: counts and latencies",
    answer=string("Prometheus text format 0.0.4."),
    media="text/plain",
    errors=("auth.operator", "rate_limited"),
    description="Loopback only, unless the server has a metrics token (STASH_METRICS_TOKEN): then that token "
    "as a bearer, from anywhere.",
)
async def metrics(f: Args, call: Call) -> Response:
    return PlainTextResponse(call.metrics.render(), media_type="text/plain; version=0.0.4")


@route("GET", "/", "public", "The landing page", answer=string("The landing page."), media="text/html")
async def landing(f: Args, call: Call) -> Response:
    text, headers = pages.landing_page(call.page_address(call.settings.public_url))
    return HTMLResponse(text, headers=headers)


# ---------------------------------------------------------------- memories (docs/DESIGN.md, "Memories")

MEMORY_ROW = obj(
    {
        "name": string("the memory's name"),
        "T": integer(0, description="the notes its log holds (those an append capability left included)"),
        "bytes": integer(0, description="its files' bytes on disk"),
        "created": ref("Timestamp"),
        "last_write": nullable(string("the day of its last write, when recorded")),
        "grants": integer(0, description="its live capabilities, the owner's not counted"),
    }
)
_NAME_PARAM = "the memory's name"


@route(
    "GET",
    "/memories",
    "owner",
    "The identity's memories, oldest first",
    fields=NO_FIELDS,
    answer=obj({"memories": {"type": "array", "items": MEMORY_ROW}, "unopened": UNOPENED}),
    description="Every memory of this identity, `main` included, oldest first, read from the key rings "
    "alone; one that cannot be opened is named in `unopened` instead.",
)
def memories_list(s: Session, f: Args, call: Call) -> Answer:
    return memories.listing(call.vault, s, call.token)


@route(
    "POST",
    "/memories",
    "owner",
    "Create an empty memory",
    status=201,
    fields=Fields(
        (
            Field(
                "name",
                string(pattern=f"^{NAME_PATTERN}$"),
                "1 to 64 of `a-z 0-9 . _ -`, starting with a letter or digit; unique in the identity",
                required=True,
            ),
        )
    ),
    answer=MEMORY_ROW,
    errors=("memory.bad_name", "memory.exists", "memory.too_many"),
    description="A new, empty memory under a fresh master key of its own, the owner enrolled in its key ring. "
    'Serve it at `/m/{name}/…`; mint capabilities bound to it with `POST /grants {"memory"}`. '
    "Resent after a lost answer, it is `409 memory.exists`: the memory is there, whole.",
    event=Event("create", lambda s, f, a: {"memory": a["name"]}),
)
def memories_create(s: Session, f: Args, call: Call) -> Answer:
    return memories.create(call.vault, s, f["name"], call.settings.max_memories)


@route(
    "DELETE",
    "/memories/{name}",
    "owner",
    "Destroy one memory for good; answers a receipt",
    name_params=("name",),
    answer=obj(
        {
            "memory": string(),
            "destroyed": {"const": True},
            "memories": integer(0, description="how many notes its log held"),
            "grants_ended": {"type": "array", "items": integer(1)},
            "at": ref("Timestamp"),
            "receipt": string(
                "Where, under the server's data folder, the operator finds this receipt "
                "(receipts/deletions.jsonl), as for DELETE /store."
            ),
        }
    ),
    errors=("memory.unknown", "memory.main"),
    event=Event(
        "delete",
        lambda s, f, a: {"memory": a["memory"], "memories": a["memories"], "grants_ended": len(a["grants_ended"])},
    ),
    description="Renames the memory away in one step (from then on nothing opens it), overwrites every file "
    "of it with zeros (its key ring first) and removes them; its capabilities end. Memory `main` "
    "goes only with the identity (`DELETE /store`).",
    unknown=lambda: NotFound("No such memory; list them with GET /memories.", code="memory.unknown"),
)
def memories_delete(s: Session, f: Args, call: Call) -> Answer:
    return memories.delete(call.vault, s, f["name"])


@route(
    "POST",
    "/memories/{source}/fork",
    "owner",
    "Fork a memory at a position, under new keys",
    status=201,
    name_params=("source",),
    fields=Fields(
        (
            Field("name", string(pattern=f"^{NAME_PATTERN}$"), "the new memory's name", required=True),
            Field("at", integer(0), "how many of the source's first notes it holds (default all, its T)"),
        )
    ),
    answer=obj(
        {
            **MEMORY_ROW["properties"],
            "source": string("the memory forked"),
            "at": integer(0, description="the notes copied"),
            "erased": integer(0, description="of those, erased in the source and so in the fork"),
            "summaries": integer(0, description="summaries copied: every block inside the first `at`"),
        }
    ),
    errors=("memory.unknown", "memory.bad_name", "memory.exists", "memory.too_many", "memory.bad_at"),
    description="A new, independent memory holding the first `at` notes of memory `source`, erased ones "
    "erased, the summaries of every block inside them and its sizes, sealed afresh under its own "
    "keys. Only the owner is enrolled in it: no capability of the source opens it.",
    memory_of=lambda vault, user, f: f.get("source"),
    event=Event("fork", lambda s, f, a: {"memory": a["name"], "at": a["at"]}),
    unknown=lambda: NotFound("No such memory; list them with GET /memories.", code="memory.unknown"),
)
def memories_fork(s: Session, f: Args, call: Call) -> Answer:
    return memories.fork(call.vault, s, f["name"], f.get("at"), call.settings.max_memories)


@route(
    "POST",
    "/memories/erase",
    "owner",
    "Erase what matches, across memories; one receipt",
    fields=Fields(
        (
            Field(
                "q",
                string(minLength=1, maxLength=MAX_PATTERN_BYTES),
                "a recall regex (see [Recall syntax](#recall-syntax)), matched against each rendered line",
            ),
            Field(
                "words",
                string(minLength=1),
                "words, as a words search takes them (see [Word search](#word-search)): "
                "erases the notes that hold every word, each as a word prefix",
            ),
            Field(
                "memories",
                {"type": "array", "items": string(pattern=f"^{NAME_PATTERN}$")},
                "the memories to erase in (default: every one)",
            ),
            Field("dry_run", {"type": "boolean"}, "`true`: count, erase nothing"),
        )
    ),
    answer=obj(
        {
            "memories": {
                "type": "array",
                "items": obj(
                    {
                        "name": string(),
                        "erased": integer(0),
                        "lines": LINES
                        | {
                            "description": "only in a dry run: the lines that would be erased, oldest first, as many "
                            "as fit in 20,000 bytes over all memories (fewer than `erased` when "
                            "they do not all fit); never in a receipt"
                        },
                    },
                    required=["name", "erased"],
                ),
                "description": "each memory named, with how many of its notes matched (and were erased)",
            },
            "total": integer(0),
            "dry_run": {"type": "boolean"},
            "at": ref("Timestamp"),
            "fingerprint": string(
                "a keyed fingerprint of the query (never the query): only the owner can test a guess against it"
            ),
            "flushed": FLUSHED,
        }
    ),
    errors=("memory.unknown", "memory.bad_query", "memory.too_many_matches"),
    description="Erases, as `POST /erase` does, every note whose line matches `q` (or holds `words`) in every "
    "memory named (default all), and answers one receipt naming the memories and counts, never the "
    "text nor the query. Every memory is counted before anything is erased: over 10,000 matching notes "
    "is 422 and erases nothing.",
    event=Event(
        "erase",
        lambda s, f, a: (
            None
            if a["dry_run"]
            else {"across": {m["name"]: m["erased"] for m in a["memories"]}, "fingerprint": a["fingerprint"]}
        ),
    ),
)
def memories_erase(s: Session, f: Args, call: Call) -> Answer:
    return erase_across.erase_across(
        call.vault, s, call.token, f.get("words"), f.get("q"), f.get("memories"), f.get("dry_run")
    )


# ---------------------------------------------------------------- remote MCP (docs/DESIGN.md, "Remote MCP")

MCP_DESCRIPTION = (
    "The Model Context Protocol's Streamable HTTP transport, stateless (any worker answers any request; no "
    "session is kept, so there is no stream to GET and no session to DELETE), its answers JSON. It negotiates "
    "every protocol version the `mcp` SDK serves, by the `initialize` handshake or per request. Its tools are the "
    "agent's verbs, each listed for the scopes that may call it (read: wake, recall, zoom; append: note; full and "
    "owner: all six) and each call answered as the route of the same name answers it; a `wake` prompt and the "
    "`stash://wake` resource load the whole wake. Memory text travels only in content blocks of its own, marked "
    '`_meta: {"stash/role": "memory"}`, and in structured content. The bearer must be a live capability; '
    "without one, 401 names the protected-resource metadata in `WWW-Authenticate`."
)


@route(
    "POST",
    "/mcp",
    "capability",
    "The agent's tools over the Model Context Protocol (Streamable HTTP)",
    protocol=mcp_transport.JSONRPC,
    body_cap=MAX_NAP_BODY,
    description=MCP_DESCRIPTION,
    answer=mcp_transport.MESSAGE | {"description": "The JSON-RPC response to the request sent."},
    more_answers=(mcp_transport.ACCEPTED,),
    errors=("request.too_large", "mcp.bad_request", "mcp.bad_origin", "mcp.not_acceptable", "mcp.bad_host"),
)
async def mcp(f: Args, call: Call) -> Response:
    return await mcp_transport.exchange(call, MAX_NAP_BODY.of(call.settings))


RESOURCE_METADATA = obj(
    {
        "resource": string("the MCP endpoint this describes: `<server>/mcp`, or `<server>/m/{name}/mcp`"),
        "resource_name": string("`Stash`"),
        "authorization_servers": {
            "type": "array",
            "items": string(),
            "description": "this server: it is the authorization server of its own MCP endpoints",
        },
        "bearer_methods_supported": {
            "const": ["header"],
            "description": "the token goes in the Authorization header, never a URL",
        },
    }
)


@route(
    "GET",
    "/.well-known/oauth-protected-resource",
    "public",
    "OAuth protected-resource metadata of /mcp",
    fields=NO_FIELDS,
    answer=RESOURCE_METADATA,
    description="RFC 9728 metadata of the MCP endpoint `/mcp`: what a host needs to learn how to send it a "
    "token. The 401 of /mcp names it in `WWW-Authenticate`.",
)
async def resource_metadata(f: Args, call: Call) -> Answer:
    return mcp_transport.resource_metadata(call.page_address(call.settings.public_url), None)


@route(
    "GET",
    "/.well-known/oauth-protected-resource/m/{name}/mcp",
    "public",
    "OAuth protected-resource metadata of /m/{name}/mcp",
    fields=NO_FIELDS,
    answer=RESOURCE_METADATA,
    name_params=("name",),
    errors=("memory.unknown",),
    description="RFC 9728 metadata of the MCP endpoint of memory `name`, at the path RFC 9728 gives it. It "
    "says nothing of whether the memory exists.",
)
async def memory_resource_metadata(f: Args, call: Call) -> Answer:
    return mcp_transport.resource_metadata(call.page_address(call.settings.public_url), f["name"])


# ---------------------------------------------------------------- OAuth for MCP hosts (docs/DESIGN.md, "Remote MCP")

AUTH_SERVER_METADATA = obj(
    {
        "issuer": string("this server's address"),
        "authorization_endpoint": string(),
        "token_endpoint": string(),
        "registration_endpoint": string(),
        "response_types_supported": {"const": ["code"]},
        "grant_types_supported": {"const": ["authorization_code"]},
        "code_challenge_methods_supported": {"const": ["S256"]},
        "token_endpoint_auth_methods_supported": {"const": ["none"]},
        "client_id_metadata_document_supported": {"const": True},
        "service_documentation": string("this server's API reference"),
    }
)


@route(
    "GET",
    "/.well-known/oauth-authorization-server",
    "public",
    "OAuth authorization server metadata",
    fields=NO_FIELDS,
    answer=AUTH_SERVER_METADATA,
    description="RFC 8414 metadata of this server as the authorization server of its own MCP endpoints: "
    "authorization code with PKCE S256 only, public clients (no secret), named by a Client ID "
    "Metadata Document or registered at /register.",
)
async def auth_server_metadata(f: Args, call: Call) -> Answer:
    return oauth_answers.server_metadata(call.page_address(call.settings.public_url))


AUTHORIZE_FIELDS = Fields(
    (
        Field("response_type", string(), "`code`"),
        Field(
            "client_id",
            string(maxLength=2000),
            "the client: its metadata document's https URL, or the id `POST /register` answered",
            required=True,
        ),
        Field(
            "redirect_uri",
            string(maxLength=2000),
            "one of the client's redirect URIs (a loopback one's port may differ)",
            required=True,
        ),
        Field("code_challenge", string(), "PKCE: BASE64URL(SHA-256(verifier)), 43 characters"),
        Field("code_challenge_method", string(), "`S256` (the only one taken)"),
        Field("state", string(), "given back with the code, unchanged"),
        Field(
            "resource",
            string(),
            "RFC 8707: the MCP endpoint the token is for, `<server>/mcp` or "
            "`<server>/m/{name}/mcp` (which fixes the memory)",
        ),
        Field("scope", string(), "`read`, `append` or `full`: the scope the page offers first"),
    ),
    form=True,
)
_CONSENT_CODES = ("oauth.invalid_request", "oauth.invalid_client", "oauth.invalid_redirect_uri")


@route(
    "GET",
    "/authorize",
    "public",
    "The owner's consent page for an MCP host",
    fields=AUTHORIZE_FIELDS,
    protocol=consent.PAGE,
    media="text/html",
    answer=string("The consent page: a form for the owner."),
    more_answers=(
        (
            "303",
            {
                "description": "A request the client and redirect URI of which are known but that "
                "is refused otherwise: sent back to the redirect URI with `error`."
            },
        ),
    ),
    errors=_CONSENT_CODES + ("rate_limited",),
    description="What an MCP host sends its user to. A server-rendered form, without script, under the "
    "owner console's policy: the host's name and where it will be sent, the owner token (used "
    "once, never stored), the memory, the scope (read, append or full; never owner) and how "
    "long. An unknown client or redirect URI is refused on the page; any other fault of the "
    "request is sent back to the host's redirect URI as OAuth says.",
)
async def authorize_page(f: Args, call: Call) -> Response:
    return await oauth_answers.consent_page(call, f)


CONSENT_FIELDS = Fields(
    (
        Field("nonce", string(), "the page's one-time nonce", required=True),
        Field("decision", {"enum": ["approve", "deny"]}, "`approve` or `deny`"),
        Field("owner_token", string(), "the owner token (used once, never stored)"),
        Field("memory", string(), "the memory (default `main`; fixed when the host asked for /m/{name}/mcp)"),
        Field("scope", {"enum": ["read", "append", "full"]}, "what the host may do"),
        Field("expires", {"enum": ["never", "1d", "30d", "1y"]}, "how long the capability lasts"),
    ),
    form=True,
)


@route(
    "POST",
    "/authorize",
    "public",
    "The owner's answer to the consent page",
    fields=CONSENT_FIELDS,
    protocol=consent.PAGE,
    status=303,
    media="text/html",
    more_answers=(
        (
            "200",
            {
                "description": "The consent page again, saying what to fix (a refused owner token, an unknown memory).",
                "content": {"text/html": {}},
            },
        ),
    ),
    errors=(
        "consent.expired",
        "consent.bad_origin",
        "consent.bad_choice",
        "auth.invalid",
        "memory.unknown",
        "rate_limited",
        "grants.busy",
        "store.unreadable",
        "store.damaged",
    ),
    description="The consent form posted. Approved, it mints a capability of the scope chosen on the "
    "memory chosen (its label the host's name, its audit event a mint, as POST /grants) and "
    "sends the host to its redirect URI with a code and its `state`; denied, with "
    "`error=access_denied`. The form is taken once, from this server's own page (its nonce, "
    "and its Origin or Referer); framing is refused.",
)
async def authorize_answer(f: Args, call: Call) -> Response:
    return await oauth_answers.consent_answer(call, f)


TOKEN_FIELDS = Fields(
    (
        Field("grant_type", string(), "`authorization_code`", required=True),
        Field("code", string(), "the code the redirect carried"),
        Field("redirect_uri", string(), "the redirect URI the code was sent to"),
        Field("client_id", string(), "the client the code was approved for"),
        Field("code_verifier", string(), "PKCE: the verifier of the challenge sent to /authorize"),
        Field("resource", string(), "RFC 8707: the MCP endpoint, as sent to /authorize"),
    ),
    form=True,
)


@route(
    "POST",
    "/token",
    "public",
    "An MCP host's code exchanged for its capability token",
    fields=TOKEN_FIELDS,
    protocol=consent.OAUTH,
    answer=obj(
        {
            "access_token": string("the capability token: the host's only key, never stored"),
            "token_type": {"const": "Bearer"},
            "scope": {"enum": ["read", "append", "full"]},
            "expires_in": integer(0, description="seconds until the capability expires, when it does"),
        },
        required=["access_token", "token_type", "scope"],
    ),
    errors=("oauth.invalid_grant", "oauth.unsupported_grant_type", "store.unreadable"),
    description="The code exchange (authorization code with PKCE S256). The code is taken once: redeemed "
    "twice, or with another client, redirect URI or a wrong verifier, it is refused and its "
    "capability withdrawn. The token is taken out of the shared state and nothing of it is "
    "left in the state file or its WAL by the time this answers.",
)
async def token(f: Args, call: Call) -> Response:
    return await oauth_answers.token(call, f)


@route(
    "POST",
    "/register",
    "public",
    "Register an MCP host (Dynamic Client Registration)",
    status=201,
    fields=Fields(
        open_schema={
            "type": "object",
            "description": "RFC 7591 client metadata: `redirect_uris` "
            "(required), `client_name`; the rest is answered as this server gives it.",
        }
    ),
    protocol=consent.OAUTH,
    answer=obj(
        {
            "client_id": string(),
            "client_id_issued_at": integer(0),
            "client_name": nullable(string()),
            "redirect_uris": {"type": "array", "items": string()},
            "token_endpoint_auth_method": {"const": "none"},
            "grant_types": {"const": ["authorization_code"]},
            "response_types": {"const": ["code"]},
        }
    ),
    errors=("oauth.invalid_redirect_uri", "oauth.invalid_client_metadata", "rate_limited"),
    description="For hosts that predate Client ID Metadata Documents: a public client (no secret) with its "
    "redirect URIs (https, or http on loopback) and name. Rate-limited per address; a "
    "registration never approved is forgotten within the hour.",
)
async def register(f: Args, call: Call) -> Answer:
    return await oauth_answers.register(call, f)


# Every memory route is served again under /m/{name}, acting on that memory; the public documents too, so
# an agent whose STASH_URL ends in /m/{name} fetches the skill and the reference as its block says.
MEMORY_PATHS = (
    "/wake",
    "/note",
    "/nap",
    "/recall",
    "/zoom",
    "/forget",
    "/config",
    "/import",
    "/export",
    "/erase",
    "/erase/undo",
    "/erasures",
    "/skill",
    "/reference",
    "/health",
    "/mcp",
)
ROUTES.extend([_replace(r, path=MEMORY_PREFIX + r.path, under=True) for r in list(ROUTES) if r.path in MEMORY_PATHS])


@route(
    "GET",
    "/console",
    "public",
    "The owner console: a page for an owner token",
    answer=string("The owner console's page."),
    media="text/html",
    description="The owner's page: memories, grants, audit trail, erasure receipts and wake shapes, and the "
    "owner's actions. The owner token is pasted into the page and kept in that open page only. Public "
    "(it holds no data; every datum comes from the owner routes, with the token).",
)
async def console(f: Args, call: Call) -> Response:
    text, headers = pages.console_asset("console.html")
    return HTMLResponse(text, headers=headers)


@route(
    "GET", "/console.js", "public", "The owner console's script", answer=string("JavaScript."), media="text/javascript"
)
async def console_script(f: Args, call: Call) -> Response:
    text, headers = pages.console_asset("console.js")
    return Response(text, media_type="text/javascript; charset=utf-8", headers=headers)


@route("GET", "/console.css", "public", "The owner console's style sheet", answer=string("CSS."), media="text/css")
async def console_style(f: Args, call: Call) -> Response:
    text, headers = pages.console_asset("console.css")
    return Response(text, media_type="text/css; charset=utf-8", headers=headers)
