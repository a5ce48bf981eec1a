"""How a declared route runs (docs/DESIGN.md, "HTTP surface").

A :class:`RouteSpec` is the one declaration of a route: how it is called and
guarded, what it reads, what it answers, the refusals that are its own, and
what happens around its handler (its Idempotency-Key record, the memories it
adds against the quotas, its audit event, its cleanup). Its
:meth:`RouteSpec.endpoint` is the only code path from a request to a
handler: it refuses a token in the query string, authenticates, holds the
fair-share slot, reads the declared fields, and hands them to the handler —
through :func:`stash.service.operation.perform` for a route that needs a
capability. /openapi.json and API-REFERENCE.md's tables are generated from the
same declarations."""

from __future__ import annotations

import hmac
import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

from starlette.background import BackgroundTask, BackgroundTasks
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ..core.errors import Forbidden, Invalid, Malformed, StashError, TooMany, Unauthorized
from ..crypto import tokens
from ..crypto.chain import Head
from ..fleet.forward import Fleet
from ..service import idempotency, operation
from ..service.access import Vault, unknown_memory, valid_name
from ..service.operation import Effects, Event, Limits
from . import hop, pages, plaintext, stopping
from .codes import CODES
from .errors import error_response
from .fields import SECURED, Fields, Special
from .jsonio import BODY_CAP, IMPORT_BODY_CAP, JSON, NAP_BODY_CAP, parse_int, prefetch_small_body
from .schemas import Schema

MEMORY_PREFIX = "/m/{name}"
_TOKEN_WORDS = {"token", "access_token", "auth", "authorization", "key", "api_key", "bearer"}


class BodyCap(NamedTuple):
    """A cap on a route's body: the ``stash serve`` option that sets it, its
    default, and a floor no setting lowers it below."""

    option: str  # the Settings field
    default: int
    floor: int = 0

    def of(self, settings: Any) -> int:
        """This server's cap; the default's when ``settings`` is None (a document rendered without a server)."""
        return max(self.default if settings is None else getattr(settings, self.option), self.floor)


DEFAULT_BODY_CAP = BodyCap("max_body", BODY_CAP)
MAX_IMPORT_BODY = BodyCap("max_import_body", IMPORT_BODY_CAP)
MAX_NAP_BODY = BodyCap("max_body", BODY_CAP, floor=NAP_BODY_CAP)


@dataclass(frozen=True)
class Protocol:
    """How a route whose body is another protocol's speaks (MCP's JSON-RPC at
    /mcp, OAuth's at /token): its refusals are written in that protocol, and
    its OpenAPI operation describes its body as that protocol has it. A
    route of scope ``capability`` hands its request over to that protocol's
    own code once its token is known live (:meth:`RouteSpec.endpoint`)."""

    name: str
    refusal: Callable[[Request, StashError], Response]
    request: dict[str, Any] | None  # the OpenAPI requestBody; None: the route's fields say it
    error: dict[str, Any]  # the OpenAPI content of one of its refusals
    error_words: str  # what its refusals carry, said in each error response of the document


def client_address(request: Request) -> str:
    """The client's address, resolved once per request through the trusted
    proxies (:mod:`stash.web.forwarded`); every per-client decision uses it."""
    resolved: str | None = request.scope.get("stash.client")
    if resolved is None:
        peer = request.client.host if request.client else "-"
        resolved = request.app.state.proxies.client(peer, request.headers.getlist("x-forwarded-for"))
        request.scope["stash.client"] = resolved
    return resolved


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


class Call:
    """What a handler may know of the request beyond its fields: the server's
    parts, the client's address and the addresses an answer names. Handlers
    see this, never the request itself."""

    def __init__(self, request: Request, key: str | None = None, memory: str | None = None) -> None:
        self._request = request
        self.key = key  # the request's Idempotency-Key, when its route takes one and it sent one
        self.memory = memory  # a route of scope capability: the memory of /m/{name}, None for the token's own
        state = request.app.state
        self.settings = state.settings
        self.vault = state.vault
        self.limiter = state.limiter
        self.metrics = state.metrics

    @property
    def client(self) -> str:
        return client_address(self._request)

    @property
    def token(self) -> str | None:
        """The request's bearer token: for a route that acts on every memory of the identity (GET /grants)."""
        return bearer(self._request)

    @property
    def origin(self) -> str | None:
        """Where the request says it was sent from: its Origin, else its Referer's origin (a form's CSRF check)."""
        headers = self._request.headers
        origin = headers.get("origin")
        if origin and origin != "null":
            return origin
        referer = headers.get("referer")
        if not referer:
            return None
        scheme, _, rest = referer.partition("://")
        return f"{scheme}://{rest.split('/', 1)[0]}" if rest else None

    @property
    def fleet(self) -> Fleet | None:
        """This host's fleet (``--fleet-host``; its placement may be none yet), None for a single server."""
        fleet: Fleet | None = self._request.app.state.fleet
        return fleet

    @property
    def hopped(self) -> bool:
        """Another host of the fleet sent this request on: answer it here, never send it on again."""
        return hop.hopped(self._request)

    async def forward(self, fleet: Fleet, address: str, body: bytes, unreachable: str) -> Response:
        """This request sent on to the fleet's host at ``address`` with ``body``, and its answer whole."""
        return await hop.forward(self._request, fleet, address, body, unreachable)

    @property
    def routes(self) -> list[RouteSpec]:
        """The app's route table, for the route that documents it (GET /openapi.json)."""
        routes: list[RouteSpec] = self._request.app.state.routes
        return routes

    @property
    def replicating(self) -> bool:
        """Whether this host replicates now (a host of a fleet: while it holds a shard)."""
        vault: Vault = self.vault
        if vault.placed is not None:
            return vault.replicating()
        return self.settings.replicate is not None

    def page_address(self, public_url: str | None = None) -> str:
        """The address a page names: ``public_url``, else this request's scheme and plain Host (pages.py)."""
        request = self._request
        return pages.page_address(public_url, request.url.scheme, request.headers.get("host"))

    def block_address(self, url: object) -> str | None:
        """The address an AGENTS.md block names: ``url`` from the body, else
        the server's --url, else the address this request came in on; None
        when the address given is refused. Checked as --url and the Host
        header are: the address goes into a block pasted into AGENTS.md and
        into curl commands there, so a newline, quote, backquote or $( )
        must never reach it."""
        url = url or self.settings.public_url
        if url is not None and (
            not isinstance(url, str) or len(url) > 2000 or not pages.is_safe_address(url.rstrip("/"))
        ):
            return None
        return url or self.page_address()


def _refuse_token_in_query(request: Request) -> None:
    for name, value in request.query_params.multi_items():
        if name.lower() in _TOKEN_WORDS or "stash1_" in value:
            raise Malformed(
                "Tokens are never accepted in a query string (they would end up in logs and histories); "
                "send it as 'Authorization: Bearer …' and revoke the one you exposed.",
                code="auth.token_in_query",
            )


PARSED_BEARER = "stash.bearer"  # the request's scope: the bearer token as _precheck parsed it


def parsed_token(request: Request) -> tokens.Token | str | None:
    """The request's token as :func:`_precheck` parsed it (its lookup tag
    derived there too, and kept with it), so the service's check of it
    parses nothing again; the bearer text when no precheck ran."""
    parsed = request.scope.get(PARSED_BEARER)
    return parsed if isinstance(parsed, tokens.Token) else bearer(request)


def _auth_failed(request: Request) -> Unauthorized:
    request.app.state.limiter.hit("auth", client_address(request))
    request.app.state.metrics.event("auth_failed")
    return Unauthorized()


async def _live(request: Request) -> None:
    """A route of scope ``capability``: the token is live (not revoked, not
    expired, its grant's row where its tag says), refused as every token is
    otherwise. Which scope it holds is each of its calls' to check."""
    try:
        await run_in_threadpool(request.app.state.vault.check_token, parsed_token(request))
    except Unauthorized:
        raise _auth_failed(request) from None


async def _precheck(request: Request, spec: RouteSpec, prefetch: bool = True) -> None:
    """Authentication before anything of the request is read: the token's
    shape and checksum, then its lookup tag against the in-memory index of
    live tags (service/tag_index.py). An unknown user and a wrong secret end
    here with the same 401 at the same cost, before any field is checked or
    any body byte is read, so no answer tells who exists and a forged
    request cannot make the server buffer a large body. A token whose tag is
    live goes on even when its address spent its failure budget: others'
    failures at a shared address never lock it out. The full check (argon2id,
    unwrap, scope) follows in :func:`stash.service.operation.perform`."""
    settings = request.app.state.settings
    vault = request.app.state.vault
    parsed = tokens.parse(bearer(request) or "")
    verdict: bool | None = False
    if parsed is not None:
        # A user of a shard this host does not hold is refused before the tag index (whose 401 would say
        # nothing of where the user is) and before any of the user's files is opened.
        vault.serves(parsed.user_id)
        request.scope["stash.user"] = parsed.user_id
        request.scope[PARSED_BEARER] = parsed
        tag = parsed.tag
        verdict = vault.tags.verdict(parsed.user_id, tag)
        if verdict is None:  # the first request for this user in this process, or its grants changed
            # A small body is taken in before the hop to a thread: a client that sent its whole request
            # and hung up (its answer lost, to be retried with the same Idempotency-Key) still has its
            # write made, as on every other path. A larger one waits for the verdict.
            if prefetch:
                await prefetch_small_body(request, settings.max_body)
            verdict = await run_in_threadpool(vault.tags.load_from_disk, parsed.user_id, tag)
    if verdict:
        return
    wait = request.app.state.limiter.blocked_for("auth", client_address(request), settings.auth_failures_per_minute)
    if wait:
        raise TooMany(f"Too many failed authentications from this address; wait {wait} s and check the token.", wait)
    if verdict is False:
        raise _auth_failed(request)
    # None: the key ring cannot be read; the full check says what is wrong with the store.


def _operator(request: Request) -> None:
    """The operator's routes: the metrics token as a bearer when the server
    has one, else a loopback caller."""
    settings = request.app.state.settings
    client = client_address(request)
    if settings.operator_token:
        given = bearer(request) or ""
        if not hmac.compare_digest(given.encode(), settings.operator_token.encode()):
            # Guesses of the operator token share the address's failure budget; the right token never waits.
            limiter = request.app.state.limiter
            wait = limiter.blocked_for("auth", client, settings.auth_failures_per_minute)
            if wait:
                raise TooMany(f"Too many failed authentications from this address; wait {wait} s.", wait)
            limiter.hit("auth", client)
            raise Forbidden("Metrics need the operator token as 'Authorization: Bearer …'.", code="auth.operator")
        return
    try:
        loopback = ipaddress.ip_address(client).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise Forbidden(
            "Metrics are served on loopback only unless the operator sets a metrics token.", code="auth.operator"
        )


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
        raise Malformed(
            'Stash-Pin must be a head\'s pin as answered in "head": COUNT:DIGEST:STATE (a 64-hex-digit '
            "digest; COUNT:DIGEST is accepted too).",
            code="request.bad_pin",
        )
    return head


@dataclass(frozen=True)
class RouteSpec:
    """The one declaration of a route (docs/DESIGN.md, "HTTP surface"): how it is called and
    guarded, what it reads, what it answers, which refusals are its own, and
    what is done around its handler (see :class:`stash.service.operation.Effects`).
    Requests are refused from ``fields``, and /openapi.json and the tables
    of API-REFERENCE.md are generated from the whole declaration."""

    method: str
    path: str
    scope: str  # public | read | append | full | owner | operator | capability (any live one: each call its own)
    summary: str
    # A route open to all: ``async (fields, call)``; one that needs a capability: ``(session, fields, call)``,
    # run in a worker thread by operation.perform. It answers a dict (JSON), a str or bytes (``media``), or
    # a Response.
    handler: Callable[..., Any]
    slow: bool = False  # holds a slow slot (fairshare.py): recall, import, export
    fields: Fields | None = None  # None: neither the query string nor the body is read
    answer: Schema | None = None  # None: a body no schema describes (the export archive)
    status: int = 200
    media: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()  # sent with an answer the handler gives as str or bytes
    # The codes the handler and the service it calls can answer, beyond those of
    # its kind, its fields, idempotency and slow slots (fields.error_codes).
    errors: tuple[str, ...] = ()
    special: tuple[Special, ...] = ()
    # Each {name} of the path: a whole number, its schema; and the refusal of one that is not.
    path_params: tuple[tuple[str, Schema], ...] = ()
    unknown: Callable[[], StashError] | None = None
    record: str | None = None  # takes an Idempotency-Key, its record kept there (operation.RECORDS)
    event: Event | None = None  # the audit event it leaves
    adds: Callable[[dict[str, Any]], int | None] | None = None  # memories it adds, against the quotas
    cleanup: str | None = None  # what is flushed once it committed (operation.CLEANUPS), said in "flushed"
    body_cap: BodyCap = DEFAULT_BODY_CAP
    description: str = ""
    # Served under /m/{name}: the same route on memory ``name`` (docs/DESIGN.md, "Memories").
    under: bool = False
    # The body field that names the memory the session acts on (POST /grants's "memory").
    memory_from: str | None = None
    # Or how the memory is found from the fields (vault, user id, fields -> name or None: unknown).
    memory_of: Callable[..., str | None] | None = None
    # Path parameters that are memory names (strings), not whole numbers.
    name_params: tuple[str, ...] = ()
    # The protocol its body is, when not Stash's own JSON (a route of scope ``capability``, or OAuth's).
    protocol: Protocol | None = None
    # What else it answers besides ``status`` and its refusals: OpenAPI response objects by status (a redirect).
    more_answers: tuple[tuple[str, Any], ...] = ()

    @property
    def base(self) -> str:
        """The path of the route this one is the /m/{name} copy of (itself when not one)."""
        return self.path.removeprefix(MEMORY_PREFIX) if self.under else self.path

    def __post_init__(self) -> None:
        # Refused at import, so a declaration that /openapi.json or the reference could not render never serves.
        named = [n for n in re.findall(r"{(\w+)}", self.path)[1 if self.under else 0 :] if n not in self.name_params]
        if named != [name for name, _ in self.path_params]:
            raise ValueError(f"{self.method} {self.path}: declare each {{name}} of the path in path_params")
        if self.path_params and self.unknown is None:
            raise ValueError(f"{self.method} {self.path}: declare the refusal of an unknown path parameter")
        unknown = [c for c in (*self.errors, *(c for s in self.special for c in s.codes)) if c not in CODES]
        if unknown:
            raise ValueError(f"{self.method} {self.path}: codes missing from stash/web/codes.py: {unknown}")
        if self.scope == "capability" and (self.protocol is None or self.fields is not None):
            raise ValueError(f"{self.method} {self.path}: a route of scope capability hands its body to its protocol")
        if self.scope not in SECURED and (self.record or self.event or self.adds or self.cleanup):
            raise ValueError(f"{self.method} {self.path}: only a route that needs a capability writes")

    @property
    def idempotent(self) -> bool:
        """Takes an Idempotency-Key header."""
        return self.record is not None

    @cached_property
    def effects(self) -> Effects:
        return Effects(self.scope, self.record, self.event, self.adds, self.cleanup)

    async def endpoint(self, request: Request) -> Response:
        request.scope["stash.route"] = self.path
        handled = False
        try:
            _refuse_token_in_query(request)
            if self.scope == "capability":
                # The body is the protocol's, read by its own code: nothing of it is taken in here.
                await _precheck(request, self, prefetch=False)
                await _live(request)
                handled = True
                memory = self._memory(request, {})
                return self._answer(request, await self.handler({}, Call(request, memory=memory)))
            if self.scope not in SECURED:
                handled = True
                if self.scope == "operator":
                    _operator(request)
                fields = {**self._path_params(request), **await self._fields(request)}
                return self._answer(request, await self.handler(fields, Call(request)))
            await _precheck(request, self)
            # The slot is taken before the body is read, so a tenant's bodies in memory are bounded too.
            with request.app.state.shares.hold(request.scope.get("stash.user", ""), self.slow):
                handled = True
                return await self._secured(request)
        except StashError as err:
            request.scope["stash.error"] = err.code
            if self.protocol is not None:
                resp = self.protocol.refusal(request, err)
            else:
                resp = self._negotiated(request, error_response(err))
            if not handled and _has_body(request):
                # Refused before its body was read: close the connection after the answer rather than
                # take in and throw away the rest of a body nobody authenticated (up to 16 MiB).
                resp.headers["Connection"] = "close"
            return resp

    async def _secured(self, request: Request) -> Response:
        params = self._path_params(request)
        key = idempotency.parse_key(request.headers.getlist(idempotency.HEADER)) if self.idempotent else None
        body = await self._fields(request)
        fields = {**params, **body}
        memory = self._memory(request, fields)
        # An Idempotency-Key's record is of the request as sent: the path with its values, and the body.
        route = f"{self.method} {self.path.format(**params, **({'name': memory} if self.under else {}))}"
        settings = request.app.state.settings
        limits = Limits(settings.quota_memories, settings.quota_bytes)
        token = parsed_token(request)
        try:
            done = await stopping.run_work(
                request.app.state.works,
                operation.perform,
                request.app.state.vault,
                token,
                _pin(request),
                self.effects,
                route,
                fields,
                key,
                limits,
                self.handler,
                Call(request, key),
                body,
                memory,
            )
        except Unauthorized:
            raise _auth_failed(request) from None
        try:
            metrics = request.app.state.metrics
            if done.replayed:
                metrics.event("idempotent_replay")
            elif done.event is not None:
                metrics.event(done.event)
            headers = {idempotency.REPLAYED_HEADER: "true"} if done.replayed else None
            response = self._answer(request, done.body, headers)
        except BaseException:
            if done.finish is not None:
                done.finish()
            raise
        if done.finish is not None:
            # The session ends once the answer has left (service/session_end.py), as the request's own work.
            after = BackgroundTask(stopping.run_work, request.app.state.works, done.finish)
            response.background = (
                after if response.background is None else BackgroundTasks([response.background, after])
            )
        return response

    def _memory(self, request: Request, body: dict[str, Any]) -> str | None:
        """The memory this call names: /m/{name}, or the declared body field; None: the capability's own."""
        if self.under:
            name = request.path_params.get("name")
        elif self.memory_from is not None:
            name = body.get(self.memory_from)
        elif self.memory_of is not None:
            name = self.memory_of(request.app.state.vault, request.scope.get("stash.user", ""), body)
            if name is None:
                assert self.unknown is not None
                raise self.unknown()
        else:
            return None
        if name is not None and not valid_name(name):
            raise unknown_memory()
        return name

    def _path_params(self, request: Request) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.name_params:
            if not valid_name(request.path_params[name]):
                raise unknown_memory()
            out[name] = request.path_params[name]
        for name, _ in self.path_params:
            try:
                out[name] = parse_int(name, request.path_params[name])
            except Invalid:
                assert self.unknown is not None
                raise self.unknown() from None
        return out

    async def _fields(self, request: Request) -> dict[str, Any]:
        """The request's fields, read and refused as declared."""
        if self.fields is None:
            return {}
        return await self.fields.read(request, self.method, self.body_cap.of(request.app.state.settings))

    def _answer(self, request: Request, answer: Any, headers: dict[str, str] | None = None) -> Response:
        if isinstance(answer, Response):
            return answer
        if isinstance(answer, dict):
            return self._negotiated(request, JSON(answer, status_code=self.status, headers=headers))
        media = f"{self.media}; charset=utf-8" if isinstance(answer, str) else self.media
        return Response(answer, status_code=self.status, media_type=media, headers=dict(self.headers))

    def _negotiated(self, request: Request, response: Response) -> Response:
        """The answer as the client asked: JSON, or memo's plain text when
        its Accept prefers text/plain (plaintext.py)."""
        if self.media == "application/json" and plaintext.wants_text(request):
            return plaintext.as_text(self.base, response)
        return response
