"""The HTTP surface (docs/DESIGN.md, "HTTP surface"). ROUTES declares every route once: its fields,
answer, scope and own error codes (RouteSpec). Each handler reads its fields
through that declaration, calls one function of the service layer in a worker
thread, and returns its answer."""

from __future__ import annotations

import hmac
import ipaddress
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response

from .. import __version__
from ..core import blocks
from ..core.blocks import BATCH_MAX
from ..core.errors import Forbidden, Invalid, Malformed, NotFound, StashError, TooMany, Unauthorized, Unavailable
from ..core.lines import plural
from ..core.recall import MAX_PATTERN_BYTES
from ..crypto import tokens
from ..crypto.chain import Head
from ..service import audit, grant_terms, idempotency, onboarding, quotas
from ..service.access import Session
from ..service.replica import replica_history_ends
from . import pages, plaintext
from .codes import CODES
from .errors import error_response
from .jsonio import JSON, NAP_BODY_CAP, prefetch_small_body
from .routespec import Field, Fields, Refusal, Special
from .schemas import (
    CONFIG,
    DATE,
    LINES,
    NAP_OR_NULL,
    ONE_LINE,
    RUN,
    SCHEMAS,
    Schema,
    integer,
    nullable,
    obj,
    ref,
    string,
)

CONTENT_CIPHER = "xchacha20-poly1305"
T = TypeVar("T")
DAY_S = 24 * 60 * 60
_TOKEN_WORDS = {"token", "access_token", "auth", "authorization", "key", "api_key", "bearer"}


def _client(request: Request) -> str:
    """The client's address, resolved once per request through the trusted
    proxies (:mod:`stash.web.forwarded`); every per-client decision uses it."""
    resolved = request.scope.get("stash.client")
    if resolved is None:
        peer = request.client.host if request.client else "-"
        resolved = request.app.state.proxies.client(peer, request.headers.getlist("x-forwarded-for"))
        request.scope["stash.client"] = resolved
    return resolved


def _refuse_token_in_query(request: Request) -> None:
    for name, value in request.query_params.multi_items():
        if name.lower() in _TOKEN_WORDS or "stash1_" in value:
            raise Malformed(
                "Tokens are never accepted in a query string (they would end up in logs and histories); "
                "send it as 'Authorization: Bearer …' and revoke the one you exposed.",
                code="auth.token_in_query",
            )


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


def _auth_failed(request: Request) -> Unauthorized:
    request.app.state.limiter.hit("auth", _client(request))
    request.app.state.metrics.event("auth_failed")
    return Unauthorized()


async def _precheck(request: Request) -> None:
    """Authentication before anything of the request is read: the token's
    shape and checksum, then its lookup tag against the in-memory index of
    live tags (service/tag_index.py). An unknown user and a wrong secret end
    here with the same 401 at the same cost, before any field is checked or
    any body byte is read, so no answer tells who exists and a forged
    request cannot make the server buffer a large body. A token whose tag is
    live goes on even when its address spent its failure budget: others'
    failures at a shared address never lock it out. The full check (argon2id,
    unwrap, scope) follows in :func:`_authed`."""
    settings = request.app.state.settings
    vault = request.app.state.vault
    parsed = tokens.parse(_bearer(request) or "")
    verdict: bool | None = False
    if parsed is not None:
        request.scope["stash.user"] = parsed.user_id
        tag = tokens.lookup_tag(parsed.user_id, parsed.secret)
        verdict = vault.tags.verdict(parsed.user_id, tag)
        if verdict is None:  # the first request for this user in this process, or its grants changed
            # A small body is taken in before the hop to a thread: a client that sent its whole request
            # and hung up (its answer lost, to be retried with the same Idempotency-Key) still has its
            # write made, as on every other path. A larger one waits for the verdict.
            await prefetch_small_body(request, settings.max_body)
            verdict = await run_in_threadpool(vault.tags.load_from_disk, parsed.user_id, tag)
    if verdict:
        return
    wait = request.app.state.limiter.blocked_for("auth", _client(request), settings.auth_failures_per_minute)
    if wait:
        raise TooMany(f"Too many failed authentications from this address; wait {wait} s and check the token.", wait)
    if verdict is False:
        if (parsed is not None and request.scope.get("stash.route") == "/rotate"
                and idempotency.HEADER in request.headers):
            return  # a revoked owner token resending its rotation: the route looks for its record
        raise _auth_failed(request)
    # None: the key ring cannot be read; the full check says what is wrong with the store.


def _has_body(request: Request) -> bool:
    length = request.headers.get("content-length")
    return "transfer-encoding" in request.headers or (length is not None and length != "0")


def _pin(request: Request) -> Head | None:
    """The log head the client pinned in ``Stash-Pin``, if any."""
    text = request.headers.get("stash-pin")
    if text is None:
        return None
    head = Head.parse(text)
    if head is None:
        raise Malformed("Stash-Pin must be a head's pin as answered in \"head\": COUNT:DIGEST:STATE (a 64-hex-digit "
                        "digest; COUNT:DIGEST is accepted too).", code="request.bad_pin")
    return head


async def _authed(request: Request, need: str, work: Callable[[Session], T]) -> T:
    """Authenticate fully (grant lookup, argon2id, unwrap, scope), then run
    ``work(session)`` in a worker thread; keys live only inside it."""
    token = _bearer(request)
    vault = request.app.state.vault
    pin = _pin(request)

    def run() -> T:
        with vault.session(token, need, pin) as session:
            return work(session)

    try:
        return await run_in_threadpool(run)
    except Unauthorized:
        raise _auth_failed(request) from None


@dataclass(frozen=True)
class RouteSpec:
    """The one declaration of a route (docs/DESIGN.md, "HTTP surface"): how it is called and
    guarded, what it reads, what it answers, and which refusals are its own.
    Requests are refused from ``fields``, and /openapi.json and the tables
    of API-REFERENCE.md are generated from the whole declaration."""

    method: str
    path: str
    scope: str  # public | read | full | owner | operator
    summary: str
    handler: Callable[[Request], Awaitable[Response]]
    slow: bool = False  # holds a slow slot (fairshare.py): recall, import, export
    fields: Fields | None = None  # None: neither the query string nor the body is read
    answer: Schema | None = None  # None: a body no schema describes (the export archive)
    status: int = 200
    media: str = "application/json"
    # The codes the handler and the service it calls can answer, beyond those of
    # its kind, its fields, idempotency and slow slots (routespec.error_codes).
    errors: tuple[str, ...] = ()
    special: tuple[Special, ...] = ()
    path_params: tuple[tuple[str, Schema], ...] = ()
    idempotent: bool = False  # takes an Idempotency-Key header
    body_cap: str = "max_body"  # the key of body_caps() that caps this route's body
    description: str = ""

    def __post_init__(self) -> None:
        # Refused at import, so a declaration that /openapi.json or the reference could not render never serves.
        if re.findall(r"{(\w+)}", self.path) != [name for name, _ in self.path_params]:
            raise ValueError(f"{self.method} {self.path}: declare each {{name}} of the path in path_params")
        unknown = [c for c in (*self.errors, *(c for s in self.special for c in s.codes)) if c not in CODES]
        if unknown:
            raise ValueError(f"{self.method} {self.path}: codes missing from stash/web/codes.py: {unknown}")

    async def endpoint(self, request: Request) -> Response:
        request.scope["stash.route"] = self.path
        request.scope["stash.spec"] = self
        handled = False
        try:
            _refuse_token_in_query(request)
            if self.scope not in ("read", "full", "owner"):
                handled = True
                return self._negotiated(request, await self.handler(request))
            await _precheck(request)
            # The slot is taken before the body is read, so a tenant's bodies in memory are bounded too.
            with request.app.state.shares.hold(request.scope.get("stash.user", ""), self.slow):
                handled = True
                return self._negotiated(request, await self.handler(request))
        except StashError as err:
            request.scope["stash.error"] = err.code
            resp = self._negotiated(request, error_response(err))
            if not handled and _has_body(request):
                # Refused before its body was read: close the connection after the answer rather than
                # take in and throw away the rest of a body nobody authenticated (up to 16 MiB).
                resp.headers["Connection"] = "close"
            return resp


    def _negotiated(self, request: Request, response: Response) -> Response:
        """The answer as the client asked: JSON, or memo's plain text when
        its Accept prefers text/plain (plaintext.py)."""
        if self.media == "application/json" and plaintext.wants_text(request):
            return plaintext.as_text(self.path, response)
        return response


def twins(path: str, scope: str, summaries: tuple[str, str], handler: Callable[[Request], Awaitable[Response]],
          fields: Fields, description: str, **kw: Any) -> tuple[RouteSpec, RouteSpec]:
    """A read-only route and its POST twin (docs/DESIGN.md, "HTTP surface"), sharing one declaration
    of their fields: query parameters of the one, JSON body of the other."""
    return (RouteSpec("GET", path, scope, summaries[0], handler, fields=fields, description=description, **kw),
            RouteSpec("POST", path, scope, summaries[1], handler, fields=fields,
                      description=description + " POST twin of the GET route: the same fields as a JSON body.",
                      **kw))


def body_caps(settings) -> dict[str, int]:
    """This server's body caps, by the names routes declare as ``body_cap``."""
    return {"max_body": settings.max_body, "max_import_body": settings.max_import_body,
            "max_nap_body": max(settings.max_body, NAP_BODY_CAP)}


async def _fields(request: Request) -> dict[str, Any]:
    """The request's fields, read and refused as its route declares them."""
    spec: RouteSpec = request.scope["stash.spec"]
    assert spec.fields is not None, f"{spec.method} {spec.path} declares no fields"
    cap = body_caps(request.app.state.settings)[spec.body_cap]
    return await spec.fields.read(request, spec.method, cap)


def _idempotency_key(request: Request) -> str | None:
    return idempotency.parse_key(request.headers.getlist(idempotency.HEADER))


def _once(request: Request, answer: idempotency.Answer, status_code: int = 200) -> Response:
    """The answer, marked when it is the replay of an earlier request's."""
    headers = {}
    if answer.replayed:
        headers[idempotency.REPLAYED_HEADER] = "true"
        request.app.state.metrics.event("idempotent_replay")
    return JSON(answer.body, status_code=status_code, headers=headers)


# ---------------------------------------------------------------- public


async def health(request: Request) -> Response:
    """Liveness; with ``?ready=1`` also readiness: 503 when the data folder
    cannot be written."""
    probe = (await _fields(request))["ready"]
    vault = request.app.state.vault
    answer = {"ok": True, "version": __version__, "content_cipher": CONTENT_CIPHER, "file_cipher": vault.file_cipher,
              "ready": None}
    if probe:
        if not await run_in_threadpool(vault.ready):
            raise Unavailable("The server cannot write its data folder (full, read-only or missing), so writes "
                              "would fail; send traffic elsewhere and tell the operator.", code="ready.unwritable")
        answer["ready"] = True
    return JSON(answer)


async def init(request: Request) -> Response:
    settings = request.app.state.settings
    limiter = request.app.state.limiter
    body = await _fields(request)  # a non-string invite is refused in every mode, so it never goes unseen
    if settings.init == "off":
        raise Forbidden("This server does not mint identities; ask its operator for one.", code="init.disabled")
    client = _client(request)
    if settings.init == "invite":
        wait = limiter.blocked_for("auth", client, settings.auth_failures_per_minute)
        if wait:
            raise TooMany(f"Too many wrong invites from this address; wait {wait} s.", wait)
        invite = body.get("invite")
        expected = (settings.invite_secret or "").encode()
        if not isinstance(invite, str) or not hmac.compare_digest(invite.encode(), expected):
            limiter.hit("auth", client)
            raise Forbidden("This server mints identities by invitation only; send the operator's invite as "
                            "\"invite\".", code="init.invite_required")
    wait = limiter.blocked_for("init", client, settings.init_per_minute)
    if wait:
        raise TooMany(f"Too many identities minted from this address; wait {wait} s.", wait)
    wait = limiter.blocked_for("init_day", client, settings.init_per_day, DAY_S)
    if wait:
        raise TooMany(f"This address minted the {plural(settings.init_per_day, 'identity')} a day this "
                      "server allows; "
                      f"wait {wait} s, or reuse a token you already have.", wait, code="quota.identities")
    address = _block_address(request, body.get("url"))
    if address is None:
        raise Invalid(_BAD_URL, code="init.bad_url")
    limiter.hit("init", client)
    limiter.hit("init_day", client, DAY_S)
    ident = await run_in_threadpool(request.app.state.vault.create_identity)
    answer = onboarding.init_answer(ident, address, CONTENT_CIPHER)
    return JSON(answer, status_code=201)


_BAD_URL = ("url must be the server's plain http(s) address, like https://stash.example (letters, digits and .-_~%/ "
            "in its path; no spaces, quotes or other characters).")


def _block_address(request: Request, url: object) -> str | None:
    """The address an AGENTS.md block names: ``url`` from the body, else the
    server's --url, else the address this request came in on (a Host header
    that is not a plain host[:port] never reaches the block: pages.page_address);
    None when the address given is refused. Checked as --url and the Host
    header are: the address goes into a block pasted into AGENTS.md and into
    curl commands there, so a newline, quote, backquote or $( ) must never
    reach it."""
    url = url or request.app.state.settings.public_url
    if url is not None and (not isinstance(url, str) or len(url) > 2000 or not pages.is_safe_address(url.rstrip("/"))):
        return None
    return url or pages.page_address(None, request.url.scheme, request.headers.get("host"))


async def shape(request: Request) -> Response:
    data = await _fields(request)
    T, budget = data["T"], data["lines"]
    cover = blocks.cover(T, budget)
    return JSON({"T": T, "lines": budget, "blocks": [[lo, hi - 1] for lo, hi in cover]})


async def openapi(request: Request) -> Response:
    from .openapi import document

    settings = request.app.state.settings
    caps = body_caps(settings)
    address = pages.page_address(settings.public_url, request.url.scheme, request.headers.get("host"))
    # A Host that is not a plain host[:port] names no server rather than a made-up one.
    return JSON(document(ROUTES, __version__, caps, server=None if address == pages.PLACEHOLDER_ADDRESS else address))


async def client(request: Request) -> Response:
    return PlainTextResponse(pages.client_source(), media_type="text/x-python; charset=utf-8",
                             headers={"Content-Disposition": 'attachment; filename="stash"'})


async def skill(request: Request) -> Response:
    from ..service import docs

    await _fields(request)
    return PlainTextResponse(docs.skill(), media_type="text/markdown; charset=utf-8")


async def reference(request: Request) -> Response:
    from ..service import docs

    await _fields(request)
    return PlainTextResponse(docs.reference(), media_type="text/markdown; charset=utf-8")


async def landing(request: Request) -> Response:
    address = pages.page_address(request.app.state.settings.public_url, request.url.scheme,
                                 request.headers.get("host"))
    text, headers = pages.landing_page(address)
    return HTMLResponse(text, headers=headers)


async def metrics(request: Request) -> Response:
    settings = request.app.state.settings
    if settings.operator_token:
        given = _bearer(request) or ""
        if not hmac.compare_digest(given.encode(), settings.operator_token.encode()):
            # Guesses of the operator token share the address's failure budget; the right token never waits.
            limiter = request.app.state.limiter
            wait = limiter.blocked_for("auth", _client(request), settings.auth_failures_per_minute)
            if wait:
                raise TooMany(f"Too many failed authentications from this address; wait {wait} s.", wait)
            limiter.hit("auth", _client(request))
            raise Forbidden("Metrics need the operator token as 'Authorization: Bearer …'.", code="auth.operator")
    else:
        try:
            loopback = ipaddress.ip_address(_client(request)).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise Forbidden("Metrics are served on loopback only unless the operator sets a metrics token.",
                            code="auth.operator")
    return PlainTextResponse(request.app.state.metrics.render(), media_type="text/plain; version=0.0.4")


# ---------------------------------------------------------------- memory


async def wake(request: Request) -> Response:
    data = await _fields(request)
    part, T = data["part"], data["T"]
    return JSON(await _authed(request, "read", lambda s: s.memory.wake(part, T)))


def _room(request: Request, session, adding: int) -> None:
    """The operator's quotas (service/quotas.py), checked inside the write."""
    settings = request.app.state.settings
    quotas.check_room(session.memory.mf.count(), session.files.folder, adding, settings.quota_memories,
                      settings.quota_bytes)


async def note(request: Request) -> Response:
    key = _idempotency_key(request)
    data = await _fields(request)

    def write(s) -> dict:
        _room(request, s, 1)
        return s.memory.note(data["text"])

    return _once(request, await _authed(request, "full", lambda s: idempotency.memory_write(
        s, key, "POST /note", data, lambda: write(s))))


async def nap(request: Request) -> Response:
    key = _idempotency_key(request)
    data = await _fields(request)
    return _once(request, await _authed(request, "full", lambda s: idempotency.memory_write(
        s, key, "POST /nap", data, lambda: s.memory.nap(data.get("block"), data.get("text"), data.get("batch"),
                                                        data.get("summaries")))))


async def recall(request: Request) -> Response:
    data = await _fields(request)
    return JSON(await _authed(request, "read", lambda s: s.memory.recall(data["q"], data["before"])))


async def zoom(request: Request) -> Response:
    data = await _fields(request)
    return JSON(await _authed(request, "read", lambda s: s.memory.zoom(data["block"])))


async def forget(request: Request) -> Response:
    data = await _fields(request)
    return JSON(await _authed(request, "full", lambda s: audit.forget(s, data["block"])))


async def config_get(request: Request) -> Response:
    await _fields(request)
    return JSON(await _authed(request, "read", lambda s: s.memory.config()))


async def config_set(request: Request) -> Response:
    data = await _fields(request)
    return JSON(await _authed(request, "full", lambda s: audit.set_config(s, data)))


async def import_(request: Request) -> Response:
    key = _idempotency_key(request)
    data = await _fields(request)

    def write(s) -> dict:
        if isinstance(data["entries"], list):
            _room(request, s, len(data["entries"]))
        return audit.import_entries(s, data["entries"])

    return _once(request, await _authed(request, "full", lambda s: idempotency.memory_write(
        s, key, "POST /import", data, lambda: write(s))))


async def export(request: Request) -> Response:
    from ..service.export import export_archive

    await _fields(request)
    archive = await _authed(request, "owner", lambda s: audit.export(s, export_archive))
    return Response(archive, media_type="application/gzip",
                    headers={"Content-Disposition": 'attachment; filename="optmem-memory.tar.gz"'})


# ---------------------------------------------------------------- owner


async def grants_list(request: Request) -> Response:
    await _fields(request)
    vault = request.app.state.vault
    return JSON(await _authed(request, "owner", lambda s: {"grants": vault.list_grants(s)}))


async def grants_mint(request: Request) -> Response:
    key = _idempotency_key(request)
    data = await _fields(request)
    scope = data["scope"]
    if scope not in ("read", "full"):
        raise Invalid("scope must be \"read\" or \"full\"; ownership is never transferable.", code="grants.bad_scope")
    label = grant_terms.check_label(data.get("label"))
    expires = grant_terms.check_expires(data.get("expires"), datetime.now(UTC))
    address = _block_address(request, data.get("url"))
    if address is None:
        raise Invalid(_BAD_URL, code="grants.bad_url")
    vault = request.app.state.vault

    def mint(s) -> dict:
        grant_id, token = vault.mint_grant(s, scope, label, expires)
        audit.record(s, "mint", grant=grant_id, scope=scope)
        row = next(g for g in vault.list_grants(s) if g["id"] == grant_id)
        shown = ("shown once and never stored" if key is None else
                 "shown once, and again only to an exact retry with the same Idempotency-Key within 24 hours "
                 "(from a copy sealed under the owner's token); it is never stored in the clear")
        return {"id": grant_id, "scope": scope, "label": label, "created": row["created"], "expires": expires,
                "token": token,
                "note": f"This token is {shown}; hand it to the agent it is for as STASH_TOKEN, with the block "
                        f"in prompt for its AGENTS.md; revoke it with DELETE /grants/{grant_id}.",
                "prompt": onboarding.agents_block(address.rstrip("/"), scope)}

    answer = await _authed(request, "owner", lambda s: idempotency.keyring_write(
        s, key, "POST /grants", data, lambda: mint(s)))
    return _once(request, answer, status_code=201)


async def grants_revoke(request: Request) -> Response:
    raw = request.path_params["grant_id"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise NotFound("No such capability; list them with GET /grants.", code="grants.unknown")
    key = _idempotency_key(request)
    vault = request.app.state.vault
    return _once(request, await _authed(request, "owner", lambda s: audit.revoke(s, vault, int(raw), key)))


async def rotate(request: Request) -> Response:
    key = _idempotency_key(request)
    await _fields(request)
    vault = request.app.state.vault
    try:
        return _once(request, await _authed(request, "owner", lambda s: audit.rotate(s, vault, key)))
    except Unauthorized:
        # The old token of a rotation that committed is revoked: resent with
        # its Idempotency-Key, it still gets the answer it lost.
        token = _bearer(request)
        replay = None if key is None else await run_in_threadpool(vault.replay_rotation, token, key)
        if replay is None:
            raise
        return _once(request, idempotency.Answer(replay, replayed=True))


async def erase(request: Request) -> Response:
    key = _idempotency_key(request)
    data = await _fields(request)
    answer = await _authed(request, "owner", lambda s: audit.erase(s, data["ids"], key))
    if not answer.replayed:
        request.app.state.metrics.event("erase")
    if request.app.state.settings.replicate is not None:
        answer = idempotency.Answer({**answer.body, "replicas_until": replica_history_ends(answer.body["at"])},
                                    answer.replayed)
    return _once(request, answer)


async def audit_trail(request: Request) -> Response:
    await _fields(request)
    return JSON(await _authed(request, "owner", audit.trail))


async def erasures(request: Request) -> Response:
    await _fields(request)
    return JSON(await _authed(request, "owner", lambda s: s.memory.erasures()))


async def destroy(request: Request) -> Response:
    await _fields(request)
    vault = request.app.state.vault
    return JSON(await _authed(request, "owner", lambda s: audit.destroy(s, vault, vault.data_dir)))


# ---------------------------------------------------------------- the declarations

FLUSHED = {"type": "boolean", "description": "`true`: the write-ahead log holding the destroyed keys was flushed "
           "into the file and emptied; `false`: the action is in force, the flush is still pending (every later "
           "close of the file retries it; a resend with the same Idempotency-Key tries again)."}

_TEXT_CODES = ("text.type", "text.multiline", "text.control", "text.bidi", "text.invisible", "text.empty",
               "text.too_long", "text.reserved")
_BLOCK_CODES = ("block.invalid", "block.beyond_log")
_SHAPE_RANGE = Refusal("shape.out_of_range", "T must be 0 to 10^15 and lines 1 to 1000.")

HEALTH_FIELDS = Fields((
    Field("ready", integer(0, 1), "`1`: also probe readiness — create, write, fsync and remove a temporary file "
          "(`.ready-*`) in the data folder's `users/`; `0`: liveness only", whole=True, default=0, default_doc="`0`",
          refuse=Refusal("request.bad_value", "ready must be 0 or 1.")),
))
WAKE_FIELDS = Fields((
    Field("part", integer(1), "which part to read, from 1", whole=True, default=1, default_doc="1"),
    Field("T", integer(0), "the snapshot to cut the parts from; pass the `T` of part 1 when fetching later parts",
          whole=True, nullable=True, default_doc="the log's size now"),
))
RECALL_FIELDS = Fields((
    Field("q", string(minLength=1, maxLength=MAX_PATTERN_BYTES),
          f"the pattern: a regular expression (RE2 syntax, always case-insensitive) of 1 to {MAX_PATTERN_BYTES} "
          "bytes of UTF-8; see [Recall syntax](#recall-syntax)",
          required=True, missing="Missing q: send the pattern to search for."),
    Field("before", integer(0), "search only the memories before this id: the `more` of the previous page",
          whole=True, nullable=True, default_doc="the whole log"),
), plain=plaintext.recall_body,
   plain_doc="the pattern, exactly as its first line holds it; for a later page, a second line `before N`")
ZOOM_FIELDS = Fields((
    Field("block", ref("BlockId"), "the block to open", required=True,
          missing="Missing block: send the block to open, as a #lo-hi line of the wake names it."),
), plain=plaintext.zoom_body, plain_doc="the block, like `16-31`")
SHAPE_FIELDS = Fields((
    Field("T", integer(0, 10**15), "how many memories", whole=True, default=0, default_doc="0", refuse=_SHAPE_RANGE),
    Field("lines", integer(1, 1000), "the line budget", whole=True, default=96, default_doc="96",
          refuse=_SHAPE_RANGE),
))
NO_FIELDS = Fields()

ROUTES: list[RouteSpec] = [
    *twins(
        "/health", "public",
        ("Liveness, version and this host's ciphers", "Liveness and readiness (POST twin of GET /health)"),
        health, HEALTH_FIELDS,
        "Liveness: 200 whenever the process serves HTTP. With ready=1, readiness for a load balancer: "
        "503 when the data folder cannot be written (full disk, read-only mount, folder gone).",
        answer=obj({"ok": {"const": True}, "version": string("the server's version, e.g. `0.1.0`"),
                    "content_cipher": {"const": "xchacha20-poly1305", "description": "how every row is sealed"},
                    "file_cipher": {"enum": ["sqlcipher", "none"], "description": "whether new memory files are "
                                                                                  "also encrypted whole on this host"},
                    "ready": {"enum": [True, None], "description": "`true`: the probe passed; `null`: readiness "
                                                                  "was not asked"}}),
        errors=("ready.unwritable",),
    ),
    RouteSpec(
        "POST", "/init", "public", "Mint an identity; the token is shown once", init, status=201,
        fields=Fields((
            Field("url", string(maxLength=2000, pattern="^https?://"),
                  "an `http://…` or `https://…` address, written into `prompt`. Default: the server's `--url`; "
                  "without one, the scheme, host "
                  "and port this request was made to (a `Host` header that is not a plain `host[:port]` is "
                  "replaced by `https://stash.example`, as on the landing page)"),
            Field("invite", string(), "the operator's invite secret; required when the server runs "
                  "`--init invite`, ignored otherwise",
                  refuse=Refusal("request.bad_value", "invite must be a string: the operator's invite secret.")),
        )),
        answer=obj({
            "user_id": string("the memory's public id: 16 hex digits", pattern="^[0-9a-f]{16}$"),
            "token": string("the owner capability, the only key to this memory. **Shown once, never stored**",
                            pattern=f"^{tokens.TOKEN_PATTERN}$"),
            "content_cipher": {"const": "xchacha20-poly1305"},
            "file_cipher": {"enum": ["sqlcipher", "none"], "description": "the cipher of this memory's file"},
            "note": string("what to do with the token"),
            "prompt": string("the block to paste into AGENTS.md (`skill/AGENTS.md` with `{url}` and the byte limit "
                             "filled in)"),
        }),
        errors=("init.disabled", "init.invite_required", "init.bad_url", "rate_limited", "quota.identities",
                "store.read_only", "store.unreadable", "store.full"),
        description="Mints an identity: a new, empty memory and its owner token.",
    ),
    *twins(
        "/wake", "read", ("The wake document, one part at a time", "The wake (POST twin of GET /wake)"), wake,
        WAKE_FIELDS,
        "The bounded, hierarchical read of the whole log, cut into parts. Refused (409) only when the document "
        "needs a summary that is not written yet.",
        answer=obj({
            "T": integer(0, description="the snapshot this part was rendered from"),
            "part": integer(1, description="this part's number"),
            "parts": integer(1, description="how many parts the document has"),
            "lines": LINES | {"description": "this part's lines, oldest first"},
            "awake": {"type": "boolean", "description": "`true` on the last part only"},
            "nap": NAP_OR_NULL | {"description": "the due compression; only ever set on the last part"},
            "next": nullable(string("the curl command of `run[0]`, which fetches the next part; `null` on the last "
                                    "part")),
            "message": string("last part: `You are awake.`; other parts: `Not awake yet: read the next part.`; "
                              "empty memory: how to record the first memory (the command is in `run`), then "
                              "`You are awake.`. For a read capability, `You are awake.` follows a line saying it "
                              "is read-only and what to do instead of noting or napping (tell the user; recall)"),
            "run": RUN | {"description": "the next part's request (`{\"part\", \"T\"}`) on every part but the "
                                         "last; for an empty memory, the note to record the first one"},
            "head": ref("Head") | {"description": "the log's head **now** (not at the snapshot `T`), on every part: "
                                                  "see [The log head](#the-log-head-and-stash-pin)"},
        }),
        errors=("wake.bad_t", "wake.no_part"),
        special=(Special(409, "a summary the document needs is not written yet", "WakeRefusal",
                         ("wake.needs_nap",)),),
    ),
    RouteSpec(
        "POST", "/note", "full", "Append one memory", note, idempotent=True,
        fields=Fields((
            Field("text", string(**ONE_LINE), "one line of at most `ENTRY_CHARS` bytes of UTF-8, checked as in "
                  "[Memory and summary text](#memory-and-summary-text); surrounding spaces are removed",
                  required=True),
        ), plain=plaintext.note_body, plain_doc="the memory: one line"),
        answer=obj({"id": integer(0, description="The new memory's position in the log."), "nap": NAP_OR_NULL,
                    "head": ref("Head") | {"description": "The log's head just after this memory: pin it."}}),
        errors=("quota.memories", "quota.bytes", *_TEXT_CODES),
        description="Appends one memory dated with the server's UTC day. `nap` is the compression now due, if any.",
    ),
    RouteSpec(
        "POST", "/nap", "full", "Ask what is due, or settle the due block", nap, idempotent=True,
        body_cap="max_nap_body",
        fields=Fields((
            Field("block", ref("BlockId"), "the block being summarised; absent or `null` (with no `text`): ask "
                  "what is due"),
            Field("text", string(**ONE_LINE), "the summary: one line of at most `ENTRY_CHARS` bytes, checked as "
                  "memory text"),
            Field("batch", integer(1, BATCH_MAX), "list up to this many due blocks that can be written at once"),
            Field("summaries", {"type": "array", "minItems": 1, "maxItems": BATCH_MAX,
                                "items": obj({"block": ref("BlockId"),
                                              "text": string("One line of at most ENTRY_CHARS bytes.",
                                                             **ONE_LINE)})},
                  "summaries to settle in this order, all or nothing"),
        ), plain=plaintext.nap_body,
           plain_doc="`lo-hi text` lines: none asks what is due, one settles that block, several settle them in "
                     "order (a batch)"),
        answer={"anyOf": [
            obj({"saved": nullable(ref("BlockId")) | {"description": "The block saved; null when nothing was "
                                                                     "written."},
                 "nap": NAP_OR_NULL | {"description": "What is due now (after saving, if something was saved)."},
                 "message": string()}, description="The answer to {} or {block, text}."),
            obj({"saved": {"type": "null"},
                 "nap": NAP_OR_NULL | {"description": "The first pending block."},
                 "batch": {"type": "array", "maxItems": BATCH_MAX, "items": ref("BatchItem"),
                           "description": "The due blocks that can be written at once, in settling order."},
                 "prompt": nullable(string("The instruction, ending with the command that settles them all.")),
                 "run": RUN | {"description": "The command that settles them all: one `block text` line per "
                                              "block. Empty when nothing is due."},
                 "message": string()}, description="The answer to {batch: k}."),
            obj({"saved": {"type": "array", "maxItems": BATCH_MAX, "items": ref("BlockId"),
                           "description": "The blocks this request wrote, in order."},
                 "nap": NAP_OR_NULL | {"description": "What is due now."},
                 "message": string()}, description="The answer to {summaries: [...]}."),
        ]},
        errors=("nap.missing_block", "nap.mixed", "nap.bad_batch", "nap.bad_summaries", *_BLOCK_CODES, *_TEXT_CODES),
        special=(Special(409, "the block sent is not the one due", "NapConflict", ("nap.wrong_block",)),),
        description="An empty body or {} asks what is due; {block, text} settles the due block; {batch: k} lists up "
                    "to k due blocks that can be written at once; {summaries: [...]} settles them in order, all or "
                    "nothing. A block that is already settled answers 200 and writes nothing.",
    ),
    *twins(
        "/recall", "read", ("Regex search of the verbatim log", "Regex search (POST twin of GET /recall)"), recall,
        RECALL_FIELDS,
        "Searches the verbatim log (never the summaries), each memory rendered as `#i DATE text`. A search that "
        "runs past its time bound (5 s plus 10 µs per memory) is refused with recall.too_slow.",
        slow=True,
        answer=obj({
            "matches": {**LINES, "description": "the **newest** matching memories (of those before `before`, when "
                                                "given) whose lines fit in `PART_CHARS` bytes (each line costs its "
                                                "UTF-8 bytes + 1), returned oldest first. A single matching line "
                                                "longer than `PART_CHARS` leaves `matches` empty"},
            "total": integer(0, description="how many memories match in the range searched: the whole log, or the "
                                            "memories before `before`"),
            "more": nullable(integer(0)) | {"description": "when older matches were left out, the `before` of the "
                                                           "next page (the id of the oldest match shown); `null` "
                                                           "when this page holds every match of its range"},
            "message": string("the count line, as OptMem prints it — `15 matches.`, `1 match.`, `No match.` "
                              "(`… before #N.` on a later page) — and, when the answer was cut, that the command in "
                              "`run` fetches the older matches"),
            "run": RUN | {"description": "when `more` is set: the next older page, with `<the same regex>` to fill "
                                         "in; else empty"}}),
        errors=("recall.bad_pattern", "recall.too_slow"),
    ),
    *twins(
        "/zoom", "read", ("Open a block into its two halves", "Open a block (POST twin of GET /zoom)"), zoom,
        ZOOM_FIELDS,
        "The block's two halves as the wake would show them; a half wholly beyond the log is omitted.",
        answer=obj({"block": ref("BlockId"), "lines": {**LINES, "minItems": 1, "maxItems": 2}}),
        errors=_BLOCK_CODES,
    ),
    RouteSpec(
        "POST", "/forget", "full", "Drop a summary, its containing blocks and every later one of their sizes",
        forget,
        fields=Fields((
            Field("block", ref("BlockId"), "the block whose summary to drop; it must be complete (`hi ≤ T`)",
                  required=True),
        )),
        answer=obj({"dropped": {"type": "array", "items": ref("BlockId"), "minItems": 1,
                                "description": "Every summary dropped, smallest first."},
                    "nap": NAP_OR_NULL | {"description": "The compression now due: the first dropped summary to "
                                                         "write again."}}),
        errors=("forget.no_summary", *_BLOCK_CODES),
        description="Drops the block's summary, the summary of the block containing it at each larger size, and "
                    "every later summary of each of those sizes, so each size's summaries stay a dense prefix "
                    "(docs/DESIGN.md, \"Forget\"). The log is untouched; the next naps write them again, and the "
                    "answer carries the first of those naps.",
    ),
    RouteSpec("GET", "/config", "read", "The sizes and their defaults", config_get, fields=NO_FIELDS,
              answer=CONFIG),
    RouteSpec(
        "POST", "/config", "full", "Change sizes; null restores a default", config_set,
        fields=Fields(open_schema=ref("SizeChanges"), empty_ok=False),
        answer=CONFIG,
        errors=("config.empty", "config.unknown_name", "config.out_of_range"),
        description="Changes sizes; nothing is recomputed. Answers the sizes now in force, like GET /config.",
    ),
    RouteSpec(
        "POST", "/import", "full", "Bulk-append dated memories, oldest first", import_, slow=True, idempotent=True,
        body_cap="max_import_body",
        fields=Fields((
            Field("entries", {
                "type": "array", "minItems": 1,
                "items": obj({"date": string("A real calendar date, not in the future (UTC).", pattern=DATE,
                                             format="date"),
                              "text": string("One line of at most ENTRY_CHARS bytes.", **ONE_LINE)}),
            }, "the memories, oldest first, each with exactly `date` (`YYYY-MM-DD`) and `text`; the whole batch or "
               "nothing (see [Import rules](#import-rules))", required=True),
        ), plain=plaintext.import_body, plain_doc="`YYYY-MM-DD text` lines, oldest first"),
        answer=obj({"first": integer(0, description="id of the first memory imported"),
                    "last": integer(0, description="id of the last memory imported"),
                    "pending": integer(0, description="how many compressions are due now"),
                    "head": ref("Head") | {"description": "the log's head just after the batch: pin it"},
                    "run": RUN | {"description": "when compressions are due, the request that hands over the "
                                                 "first (`{}` to POST /nap); else empty"}}),
        errors=("quota.memories", "quota.bytes", "import.empty"),
        special=(Special(422, "or an entry was refused (`index` names it) and nothing was imported", "IndexedError",
                         ("import.bad_entry", "import.bad_date", "import.out_of_order", "import.before_log",
                          *_TEXT_CODES)),),
        description="Bulk-appends dated memories, validating every entry before writing any.",
    ),
    RouteSpec(
        "GET", "/grants", "owner", "Every capability, live and revoked; never a secret", grants_list,
        fields=NO_FIELDS,
        answer=obj({"grants": {"type": "array", "items": ref("Grant"),
                               "description": "Oldest first, owner included."}}),
        description="Every capability of this memory, live and revoked. Never a token or a secret.",
    ),
    RouteSpec(
        "POST", "/grants", "owner", "Mint a read or full capability; its token is shown once", grants_mint,
        status=201, idempotent=True,
        fields=Fields((
            Field("scope", {"enum": ["read", "full"]}, "`read` may look; `full` may also write", required=True),
            Field("label", string(minLength=1), "what it is for: 1 to 64 bytes of printable text (no control or "
                  "separator character; surrounding spaces removed)"),
            Field("expires", string(), "an RFC 3339 time in UTC after now, like `2027-01-31T18:00:00Z`; from then "
                  "on the token is refused like a revoked one"),
            Field("url", string(maxLength=2000, pattern="^https?://"),
                  "the address written into `prompt`, as for `POST /init`. Default: the server's `--url`, else the "
                  "address this request was made to"),
        )),
        answer=obj({
            "id": integer(1), "scope": {"enum": ["read", "full"]}, "label": nullable(string()),
            "created": ref("Timestamp"), "expires": nullable(ref("Timestamp")),
            "token": string("The new capability. Shown once, never stored.", pattern=f"^{tokens.TOKEN_PATTERN}$"),
            "note": string("what to do with the token"),
            "prompt": string("the block for the AGENTS.md of the agent the capability is for: `skill/AGENTS.md` for "
                             "`full`; for `read`, `skill/AGENTS-read.md`, which says the capability is read-only "
                             "and has no note or nap section"),
        }),
        errors=("grants.busy", "grants.bad_scope", "grants.bad_label", "grants.bad_expires", "grants.bad_url"),
        description="Mints a capability over this memory: the current key epoch's key sealed to a key pair "
                    "derived from a fresh secret. Owner is never transferable: no route mints an owner capability.",
    ),
    RouteSpec(
        "DELETE", "/grants/{grant_id}", "owner", "Revoke one capability: a new key epoch it never reaches",
        grants_revoke,
        path_params=(("grant_id", integer(1, description="The `id` from GET /grants.")),),
        answer=obj({"id": integer(1), "scope": {"enum": ["read", "full"]}, "revoked": ref("Timestamp"),
                    "already": {"type": "boolean", "description": "True when it was revoked before this call."},
                    "also_revoked": {"type": "array", "items": integer(1),
                                     "description": "Capabilities that had not moved to key epochs (not used since "
                                                    "the upgrade) and end with this revocation."},
                    "epoch": integer(0, description="The store's key epoch after this call."),
                    "flushed": FLUSHED}),
        errors=("grants.unknown", "grants.owner", "grants.busy"), idempotent=True,
        description="Revokes one capability: destroys its key columns (its listing row stays) and starts a new "
                    "key epoch that only the other live capabilities reach, so nothing written from now on opens "
                    "with it, whatever copies of the files it is given. Revoking a revoked capability answers 200 "
                    "with `already: true`.",
    ),
    RouteSpec(
        "POST", "/rotate", "owner", "A new owner token; the old one ends as a revoked one does", rotate,
        fields=NO_FIELDS,
        answer=obj({"id": integer(1, description="The new owner capability."), "scope": {"const": "owner"},
                    "created": ref("Timestamp"),
                    "token": string("The new owner token. Shown once, never stored.",
                                    pattern=f"^{tokens.TOKEN_PATTERN}$"),
                    "revoked": integer(1, description="The owner capability this call ended."),
                    "also_revoked": {"type": "array", "items": integer(1),
                                     "description": "Capabilities that had not moved to key epochs and end with it."},
                    "epoch": integer(1, description="The store's key epoch after this call."),
                    "note": string(),
                    "update": {"const": "STASH_TOKEN",
                               "description": "The environment variable to set to `token` wherever the old owner "
                                              "token is set."},
                    "message": string("What to do next: update `STASH_TOKEN` everywhere the old token is set."),
                    "flushed": FLUSHED}),
        errors=("grants.busy",), idempotent=True,
        description="Rotates the owner token: a new owner capability in a new key epoch, and the calling one "
                    "ends as a revoked one does. A read or full capability is rotated by minting a new one and "
                    "revoking the old.",
    ),
    RouteSpec(
        "POST", "/erase", "owner", "Shred individual memories for good; answers a receipt", erase,
        fields=Fields((
            Field("ids", {"type": "array", "minItems": 1, "maxItems": 10_000,
                          "items": integer(0, description="A memory id, below T.")},
                  "the memories to erase, each `0 ≤ id < T`; duplicates are allowed", required=True),
        )),
        answer=obj({**SCHEMAS["Receipt"]["properties"], "flushed": FLUSHED},
                   required=[*SCHEMAS["Receipt"]["required"], "flushed"]),
        errors=("erase.bad_ids", "erase.unknown_id"), idempotent=True,
        description="Shreds memories for good: each one's key is destroyed, its line stays as `[erased]` with "
                    "its date, and only the summaries that contain one of them are dropped: the blocks on its path "
                    "to the root, at most one per level (the next naps rewrite them). Answers a receipt.",
    ),
    RouteSpec(
        "GET", "/erasures", "owner", "Erasure receipts, never content", erasures, fields=NO_FIELDS,
        answer=obj({"erasures": {"type": "array", "items": ref("Receipt")}}),
        description="Every erasure receipt, oldest first. Never any content.",
    ),
    RouteSpec(
        "GET", "/audit", "owner", "Who did what and when, never content", audit_trail, fields=NO_FIELDS,
        answer=obj({"events": {"type": "array", "items": obj({
            "id": integer(1), "at": ref("Timestamp"),
            "grant": integer(1, description="The capability that did it (see GET /grants)."),
            "event": {"enum": ["mint", "revoke", "rotate", "erase", "export", "config", "forget", "import"]},
            "detail": {"type": "object", "description": "Numbers, block ids and size names only; never content."},
        })}}),
        description="The audit trail, oldest first: which capability minted, revoked, rotated, erased, exported, "
                    "changed the config, forgot or imported, and when. Never any memory text.",
    ),
    RouteSpec(
        "DELETE", "/store", "owner", "Destroy the whole memory; answers a receipt", destroy, fields=NO_FIELDS,
        answer=obj({"user_id": string(pattern="^[0-9a-f]{16}$"), "destroyed": {"const": True},
                    "memories": nullable(integer(0, description="How many memories the store held.")),
                    "at": ref("Timestamp"),
                    "receipt": string("Where, under the server's data folder, the operator finds this receipt "
                                      "(receipts/deletions.jsonl).")}),
        description="Destroys the whole memory: every wrapped key and the memory file. Every token of it stops "
                    "working at once. There is no undo.",
    ),
    RouteSpec(
        "GET", "/export", "owner", "The whole memory as an OptMem-readable tar.gz", export, slow=True,
        fields=NO_FIELDS, media="application/gzip",
        description="A tar.gz holding memory/LOG.txt, memory/TREE/<size>, memory/config and README.txt, "
                    "readable by OptMem with MEMORY_DIR=memory, and manifest.json: counts, the SHA-256 of every "
                    "other member and one digest over them (GET /reference, Export archive).",
    ),
    RouteSpec(
        "GET", "/openapi.json", "public", "This server's OpenAPI 3.1 document", openapi,
        answer={"type": "object", "description": "This document.",
                "required": ["openapi", "info", "paths", "components"],
                "properties": {"openapi": {"const": "3.1.0"}, "info": {"type": "object"},
                               "servers": {"type": "array", "description": "This server's public address: --url, "
                                                                           "else the address it was called at."},
                               "paths": {"type": "object"}, "components": {"type": "object"}},
                "additionalProperties": False},
    ),
    RouteSpec("GET", "/client", "public", "The single-file stash client", client,
              answer=string("The client's Python source."), media="text/x-python"),
    RouteSpec(
        "GET", "/skill", "public", "The skill: the whole protocol for an agent, as Markdown", skill,
        fields=NO_FIELDS, media="text/markdown",
        answer=string("skill/SKILL.md: how an agent wakes, notes, naps (one at a time or in batches), recalls and "
                      "zooms."),
        description="The skill, the whole protocol for an agent, served so that an agent with only the AGENTS.md "
                    "block can read it. Public.",
    ),
    RouteSpec(
        "GET", "/reference", "public", "This API reference (API-REFERENCE.md), as Markdown", reference,
        fields=NO_FIELDS, media="text/markdown",
        answer=string("API-REFERENCE.md: every route, field, error code and client verb."),
        description="The field-by-field API reference; its field tables, scope matrix and error-code table are "
                    "generated from the same route declarations as this document. Public.",
    ),
    *twins(
        "/shape", "public", ("Block boundaries of cover(T, lines); no data",
                             "Block boundaries (POST twin of GET /shape)"), shape, SHAPE_FIELDS,
        "The block boundaries a wake of T memories shows with a budget of `lines`. Reads no memory.",
        answer=obj({
            "T": integer(0), "lines": integer(1),
            "blocks": {"type": "array", "description": "cover(T, lines), oldest first, each [first, last] inclusive.",
                       # A pair of equal schemas, so items + min/maxItems says it without prefixItems,
                       # which some OpenAPI 3.1 tools (schemathesis 4, issue 3842) cannot load.
                       "items": {"type": "array", "items": integer(0), "minItems": 2, "maxItems": 2}},
        }),
    ),
    RouteSpec(
        "GET", "/metrics", "operator", "Prometheus text: counts and latencies", metrics,
        answer=string("Prometheus text format 0.0.4."), media="text/plain",
        errors=("auth.operator", "rate_limited"),
        description="Loopback only, unless the server has a metrics token (STASH_METRICS_TOKEN): then that token "
                    "as a bearer, from anywhere.",
    ),
    RouteSpec("GET", "/", "public", "The landing page", landing, answer=string("The landing page."),
              media="text/html"),
]
