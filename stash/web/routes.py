"""The HTTP surface (SPEC §3). Each endpoint parses its request, calls one
function of the service layer in a worker thread, and returns its answer."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response

from .. import __version__
from ..core import blocks
from ..core.errors import Forbidden, Invalid, Malformed, NotFound, StashError, TooMany, Unauthorized, Unavailable
from ..crypto import tokens
from ..crypto.chain import Head
from ..service import audit, grant_terms, idempotency, onboarding, quotas
from ..service.access import Session
from . import pages
from .errors import error_response
from .jsonio import JSON, NAP_BODY_CAP, parse_int, prefetch_small_body, query_object, read_object

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
    method: str
    path: str
    scope: str  # public | read | full | owner | operator
    summary: str
    handler: Callable[[Request], Awaitable[Response]]
    slow: bool = False  # holds a slow slot (fairshare.py): recall, import, export

    async def endpoint(self, request: Request) -> Response:
        request.scope["stash.route"] = self.path
        handled = False
        try:
            _refuse_token_in_query(request)
            if self.scope not in ("read", "full", "owner"):
                handled = True
                return await self.handler(request)
            await _precheck(request)
            # The slot is taken before the body is read, so a tenant's bodies in memory are bounded too.
            with request.app.state.shares.hold(request.scope.get("stash.user", ""), self.slow):
                handled = True
                return await self.handler(request)
        except StashError as err:
            request.scope["stash.error"] = err.code
            resp = error_response(err)
            if not handled and _has_body(request):
                # Refused before its body was read: close the connection after the answer rather than
                # take in and throw away the rest of a body nobody authenticated (up to 16 MiB).
                resp.headers["Connection"] = "close"
            return resp


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
    if request.method == "GET":
        data = query_object(request, {"ready"}, ints={"ready"})
    else:
        data = await read_object(request, {"ready"})
    probe = parse_int("ready", data.get("ready", 0))
    if probe not in (0, 1):
        raise Invalid("ready must be 0 or 1.", code="request.bad_value")
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
    body = await read_object(request, {"url", "invite"})
    if not isinstance(body.get("invite", ""), str):  # refused in every mode, so a wrong type never goes unseen
        raise Invalid("invite must be a string: the operator's invite secret.", code="request.bad_value")
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
        raise TooMany(f"This address minted the {settings.init_per_day} identities a day this server allows; "
                      f"wait {wait} s, or reuse a token you already have.", wait, code="quota.identities")
    url = body.get("url") or settings.public_url
    # Checked as --url and the Host header are: the address goes into a block pasted into AGENTS.md and
    # into curl commands there, so a newline, quote, backquote or $( ) must never reach it.
    if url is not None and (not isinstance(url, str) or len(url) > 2000 or not pages.is_safe_address(url.rstrip("/"))):
        raise Invalid("url must be the server's plain http(s) address, like https://stash.example (letters, digits "
                      "and .-_~%/ in its path; no spaces, quotes or other characters).", code="init.bad_url")
    limiter.hit("init", client)
    limiter.hit("init_day", client, DAY_S)
    ident = await run_in_threadpool(request.app.state.vault.create_identity)
    # Without a url, the address this request came in on; a Host header that is
    # not a plain host[:port] never reaches the pasted block (pages.page_address).
    address = url or pages.page_address(None, request.url.scheme, request.headers.get("host"))
    answer = onboarding.init_answer(ident, address, CONTENT_CIPHER)
    return JSON(answer, status_code=201)


async def shape(request: Request) -> Response:
    if request.method == "GET":
        data = query_object(request, {"T", "lines"}, ints={"T", "lines"})
    else:
        data = await read_object(request, {"T", "lines"})
    T = parse_int("T", data.get("T", 0))
    budget = parse_int("lines", data.get("lines", 96))
    if not 0 <= T <= 10**15 or not 1 <= budget <= 1000:
        raise Invalid("T must be 0 to 10^15 and lines 1 to 1000.", code="shape.out_of_range")
    cover = blocks.cover(T, budget)
    return JSON({"T": T, "lines": budget, "blocks": [[lo, hi - 1] for lo, hi in cover]})


async def openapi(request: Request) -> Response:
    from .openapi import document

    settings = request.app.state.settings
    caps = {"max_body": settings.max_body, "max_import_body": settings.max_import_body,
            "max_nap_body": max(settings.max_body, NAP_BODY_CAP)}
    address = pages.page_address(settings.public_url, request.url.scheme, request.headers.get("host"))
    # A Host that is not a plain host[:port] names no server rather than a made-up one.
    return JSON(document(ROUTES, __version__, caps, server=None if address == pages.PLACEHOLDER_ADDRESS else address))


async def client(request: Request) -> Response:
    return PlainTextResponse(pages.client_source(), media_type="text/x-python; charset=utf-8",
                             headers={"Content-Disposition": 'attachment; filename="stash"'})


async def skill(request: Request) -> Response:
    from ..service import docs

    query_object(request, set())
    return PlainTextResponse(docs.skill(), media_type="text/markdown; charset=utf-8")


async def reference(request: Request) -> Response:
    from ..service import docs

    query_object(request, set())
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
    if request.method == "GET":
        data = query_object(request, {"part", "T"}, ints={"part", "T"})
    else:
        data = await read_object(request, {"part", "T"})
    part = parse_int("part", data.get("part", 1))
    T = data.get("T")
    T = None if T is None else parse_int("T", T)
    return JSON(await _authed(request, "read", lambda s: s.memory.wake(part, T)))


def _room(request: Request, session, adding: int) -> None:
    """The operator's quotas (service/quotas.py), checked inside the write."""
    settings = request.app.state.settings
    quotas.check_room(session.memory.mf.count(), session.files.folder, adding, settings.quota_memories,
                      settings.quota_bytes)


async def note(request: Request) -> Response:
    key = _idempotency_key(request)
    data = await read_object(request, {"text"}, required={"text"})

    def write(s) -> dict:
        _room(request, s, 1)
        return s.memory.note(data["text"])

    return _once(request, await _authed(request, "full", lambda s: idempotency.memory_write(
        s, key, "POST /note", data, lambda: write(s))))


async def nap(request: Request) -> Response:
    key = _idempotency_key(request)
    data = await read_object(request, {"block", "text", "batch", "summaries"},
                             cap=max(request.app.state.settings.max_body, NAP_BODY_CAP))
    return _once(request, await _authed(request, "full", lambda s: idempotency.memory_write(
        s, key, "POST /nap", data, lambda: s.memory.nap(data.get("block"), data.get("text"), data.get("batch"),
                                                        data.get("summaries")))))


async def recall(request: Request) -> Response:
    if request.method == "GET":
        data = query_object(request, {"q", "before"}, ints={"before"})
    else:
        data = await read_object(request, {"q", "before"})
    if "q" not in data:
        raise Malformed("Missing q: send the pattern to search for.", code="request.missing_field")
    before = data.get("before")
    before = None if before is None else parse_int("before", before)
    return JSON(await _authed(request, "read", lambda s: s.memory.recall(data["q"], before)))


async def zoom(request: Request) -> Response:
    if request.method == "GET":
        data = query_object(request, {"block"})
    else:
        data = await read_object(request, {"block"})
    if "block" not in data:
        raise Malformed("Missing block: send the block to open, like 16-31.", code="request.missing_field")
    return JSON(await _authed(request, "read", lambda s: s.memory.zoom(data["block"])))


async def forget(request: Request) -> Response:
    data = await read_object(request, {"block"}, required={"block"})
    return JSON(await _authed(request, "full", lambda s: audit.forget(s, data["block"])))


async def config_get(request: Request) -> Response:
    query_object(request, set())
    return JSON(await _authed(request, "read", lambda s: s.memory.config()))


async def config_set(request: Request) -> Response:
    data = await read_object(request, None, empty_ok=False)
    return JSON(await _authed(request, "full", lambda s: audit.set_config(s, data)))


async def import_(request: Request) -> Response:
    key = _idempotency_key(request)
    data = await read_object(request, {"entries"}, required={"entries"}, cap=request.app.state.settings.max_import_body)

    def write(s) -> dict:
        if isinstance(data["entries"], list):
            _room(request, s, len(data["entries"]))
        return audit.import_entries(s, data["entries"])

    return _once(request, await _authed(request, "full", lambda s: idempotency.memory_write(
        s, key, "POST /import", data, lambda: write(s))))


async def export(request: Request) -> Response:
    from ..service.export import export_archive

    query_object(request, set())
    archive = await _authed(request, "owner", lambda s: audit.export(s, export_archive))
    return Response(archive, media_type="application/gzip",
                    headers={"Content-Disposition": 'attachment; filename="optmem-memory.tar.gz"'})


# ---------------------------------------------------------------- owner


async def grants_list(request: Request) -> Response:
    query_object(request, set())
    vault = request.app.state.vault
    return JSON(await _authed(request, "owner", lambda s: {"grants": vault.list_grants(s)}))


async def grants_mint(request: Request) -> Response:
    key = _idempotency_key(request)
    data = await read_object(request, {"scope", "label", "expires"}, required={"scope"})
    scope = data["scope"]
    if scope not in ("read", "full"):
        raise Invalid("scope must be \"read\" or \"full\"; ownership is never transferable.", code="grants.bad_scope")
    label = grant_terms.check_label(data.get("label"))
    expires = grant_terms.check_expires(data.get("expires"), datetime.now(UTC))
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
                "note": f"This token is {shown}; revoke it with DELETE /grants/{grant_id}."}

    answer = await _authed(request, "owner", lambda s: idempotency.keyring_write(
        s, key, "POST /grants", data, lambda: mint(s)))
    return _once(request, answer, status_code=201)


async def grants_revoke(request: Request) -> Response:
    raw = request.path_params["grant_id"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise NotFound("No such capability; list them with GET /grants.", code="grants.unknown")
    vault = request.app.state.vault
    return JSON(await _authed(request, "owner", lambda s: audit.revoke(s, vault, int(raw))))


async def rotate(request: Request) -> Response:
    await read_object(request, set())
    vault = request.app.state.vault
    return JSON(await _authed(request, "owner", lambda s: audit.rotate(s, vault)))


async def erase(request: Request) -> Response:
    data = await read_object(request, {"ids"}, required={"ids"})
    answer = await _authed(request, "owner", lambda s: audit.erase(s, data["ids"]))
    request.app.state.metrics.event("erase")
    return JSON(answer)


async def audit_trail(request: Request) -> Response:
    query_object(request, set())
    return JSON(await _authed(request, "owner", audit.trail))


async def erasures(request: Request) -> Response:
    query_object(request, set())
    return JSON(await _authed(request, "owner", lambda s: s.memory.erasures()))


async def destroy(request: Request) -> Response:
    await read_object(request, set())
    vault = request.app.state.vault
    return JSON(await _authed(request, "owner", lambda s: audit.destroy(s, vault, vault.data_dir)))


ROUTES: list[RouteSpec] = [
    RouteSpec("GET", "/health", "public", "Liveness, version and this host's ciphers", health),
    RouteSpec("POST", "/health", "public", "Liveness and readiness (POST twin of GET /health)", health),
    RouteSpec("POST", "/init", "public", "Mint an identity; the token is shown once", init),
    RouteSpec("GET", "/wake", "read", "The wake document, one part at a time", wake),
    RouteSpec("POST", "/wake", "read", "The wake (POST twin of GET /wake)", wake),
    RouteSpec("POST", "/note", "full", "Append one memory", note),
    RouteSpec("POST", "/nap", "full", "Ask what is due, or settle the due block", nap),
    RouteSpec("GET", "/recall", "read", "Regex search of the verbatim log", recall, slow=True),
    RouteSpec("POST", "/recall", "read", "Regex search (POST twin of GET /recall)", recall, slow=True),
    RouteSpec("GET", "/zoom", "read", "Open a block into its two halves", zoom),
    RouteSpec("POST", "/zoom", "read", "Open a block (POST twin of GET /zoom)", zoom),
    RouteSpec("POST", "/forget", "full", "Drop a summary and what was built on it", forget),
    RouteSpec("GET", "/config", "read", "The sizes and their defaults", config_get),
    RouteSpec("POST", "/config", "full", "Change sizes; null restores a default", config_set),
    RouteSpec("POST", "/import", "full", "Bulk-append dated memories, oldest first", import_, slow=True),
    RouteSpec("GET", "/grants", "owner", "Every capability, live and revoked; never a secret", grants_list),
    RouteSpec("POST", "/grants", "owner", "Mint a read or full capability; its token is shown once", grants_mint),
    RouteSpec("DELETE", "/grants/{grant_id}", "owner", "Revoke one capability: a new key epoch it never reaches",
              grants_revoke),
    RouteSpec("POST", "/rotate", "owner", "A new owner token; the old one ends as a revoked one does", rotate),
    RouteSpec("POST", "/erase", "owner", "Shred individual memories for good; answers a receipt", erase),
    RouteSpec("GET", "/erasures", "owner", "Erasure receipts, never content", erasures),
    RouteSpec("GET", "/audit", "owner", "Who did what and when, never content", audit_trail),
    RouteSpec("DELETE", "/store", "owner", "Destroy the whole memory; answers a receipt", destroy),
    RouteSpec("GET", "/export", "owner", "The whole memory as an OptMem-readable tar.gz", export, slow=True),
    RouteSpec("GET", "/openapi.json", "public", "This server's OpenAPI 3.1 document", openapi),
    RouteSpec("GET", "/client", "public", "The single-file stash client", client),
    RouteSpec("GET", "/skill", "public", "The skill: the whole protocol for an agent, as Markdown", skill),
    RouteSpec("GET", "/reference", "public", "This API reference (API-REFERENCE.md), as Markdown", reference),
    RouteSpec("GET", "/shape", "public", "Block boundaries of cover(T, lines); no data", shape),
    RouteSpec("POST", "/shape", "public", "Block boundaries (POST twin of GET /shape)", shape),
    RouteSpec("GET", "/metrics", "operator", "Prometheus text: counts and latencies", metrics),
    RouteSpec("GET", "/", "public", "The landing page", landing),
]
