"""One request per route of ``ROUTES`` that succeeds when its caller has
enough scope: the one table of the scope tests (tests/api/test_api_scopes.py,
tests/api/test_scope_matrix.py), keyed ``"METHOD /path"`` as the route is
declared, each route's ``/m/{name}`` copy included.

A call that needs something of the memory it targets (a summary to forget, a
grant to revoke, a memory to delete) asks the test's world for it, with the
target the test passes through: each test keeps its own world, and the table
sends the same request whichever world answers."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlencode

from stash.web.routes import ROUTES
from tests.support.api import Api
from tests.support.mcp.oauth import REDIRECT, approved_code, authorize, nonce_of, pkce, register

HOST = "http://stash.test"  # the in-process client's address, the app's --url


class World(Protocol):
    """What a scope test's world gives the table; ``target`` is whatever the
    test passes to a call (the memory it reaches, or who calls)."""

    api: Api

    def forgettable(self, target: Any) -> str:
        """A block of the target memory that holds a summary to forget."""
        ...

    def revocable_grant(self, target: Any) -> int:
        """The id of a grant of the target memory that may be revoked."""
        ...

    def deletable_memory(self, target: Any) -> str:
        """The name of a memory of the target identity that may be deleted."""
        ...


class Form(dict):
    """A body sent as a form (the OAuth routes), from this server's own page (its Origin)."""


Call = tuple[str, str, dict | None]
Request = Callable[[World, Any], Call]


def route_key(method: str, path: str) -> str:
    return f"{method} {path}"


def today() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()


def oauth_code(w: World) -> tuple[str, str, str]:
    """A third identity's owner approves a registered client: (code, verifier, client id)."""
    code, verifier, reg = approved_code(w.api, w.api.init()["token"], HOST)
    return code, verifier, reg["client_id"]


def consent_form(w: World) -> Form:
    reg = register(w.api)
    page = authorize(w.api, reg["client_id"], pkce()[1])
    return Form(
        nonce=nonce_of(page.text), decision="approve", owner_token=w.api.init()["token"], scope="read", expires="never"
    )


def token_call(w: World, target: Any) -> Call:
    code, verifier, client_id = oauth_code(w)
    return (
        "POST",
        "/token",
        Form(
            grant_type="authorization_code",
            code=code,
            code_verifier=verifier,
            client_id=client_id,
            redirect_uri=REDIRECT,
        ),
    )


def authorize_call(w: World, target: Any) -> Call:
    reg = register(w.api)
    return (
        "GET",
        "/authorize?"
        + urlencode(
            {
                "response_type": "code",
                "client_id": reg["client_id"],
                "redirect_uri": REDIRECT,
                "code_challenge": pkce()[1],
                "code_challenge_method": "S256",
            }
        ),
        None,
    )


CALLS: dict[str, Request] = {
    "GET /health": lambda w, t: ("GET", "/health", None),
    "POST /health": lambda w, t: ("POST", "/health", {"ready": 1}),
    "POST /init": lambda w, t: ("POST", "/init", {"url": "https://stash.test"}),
    "GET /wake": lambda w, t: ("GET", "/wake", None),
    "POST /wake": lambda w, t: ("POST", "/wake", {}),
    "POST /note": lambda w, t: ("POST", "/note", {"text": "noted by a caller"}),
    "POST /nap": lambda w, t: ("POST", "/nap", {}),
    "GET /recall": lambda w, t: ("GET", "/recall?q=alpha", None),
    "POST /recall": lambda w, t: ("POST", "/recall", {"q": "alpha"}),
    "GET /zoom": lambda w, t: ("GET", "/zoom?block=0-1", None),
    "POST /zoom": lambda w, t: ("POST", "/zoom", {"block": "0-1"}),
    "POST /forget": lambda w, t: ("POST", "/forget", {"block": w.forgettable(t)}),
    "GET /config": lambda w, t: ("GET", "/config", None),
    "POST /config": lambda w, t: ("POST", "/config", {"WAKE_LINES": 50}),
    "POST /import": lambda w, t: ("POST", "/import", {"entries": [{"date": today(), "text": "imported"}]}),
    "GET /grants": lambda w, t: ("GET", "/grants", None),
    "POST /grants": lambda w, t: ("POST", "/grants", {"scope": "read"}),
    "DELETE /grants/{grant_id}": lambda w, t: ("DELETE", f"/grants/{w.revocable_grant(t)}", None),
    "POST /erase": lambda w, t: ("POST", "/erase", {"ids": [0]}),
    "POST /erase/undo": lambda w, t: ("POST", "/erase/undo", {"first": 0, "last": 0}),
    "GET /erasures": lambda w, t: ("GET", "/erasures", None),
    "GET /audit": lambda w, t: ("GET", "/audit", None),
    "DELETE /store": lambda w, t: ("DELETE", "/store", None),
    "POST /rotate": lambda w, t: ("POST", "/rotate", {}),
    "GET /export": lambda w, t: ("GET", "/export", None),
    "GET /openapi.json": lambda w, t: ("GET", "/openapi.json", None),
    "GET /client": lambda w, t: ("GET", "/client", None),
    "GET /skill": lambda w, t: ("GET", "/skill", None),
    "GET /reference": lambda w, t: ("GET", "/reference", None),
    "POST /reference": lambda w, t: ("POST", "/reference", {"part": 1}),
    "GET /shape": lambda w, t: ("GET", "/shape?T=10&lines=4", None),
    "POST /shape": lambda w, t: ("POST", "/shape", {"T": 10, "lines": 4}),
    "GET /metrics": lambda w, t: ("GET", "/metrics", None),
    "GET /": lambda w, t: ("GET", "/", None),
    "GET /memories": lambda w, t: ("GET", "/memories", None),
    "POST /memories": lambda w, t: ("POST", "/memories", {"name": f"n{os.urandom(4).hex()}"}),
    "DELETE /memories/{name}": lambda w, t: ("DELETE", f"/memories/{w.deletable_memory(t)}", None),
    "POST /memories/{source}/fork": lambda w, t: ("POST", "/memories/main/fork", {"name": f"f{os.urandom(4).hex()}"}),
    "POST /memories/erase": lambda w, t: ("POST", "/memories/erase", {"q": "nothing-matches-this", "dry_run": True}),
    "GET /console": lambda w, t: ("GET", "/console", None),
    "GET /console.js": lambda w, t: ("GET", "/console.js", None),
    "GET /console.css": lambda w, t: ("GET", "/console.css", None),
    "POST /mcp": lambda w, t: (
        "POST",
        "/mcp",
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "matrix", "version": "1"},
            },
        },
    ),
    "GET /.well-known/oauth-protected-resource": lambda w, t: ("GET", "/.well-known/oauth-protected-resource", None),
    "GET /.well-known/oauth-protected-resource/m/{name}/mcp": lambda w, t: (
        "GET",
        "/.well-known/oauth-protected-resource/m/main/mcp",
        None,
    ),
    "GET /.well-known/oauth-authorization-server": lambda w, t: (
        "GET",
        "/.well-known/oauth-authorization-server",
        None,
    ),
    "GET /authorize": authorize_call,
    "POST /authorize": lambda w, t: ("POST", "/authorize", consent_form(w)),
    "POST /token": token_call,
    "POST /register": lambda w, t: ("POST", "/register", {"client_name": "matrix", "redirect_uris": [REDIRECT]}),
}


def _under(base: Request) -> Request:
    """A route's /m/{name} copy, called on memory main (every token of the scope tests is bound to it)."""

    def call(w: World, target: Any) -> Call:
        method, url, body = base(w, target)
        return method, "/m/main" + url, body

    return call


CALLS.update({route_key(r.method, r.path): _under(CALLS[route_key(r.method, r.base)]) for r in ROUTES if r.under})
