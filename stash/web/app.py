"""The ASGI application: routing, the one error renderer, access log, metrics.

Routes are declared in :mod:`stash.web.routes`; each parses its request, calls one
function of the service layer and returns. This module wraps every request so
that any failure becomes the JSON error shape and nothing else — no traceback,
path, key, token or memory text — reaches the client or a log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.errors import NotFound, StashError
from ..fleet.forward import Fleet
from ..service import oauth, words_scan
from ..service.access import Vault
from . import pages, plaintext, tracelog
from .dispatch import Protocol, RouteSpec
from .errors import error_response
from .fairshare import Shares
from .forwarded import TrustedProxies
from .metrics import Metrics
from .ratelimit import RateLimiter
from .routes import ROUTES
from .settings import Settings, from_env
from .stopping import drain, stopping_error

KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
access_log = logging.getLogger("stash.access")
error_log = logging.getLogger("stash.error")


class Guard:
    """Outermost middleware: renders every failure as the error shape, logs one
    line per request (method, route template, status, time — never the query
    string), and counts it. Requests reach their route through Starlette's
    router only."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500, "started": False}
        # A scrape does not count itself as a request in flight.
        counted = scope["path"] != "/metrics"
        if counted:
            self.metrics.request_started()

        async def tracked_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                status["started"] = True
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except asyncio.CancelledError:
            # Cut by the shutdown timeout before an answer began (web/stopping.py): Stash's error shape, not
            # uvicorn's bare 500.
            if not status["started"]:
                cut = stopping_error()
                scope["stash.error"] = cut.code
                await error_response(cut)(scope, receive, tracked_send)
        except Exception as exc:  # the one place that turns a bug into a clean 500
            error_log.error(
                "unhandled %s on %s: %s",
                type(exc).__name__,
                scope.get("stash.route", "-"),
                tracelog.whole(exc) if tracelog.debugging() else tracelog.frames(exc),
            )
            if not status["started"]:
                scope["stash.error"] = StashError.code
                err = StashError("The server failed to answer; try again, and report it if it persists.")
                await error_response(err)(scope, receive, tracked_send)
        finally:
            elapsed = time.perf_counter() - start
            route = scope.get("stash.route", "-")
            # The method is whatever the client sent: only known ones become a
            # label or a log word, so no text of the client's reaches either.
            method = scope["method"] if scope["method"] in KNOWN_METHODS else "OTHER"
            self.metrics.observe(method, route, status["code"], elapsed, scope.get("stash.error"))
            if counted:
                self.metrics.request_finished()
            access_log.info("%s %s %d %.1fms", method, route, status["code"], elapsed * 1000)


def allowed_methods(app: Starlette, scope: Scope) -> list[str]:
    """Every method some route takes at this path. Each method of a path is a
    route of its own, so Starlette's 405 would name only the first route's."""
    found: dict[int, set[str]] = {}
    for route in app.router.routes:
        match, _ = route.matches({**scope, "method": "GET"})
        if match is not Match.NONE:
            # A literal segment is more specific than a parameter: /memories/erase is its own route, not
            # memory "erase" of /memories/{name} (a name no memory may take).
            found.setdefault(getattr(route, "path", "").count("{"), set()).update(getattr(route, "methods", None) or ())
    return sorted(found[min(found)]) if found else []


def _reference_url(request: Request) -> str:
    """Where this server serves its API reference, as its users reach it."""
    address = pages.page_address(request.app.state.settings.public_url, request.url.scheme, request.headers.get("host"))
    return f"{address}/reference"


async def not_found(request: Request, exc: Exception) -> Response:
    """404 and 405 as every refusal is answered: JSON, or plain text when
    ``Accept`` asks for it (a 404 is where a curl user most needs to read)."""
    resp = _unrouted(request, getattr(exc, "status_code", 404))
    return plaintext.as_text(request.url.path, resp) if plaintext.wants_text(request) else resp


def _protocol_at(app: Starlette, scope: Scope) -> Protocol | None:
    """The protocol of the routes at this path, when their bodies are another protocol's (/mcp)."""
    for route in app.router.routes:
        spec = getattr(getattr(route, "endpoint", None), "__self__", None)
        if (
            isinstance(spec, RouteSpec)
            and spec.protocol is not None
            and route.matches({**scope, "method": spec.method})[0] is Match.FULL
        ):
            return spec.protocol
    return None


def _unrouted(request: Request, code: int) -> Response:
    request.scope["stash.error"] = "method_not_allowed" if code == 405 else "route.unknown"
    if code == 405:
        err = StashError(
            f"This route does not take that method; the reference at {_reference_url(request)} "
            "lists each route's methods.",
            code="method_not_allowed",
        )
        err.status = 405
        protocol = _protocol_at(request.app, request.scope)
        resp = error_response(err) if protocol is None else protocol.refusal(request, err)
        resp.headers["Allow"] = ", ".join(allowed_methods(request.app, request.scope))
        return resp
    path = request.url.path
    if len(path) > 1 and path.endswith("/") and _routed(request.app, request.scope, path.rstrip("/")):
        return error_response(
            NotFound(
                f"No such route: drop the trailing slash ({path.rstrip('/')}); the routes are "
                f"listed at {_reference_url(request)}.",
                code="route.unknown",
            )
        )
    return error_response(
        NotFound(f"No such route; the routes are listed at {_reference_url(request)}.", code="route.unknown")
    )


def _routed(app: Starlette, scope: Scope, path: str) -> bool:
    """Some route takes ``path`` (by any method)."""
    return any(
        route.matches({**scope, "path": path, "method": "GET"})[0] is not Match.NONE for route in app.router.routes
    )


WARM_THREAD = "tag-index-warm"
WARM_JOIN_S = 10.0  # the warm stops between users: one key ring's load at most
SWEEP_THREAD = "oauth-sweep"
SWEEP_EVERY_S = 1.0  # an unredeemed code's grant goes within this of the code's expiry


def sweep_oauth(vault: Vault, stop: threading.Event) -> None:
    """Every second, withdraw the grant of each MCP host's code nobody redeemed in time (service/oauth.py);
    a server with no OAuth state file does one stat a second."""
    while not stop.wait(SWEEP_EVERY_S):
        try:
            oauth.sweep(vault)
        except Exception as exc:  # a bad moment of one file; the next second tries again
            error_log.error("oauth sweep failed: %s", tracelog.frames(exc))


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    """A user's files stay open for ``--keep-open`` seconds after its last
    request, for the next one: the pool that keeps them is built here and
    handed to the vault for the server's life (Vault.keeping_files_open,
    storage/sqlite/pool.py). By the time the server has drained its requests on
    SIGTERM, what is left is to close that pool — every file still open
    checkpoints its WAL into the file and removes it — and stop the metrics
    writer. The thread that warms the tag index is stopped and waited for
    first: it reads key rings, and a reader still closing one after the
    shutdown would remove that file's WAL under whoever copies the folder
    next. An app driven without its lifespan keeps no file open."""
    vault = app.state.vault
    app.state.metrics.start()
    stop = threading.Event()
    if app.state.owns_process:
        vault.interrupt_work(stop=False)
    try:
        with vault.keeping_files_open(app.state.settings.keep_open):
            warm = threading.Thread(target=vault.tags.warm, args=(stop,), name=WARM_THREAD, daemon=True)
            warm.start()
            sweeper = threading.Thread(target=sweep_oauth, args=(vault, stop), name=SWEEP_THREAD, daemon=True)
            sweeper.start()
            try:
                yield
                if app.state.owns_process:
                    # Every request is answered or was cut by the shutdown timeout: what still runs in a
                    # file ends now (web/stopping.py), or a thread caught in one would keep the process alive.
                    vault.interrupt_work()
                await drain(app.state.works)  # requests cut by the shutdown timeout finish their work first
            finally:
                stop.set()
                warm.join(timeout=WARM_JOIN_S)
                sweeper.join(timeout=WARM_JOIN_S)
    finally:
        app.state.metrics.stop()


def create_app(settings: Settings, *, owns_process: bool = False) -> Starlette:
    """The app. ``owns_process``: it is the server of this process (a
    ``stash serve`` worker), so its shutdown interrupts every statement
    still running in the process's files, not only its own requests'."""
    placed = None
    if settings.fleet_host is not None:
        from ..fleet.host import Adopted

        placed = Adopted(Path(settings.data_dir), settings.fleet_host)
    vault = Vault(Path(settings.data_dir), settings.kdf, settings.file_cipher, settings.id_prefixes, placed=placed)
    words_scan.use_index(settings.word_index == "on")
    # A host of a fleet replicates while the placement gives it a shard: a standby starts when a failover gives it one.
    replicating = vault.replicating if placed is not None else settings.replicate is not None
    metrics = Metrics(Path(settings.data_dir), shared=settings.workers > 1, replicating=replicating)
    routes = [Route(r.path, r.endpoint, methods=[r.method], name=f"{r.method} {r.path}") for r in ROUTES]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found}, lifespan=lifespan)
    app.router.redirect_slashes = False  # no route ends in "/": a trailing slash is 404, not a redirect
    app.state.vault = vault
    app.state.routes = ROUTES
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.limiter = RateLimiter()
    app.state.works = set()  # every request's work in its thread (web/stopping.py)
    app.state.owns_process = owns_process
    app.state.shares = Shares(settings.user_concurrency, settings.user_slow, settings.slow_slots)
    app.state.proxies = TrustedProxies(settings.trusted_proxies)
    # A host of a fleet: the OAuth steps that carry no token are sent on to the host that keeps their state.
    app.state.fleet = None if settings.fleet_host is None else Fleet(Path(settings.data_dir), settings.fleet_host)
    app.add_middleware(Guard, metrics=metrics)
    return app


def app_from_env() -> Starlette:
    """The app of one ``stash serve`` worker, from the settings its parent put
    in the environment (see :mod:`stash.web.settings`)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    return create_app(from_env(), owns_process=True)
