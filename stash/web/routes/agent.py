"""What a capability's agent calls (docs/DESIGN.md, "HTTP surface"): wake,
note, nap, recall, zoom, forget, the sizes and import, each on the memory
its token (or its /m/{name} path) names."""

from __future__ import annotations

from ...core import words
from ...core.blocks import BATCH_MAX
from ...core.errors import Invalid, Malformed
from ...core.recall import MAX_PATTERN_BYTES
from ...service import append, quotas
from ...service.access import Session
from ...service.operation import Event, Limits
from .. import plaintext
from ..dispatch import MAX_IMPORT_BODY, MAX_NAP_BODY, Call
from ..fields import Field, Fields, Special
from ..jsonio import parse_int
from ..schemas import (
    CONFIG,
    DATE,
    LINES,
    NAP_OR_NULL,
    ONE_LINE,
    RUN,
    integer,
    nullable,
    obj,
    ref,
    string,
)
from .declare import NO_FIELDS, Answer, Args, Declarations

AGENT = Declarations()
route, twins = AGENT.route, AGENT.twins

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


def _entries(f: Args) -> int | None:
    """The notes an import adds; None leaves a body that is no list to the service's own refusal."""
    return len(f["entries"]) if isinstance(f["entries"], list) else None


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
