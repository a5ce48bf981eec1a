"""The owner's routes over the identity's many memories (docs/DESIGN.md,
"Memories"): list, create, delete, fork, and erase across them."""

from __future__ import annotations

from ...core.errors import NotFound
from ...core.recall import MAX_PATTERN_BYTES
from ...service import erase_across, memories
from ...service.access import NAME_PATTERN, Session
from ...service.operation import Event
from ..dispatch import Call
from ..fields import Field, Fields
from ..schemas import (
    LINES,
    integer,
    nullable,
    obj,
    ref,
    string,
)
from .declare import FLUSHED, NO_FIELDS, UNOPENED, Answer, Args, Declarations

MEMORIES = Declarations()
route = MEMORIES.route

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
