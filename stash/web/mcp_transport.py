"""``POST /mcp``: the agent's tools (stash/tools/) over the Model Context
Protocol's Streamable HTTP transport, served by the ``mcp`` SDK in its
stateless mode, with JSON answers: every request stands alone, so any
worker answers any of them and nothing is kept between them.

The route's declaration has checked that the bearer is a live capability
before anything here runs (scope ``capability``, stash/web/dispatch.py);
each tool call is then one request to the memory's own route (``POST
/wake`` …), made in this process through the app's router, so it is
authenticated, scoped, limited and answered exactly as over plain HTTP.
The SDK is imported at the first MCP request of a process, never before:
a worker that serves no MCP does not hold it.

Refusals on /mcp are JSON-RPC errors: the edge's own (a dead token, a body
too large) carry the Stash code as ``data.error``; the SDK's transport
answers some refusals as plain text (a Host or Origin that is not this
server's), and those are rewritten here as JSON-RPC errors too."""

from __future__ import annotations

import asyncio
import importlib
import logging
from typing import Any
from urllib.parse import urlsplit

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from ..core.errors import Forbidden, Malformed, Misdirected, NotAcceptable, StashError, TooLarge
from . import pages, tracelog
from .dispatch import Call, Protocol

JSONRPC_INVALID_REQUEST = -32600  # JSON-RPC 2.0's codes, as the SDK defines them
JSONRPC_INTERNAL_ERROR = -32603
METADATA_PATH = "/.well-known/oauth-protected-resource"
CALLER = "stash.mcp"  # the request's scope: who calls, on which memory (set by the hand-over)
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
# Plain-text refusals of the SDK's transport, by status: the refusal each becomes.
TRANSPORT_REFUSALS: dict[int, StashError] = {
    400: Malformed(
        "Send one JSON-RPC message as the body, with 'Content-Type: application/json'.", code="mcp.bad_request"
    ),
    403: Forbidden(
        "This server does not answer requests from that Origin; connect from the host itself or "
        "through the address the operator gave it (--url).",
        code="mcp.bad_origin",
    ),
    406: NotAcceptable("Send 'Accept: application/json, text/event-stream': the answers are JSON."),
    413: TooLarge("The message is over this server's body cap; send a smaller one.", code="request.too_large"),
    421: Misdirected(
        "This server does not answer for that Host; connect through the address the operator gave "
        "it (--url), or on loopback."
    ),
}
log = logging.getLogger("stash.error")


def error_body(code: int, message: str, data: dict[str, Any] | None = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return orjson.dumps({"jsonrpc": "2.0", "id": None, "error": error})


def base_address(request: Request) -> str:
    """This server's address as its MCP hosts reach it: ``--url``, else the request's scheme and Host."""
    return pages.page_address(request.app.state.settings.public_url, request.url.scheme, request.headers.get("host"))


def metadata_url(request: Request) -> str:
    """Where the protected-resource metadata of this request's MCP endpoint is: the server's for /mcp, the
    memory's own for /m/{name}/mcp (the route has checked its name before any refusal names it)."""
    path = request.url.path
    suffix = path if path.startswith("/m/") and request.scope.get("stash.error") != "memory.unknown" else ""
    return f"{base_address(request)}{METADATA_PATH}{suffix}"


def refusal(request: Request, err: StashError) -> Response:
    """A refusal of the edge as a JSON-RPC error (no id: it answers no message), with its Stash code in
    ``data``; a 401 names the protected-resource metadata, so a host can learn how to connect."""
    headers = {}
    retry = getattr(err, "retry_after", None)
    if retry is not None:
        headers["Retry-After"] = str(retry)
    if err.status == 401:
        headers["WWW-Authenticate"] = f'Bearer resource_metadata="{metadata_url(request)}"'
    code = JSONRPC_INTERNAL_ERROR if err.status >= 500 else JSONRPC_INVALID_REQUEST
    return Response(
        error_body(code, err.message, {"error": err.code}),
        status_code=err.status,
        media_type="application/json",
        headers=headers,
    )


_ERROR = {
    "type": "object",
    "required": ["jsonrpc", "id", "error"],
    "properties": {
        "jsonrpc": {"const": "2.0"},
        "id": {"type": ["string", "integer", "null"]},
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "integer"},
                "message": {"type": "string"},
                "data": {
                    "description": '`{"error": code}` (a Stash error code) when the Stash edge refused; the SDK\'s own '
                    "data otherwise (the versions it serves, for an unsupported one)"
                },
            },
        },
    },
    "description": "A JSON-RPC 2.0 error.",
}
MESSAGE = {
    "type": "object",
    "required": ["jsonrpc"],
    "properties": {"jsonrpc": {"const": "2.0"}},
    "description": "One JSON-RPC 2.0 message of the Model Context Protocol: a request, a notification or a response.",
}
JSONRPC = Protocol(
    name="jsonrpc",
    refusal=refusal,
    request={
        "required": True,
        "description": "One JSON-RPC message (MCP Streamable HTTP). Send `Accept: "
        "application/json, text/event-stream`.",
        "content": {"application/json": {"schema": MESSAGE}},
    },
    error={"application/json": {"schema": _ERROR}},
    error_words="A JSON-RPC error; `data.error` is the Stash code when the Stash edge refused",
)
ACCEPTED = ("202", {"description": "A notification (or a response) was accepted; no body."})


def resource_metadata(address: str, memory: str | None) -> dict[str, Any]:
    """The protected-resource metadata (RFC 9728) of /mcp, or of memory ``memory``'s /m/{name}/mcp."""
    path = "/mcp" if memory is None else f"/m/{memory}/mcp"
    return {
        "resource": address + path,
        "resource_name": "Stash",
        "authorization_servers": [address],
        "bearer_methods_supported": ["header"],
    }


def security_settings(settings: Any) -> dict[str, Any]:
    """The SDK's Host and Origin checks (its guard against DNS rebinding): loopback, the host of ``--url``
    (so they pass behind the operator's proxy) and the address the server listens on when it is one."""
    hosts = [h for name in LOOPBACK_HOSTS for h in (name, f"{name}:*")]
    origins = [
        f"{scheme}://{name}{port}" for scheme in ("http", "https") for name in LOOPBACK_HOSTS for port in ("", ":*")
    ]
    if settings.host not in ("0.0.0.0", "::", ""):  # noqa: S104 - naming the wildcard to leave it out
        listen = f"[{settings.host}]" if ":" in settings.host else settings.host
        hosts += [listen, f"{listen}:*"]
    if settings.public_url:
        parts = urlsplit(settings.public_url)
        hosts.append(parts.netloc)
        origins.append(f"{parts.scheme}://{parts.netloc}")
    return {"enable_dns_rebinding_protection": True, "allowed_hosts": hosts, "allowed_origins": origins}


class _Loaded:
    """The SDK's parts, imported at the first MCP request of the process (in a thread: it takes a second
    and more), and the server built over them, one for the process: it holds nothing of any request."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.parts: tuple[Any, Any, Any, Any] | None = None

    async def get(self) -> tuple[Any, Any, Any, Any]:
        if self.parts is None:
            async with self.lock:
                if self.parts is None:
                    self.parts = await run_in_threadpool(_load)
        return self.parts


def _load() -> tuple[Any, Any, Any, Any]:
    server = importlib.import_module("stash.tools.server")
    manager = importlib.import_module("mcp.server.streamable_http_manager")
    errors = importlib.import_module("mcp.shared.exceptions")
    # The SDK logs every request's start and end, and a refused Host as sent: its warnings only, withheld.
    tracelog.withhold("mcp")
    return (
        server.build(InProcess(errors.MCPError)),
        manager.StreamableHTTPSessionManager,
        manager.TransportSecuritySettings,
        errors.MCPError,
    )


LOADED = _Loaded()


async def exchange(call: Call, cap: int) -> Response:
    """The hand-over: a response that runs the SDK's transport over the request, for the capability
    ``call.token`` on ``call.memory``."""
    parts = await LOADED.get()
    return Handover(parts, call.token or "", call.memory, security_settings(call.settings), cap)


class Handover(Response):
    """The SDK's Streamable HTTP transport as the route's answer: a session manager of its own per request
    (stateless: nothing outlives the request), its refusals made JSON-RPC errors."""

    def __init__(
        self, parts: tuple[Any, Any, Any, Any], token: str, memory: str | None, security: dict[str, Any], cap: int
    ) -> None:
        super().__init__()
        self.server, self.manager, self.security_class, _ = parts
        self.token, self.memory, self.security, self.cap = token, memory, security, cap

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[CALLER] = (self.token, self.memory)
        manager = self.manager(
            app=self.server,
            json_response=True,
            stateless=True,
            security_settings=self.security_class(**self.security),
            max_request_body_size=self.cap,
        )
        async with manager.run():
            await manager.handle_request(scope, receive, _jsonrpc_refusals(send))


def _jsonrpc_refusals(send: Send) -> Send:
    """``send``, with every refusal of the SDK's transport that answers no message (a plain-text one, or a
    JSON-RPC error with no id and no data) made the JSON-RPC error of :data:`TRANSPORT_REFUSALS`, its Stash
    code in ``data``. An error answering a message (with its id) stays as the SDK wrote it."""
    held: list[Message] = []
    chunks: list[bytes] = []

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400:
            held.append(message)
            return
        if not held or message["type"] != "http.response.body":
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return
        start, body = held.pop(), b"".join(chunks)
        if not _answers_a_message(body):
            err = TRANSPORT_REFUSALS.get(start["status"], TRANSPORT_REFUSALS[400])
            body = error_body(_jsonrpc_code(body), err.message, {"error": err.code})
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in (b"content-type", b"content-length")]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return wrapped


def _parsed_error(body: bytes) -> dict[str, Any] | None:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    return parsed if isinstance(error, dict) else None


def _answers_a_message(body: bytes) -> bool:
    """A JSON-RPC error that answers a request (its id), or carries the SDK's data (the versions it serves)."""
    parsed = _parsed_error(body)
    return parsed is not None and (parsed.get("id") is not None or "data" in parsed["error"])


def _jsonrpc_code(body: bytes) -> int:
    parsed = _parsed_error(body)
    code = parsed["error"].get("code") if parsed is not None else None
    return code if isinstance(code, int) else JSONRPC_INVALID_REQUEST


class InProcess:
    """The tools' host on this server: each call one request to the memory's route through the app's
    router (the route's own guards, fields and answer), the caller's scope from its authenticated grant."""

    def __init__(self, mcp_error: type[Exception]) -> None:
        self.mcp_error = mcp_error

    def _scope(self, ctx: Any) -> Scope:
        request = getattr(ctx, "request", None)
        if request is None or CALLER not in request.scope:
            raise self.mcp_error(JSONRPC_INTERNAL_ERROR, "This request reached no capability; send it again.")
        scope: Scope = request.scope
        return scope

    def backend(self, ctx: Any) -> Any:
        outer = self._scope(ctx)
        memory = outer[CALLER][1]
        prefix = "" if memory is None else f"/m/{memory}"

        async def answer(method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
            return await route_call(outer, method, prefix + path, body)

        return answer

    async def scope(self, ctx: Any) -> str | None:
        outer = self._scope(ctx)
        token, memory = outer[CALLER]
        try:
            scope: str = await run_in_threadpool(outer["app"].state.vault.scope_of, token, memory)
        except StashError as err:
            raise self.mcp_error(JSONRPC_INVALID_REQUEST, err.message, {"error": err.code}) from None
        return scope


async def route_call(outer: Scope, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """One request to a route of this app, made in process with the MCP request's token and client address:
    its JSON answer, or its refusal raised as the client library raises it (:func:`stash.client.error_class`)."""
    # Here, not at the top: a server that serves no MCP never loads the client library (stash/__init__.py); the
    # tools that call this have imported it already.
    from .. import client

    data = orjson.dumps(body)
    token = outer[CALLER][0]
    headers = [
        (b"host", Headers(scope=outer).get("host", "").encode("latin-1")),
        (b"authorization", f"Bearer {token}".encode("latin-1")),
        (b"content-type", b"application/json"),
        (b"accept", b"application/json"),
        (b"content-length", str(len(data)).encode()),
    ]
    scope = {k: v for k, v in outer.items() if not k.startswith("stash.") or k == "stash.client"}
    scope.update(method=method, path=path, raw_path=path.encode(), query_string=b"", headers=headers)
    for key in ("path_params", "endpoint", "route"):
        scope.pop(key, None)
    sent = False
    answer: dict[str, Any] = {"status": 500, "chunks": []}

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": data, "more_body": False}

    async def capture(message: Message) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
        elif message["type"] == "http.response.body":
            answer["chunks"].append(message.get("body", b""))

    try:
        await outer["app"].router(scope, receive, capture)
    except Exception as exc:  # as the app's Guard does: a bug is a clean refusal, its trace frames only logged
        log.error(
            "unhandled %s on %s (mcp): %s",
            type(exc).__name__,
            path,
            tracelog.whole(exc) if tracelog.debugging() else tracelog.frames(exc),
        )
        raise client.ServerError(
            "The server failed to answer; try again, and report it if it persists.", "internal", 500
        ) from None
    status = answer["status"]
    try:
        parsed = orjson.loads(b"".join(answer["chunks"]))
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise client.ServerError("The server answered no JSON object; try again.", "internal", status)
    if status >= 400:
        code: str = parsed["error"] if isinstance(parsed.get("error"), str) else ""
        raise client.error_class(code, status)(str(parsed.get("message", "")), code, status, parsed)
    return parsed
