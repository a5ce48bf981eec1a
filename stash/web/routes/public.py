"""What is called without a capability: health, minting an identity, the
documents (OpenAPI, client, skill, reference, shape), the operator's metrics,
the landing page and the owner console's files. Three parts of the table,
set apart by where the table places them."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, PlainTextResponse, Response

from ... import __version__
from ...core import blocks
from ...core.errors import Unavailable
from ...crypto import tokens
from ...service import admission, docs, onboarding
from ...service.ops import replication_status
from .. import pages
from ..dispatch import Call
from ..fields import Field, Fields, Refusal
from ..openapi import document
from ..schemas import (
    integer,
    nullable,
    obj,
    string,
)
from .declare import NO_FIELDS, Answer, Args, Declarations

START = Declarations()  # first in the table: /health, /init
DOCUMENTS = Declarations()  # after the owner's routes: /openapi.json to the landing page
CONSOLE = Declarations()  # last, after the memory routes' copies under /m/{name}

CONTENT_CIPHER = "xchacha20-poly1305"

_SHAPE_RANGE = Refusal("shape.out_of_range", "T must be 0 to 10^15 and lines 1 to 1000.")


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


@START.twins(
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


@START.route(
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


@DOCUMENTS.route(
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
        call.routes, __version__, call.settings, server=None if address == pages.PLACEHOLDER_ADDRESS else address
    )


@DOCUMENTS.route(
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


@DOCUMENTS.route(
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


@DOCUMENTS.twins(
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


@DOCUMENTS.twins(
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


@DOCUMENTS.route(
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


@DOCUMENTS.route("GET", "/", "public", "The landing page", answer=string("The landing page."), media="text/html")
async def landing(f: Args, call: Call) -> Response:
    text, headers = pages.landing_page(call.page_address(call.settings.public_url))
    return HTMLResponse(text, headers=headers)


@CONSOLE.route(
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


@CONSOLE.route(
    "GET", "/console.js", "public", "The owner console's script", answer=string("JavaScript."), media="text/javascript"
)
async def console_script(f: Args, call: Call) -> Response:
    text, headers = pages.console_asset("console.js")
    return Response(text, media_type="text/javascript; charset=utf-8", headers=headers)


@CONSOLE.route(
    "GET", "/console.css", "public", "The owner console's style sheet", answer=string("CSS."), media="text/css"
)
async def console_style(f: Args, call: Call) -> Response:
    text, headers = pages.console_asset("console.css")
    return Response(text, media_type="text/css; charset=utf-8", headers=headers)
