"""The scope matrix of API-REFERENCE.md, checked against the live server:
every route of ``ROUTES``, called with no token, a bogus one, another
memory's owner token, read, full, owner and a revoked token of this memory,
answers as the matrix says. The matrix is generated from each route's scope
(stash/web/refgen.py, whose check keeps the document's copy fresh); this test
holds the server to it."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from stash.crypto import tokens
from stash.web.app import create_app
from stash.web.refgen import MATRIX_COLUMNS, matrix_row
from stash.web.routes import ROUTES
from tests.api.support import state
from tests.support.api import CHEAP_KDF, Api, assert_error, make_settings
from tests.support.mcp.oauth import REDIRECT, approved_code, authorize, nonce_of, pkce, register

# Refused callers go first and the owner last, so the one destructive call of
# a row (DELETE /store) comes after every other caller of it has been heard.
CALL_ORDER = ("none", "bogus", "revoked", "read", "full", "other user", "owner")


def route_key(method: str, path: str) -> str:
    return f"{method} {path}"


# ---------------------------------------------------------------- the world


@dataclass
class Store:
    owner: str
    marker: str


def today() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()


class World:
    """Two memories. Ours has a read, a full and a revoked capability; theirs
    is only reached through its owner token, the "other user" column."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.ours = self._store("ours")
        self.theirs = self._store("theirs")
        self.read = self._grant(self.ours, "read")
        self.full = self._grant(self.ours, "full")
        self.revoked = self._grant(self.ours, "full")
        revoked_id = self._grant_ids(self.ours)[-1]
        assert api.delete(f"/grants/{revoked_id}", self.ours.owner).status_code == 200
        # One character changed in the checksum: a token that can never be live.
        last = self.ours.owner[-1]
        self.bogus = self.ours.owner[:-1] + ("A" if last != "A" else "B")
        assert tokens.parse(self.bogus) is None

    def _store(self, name: str) -> Store:
        store = Store(self.api.init()["token"], f"{name}-{os.urandom(5).hex()}")
        for i in range(4):
            resp = self.api.post("/note", store.owner, json={"text": f"{store.marker} alpha {i}"})
            assert resp.status_code == 200, resp.text
        return store

    def _grant(self, store: Store, scope: str) -> str:
        resp = self.api.post("/grants", store.owner, json={"scope": scope})
        assert resp.status_code == 201, resp.text
        return resp.json()["token"]

    def _grant_ids(self, store: Store) -> list[int]:
        return [g["id"] for g in self.api.get("/grants", store.owner).json()["grants"]]

    def token(self, who: str) -> str | None:
        return {
            "none": None, "bogus": self.bogus, "other user": self.theirs.owner, "read": self.read,
            "full": self.full, "owner": self.ours.owner, "revoked": self.revoked,
        }[who]

    def target(self, who: str) -> Store:
        """The memory the caller's token names."""
        return self.theirs if who == "other user" else self.ours

    # set-ups that let a call succeed on the memory it targets

    def settle(self, store: Store) -> None:
        nap = self.api.post("/nap", store.owner, json={}).json()["nap"]
        while nap is not None:
            resp = self.api.post("/nap", store.owner, json={"block": nap["block"], "text": f"sum {nap['block']}"})
            assert resp.status_code == 200, resp.text
            nap = resp.json()["nap"]

    def fresh_memory(self, store: Store) -> str:
        name = f"m{os.urandom(4).hex()}"
        assert self.api.post("/memories", store.owner, json={"name": name}).status_code == 201
        return name

    def fresh_grant(self, store: Store) -> int:
        self._grant(store, "read")
        return self._grant_ids(store)[-1]


class Form(dict):
    """A body sent as a form (the OAuth routes), from this server's own page (its Origin)."""


Call = tuple[str, str, dict | None]
HOST = "http://stash.test"  # the in-process client's address, the app's --url


def oauth_code(w: World) -> tuple[str, str, str]:
    """A third identity's owner approves a registered client: (code, verifier, client id)."""
    code, verifier, reg = approved_code(w.api, w.api.init()["token"], HOST)
    return code, verifier, reg["client_id"]


def consent_form(w: World) -> Form:
    reg = register(w.api)
    page = authorize(w.api, reg["client_id"], pkce()[1])
    return Form(nonce=nonce_of(page.text), decision="approve", owner_token=w.api.init()["token"], scope="read",
                expires="never")


def token_call(w: World, s: Store) -> Call:
    code, verifier, client_id = oauth_code(w)
    return "POST", "/token", Form(grant_type="authorization_code", code=code, code_verifier=verifier,
                                  client_id=client_id, redirect_uri=REDIRECT)


def authorize_call(w: World, s: Store) -> Call:
    reg = register(w.api)
    return "GET", "/authorize?" + urlencode({"response_type": "code", "client_id": reg["client_id"],
                                             "redirect_uri": REDIRECT, "code_challenge": pkce()[1],
                                             "code_challenge_method": "S256"}), None


def forget_call(w: World, s: Store) -> Call:
    w.settle(s)
    return "POST", "/forget", {"block": "0-1"}


CALLS: dict[str, Callable[[World, Store], Call]] = {
    "GET /health": lambda w, s: ("GET", "/health", None),
    "POST /health": lambda w, s: ("POST", "/health", {"ready": 1}),
    "POST /init": lambda w, s: ("POST", "/init", {"url": "https://stash.test"}),
    "GET /wake": lambda w, s: ("GET", "/wake", None),
    "POST /wake": lambda w, s: ("POST", "/wake", {}),
    "POST /note": lambda w, s: ("POST", "/note", {"text": "noted by a caller"}),
    "POST /nap": lambda w, s: ("POST", "/nap", {}),
    "GET /recall": lambda w, s: ("GET", "/recall?q=alpha", None),
    "POST /recall": lambda w, s: ("POST", "/recall", {"q": "alpha"}),
    "GET /zoom": lambda w, s: ("GET", "/zoom?block=0-1", None),
    "POST /zoom": lambda w, s: ("POST", "/zoom", {"block": "0-1"}),
    "POST /forget": forget_call,
    "GET /config": lambda w, s: ("GET", "/config", None),
    "POST /config": lambda w, s: ("POST", "/config", {"WAKE_LINES": 50}),
    "POST /import": lambda w, s: ("POST", "/import", {"entries": [{"date": today(), "text": "imported"}]}),
    "GET /grants": lambda w, s: ("GET", "/grants", None),
    "POST /grants": lambda w, s: ("POST", "/grants", {"scope": "read"}),
    "DELETE /grants/{grant_id}": lambda w, s: ("DELETE", f"/grants/{w.fresh_grant(s)}", None),
    "POST /erase": lambda w, s: ("POST", "/erase", {"ids": [0]}),
    "POST /erase/undo": lambda w, s: ("POST", "/erase/undo", {"first": 0, "last": 0}),
    "GET /erasures": lambda w, s: ("GET", "/erasures", None),
    "GET /audit": lambda w, s: ("GET", "/audit", None),
    "DELETE /store": lambda w, s: ("DELETE", "/store", None),
    "POST /rotate": lambda w, s: ("POST", "/rotate", {}),
    "GET /export": lambda w, s: ("GET", "/export", None),
    "GET /openapi.json": lambda w, s: ("GET", "/openapi.json", None),
    "GET /client": lambda w, s: ("GET", "/client", None),
    "GET /skill": lambda w, s: ("GET", "/skill", None),
    "GET /reference": lambda w, s: ("GET", "/reference", None),
    "POST /reference": lambda w, s: ("POST", "/reference", {"part": 1}),
    "GET /shape": lambda w, s: ("GET", "/shape?T=10&lines=4", None),
    "POST /shape": lambda w, s: ("POST", "/shape", {"T": 10, "lines": 4}),
    "GET /metrics": lambda w, s: ("GET", "/metrics", None),
    "GET /": lambda w, s: ("GET", "/", None),
    "GET /memories": lambda w, s: ("GET", "/memories", None),
    "POST /memories": lambda w, s: ("POST", "/memories", {"name": f"n{os.urandom(4).hex()}"}),
    "DELETE /memories/{name}": lambda w, s: ("DELETE", f"/memories/{w.fresh_memory(s)}", None),
    "POST /memories/{source}/fork": lambda w, s: ("POST", "/memories/main/fork", {"name": f"f{os.urandom(4).hex()}"}),
    "POST /memories/erase": lambda w, s: ("POST", "/memories/erase", {"q": "nothing-matches-this", "dry_run": True}),
    "GET /console": lambda w, s: ("GET", "/console", None),
    "GET /console.js": lambda w, s: ("GET", "/console.js", None),
    "GET /console.css": lambda w, s: ("GET", "/console.css", None),
    "POST /mcp": lambda w, s: ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "matrix", "version": "1"}}}),
    "GET /.well-known/oauth-protected-resource": lambda w, s: ("GET", "/.well-known/oauth-protected-resource", None),
    "GET /.well-known/oauth-protected-resource/m/{name}/mcp": lambda w, s: (
        "GET", "/.well-known/oauth-protected-resource/m/main/mcp", None),
    "GET /.well-known/oauth-authorization-server": lambda w, s: (
        "GET", "/.well-known/oauth-authorization-server", None),
    "GET /authorize": authorize_call,
    "POST /authorize": lambda w, s: ("POST", "/authorize", consent_form(w)),
    "POST /token": token_call,
    "POST /register": lambda w, s: ("POST", "/register", {"client_name": "matrix", "redirect_uris": [REDIRECT]}),
}


def _under(base: Callable[[World, Store], Call]) -> Callable[[World, Store], Call]:
    """A route's /m/{name} copy, called on memory main (every token here is bound to it)."""
    def call(w: World, s: Store) -> Call:
        method, url, body = base(w, s)
        return method, "/m/main" + url, body
    return call


CALLS.update({route_key(r.method, r.path): _under(CALLS[route_key(r.method, r.base)]) for r in ROUTES if r.under})


@pytest.fixture
def matrix_api(data_dir: Path):
    # --url names the in-process client's host, so /mcp's Host check lets its calls in.
    client = Api(create_app(make_settings(data_dir, kdf=CHEAP_KDF, public_url=HOST)))
    yield client
    client.close()


def check(resp, cell: str, jsonrpc: bool = False, answered: int = 200) -> None:
    """``jsonrpc``: the route's refusals are JSON-RPC errors, the Stash code in their ``data``; ``answered``:
    the route's declared status (a redirect is POST /authorize's success)."""
    if cell == "2xx":
        assert 200 <= resp.status_code < 300 or resp.status_code == answered, (resp.status_code, resp.text[:300])
    elif jsonrpc:
        assert resp.status_code == int(cell) and resp.json()["error"]["data"]["error"] == "auth.invalid", resp.text
    elif cell == "401":
        assert_error(resp, 401, "auth.invalid")
    elif cell == "403":
        assert_error(resp, 403, "auth.scope")
    elif int(cell) >= 400:
        assert_error(resp, int(cell))
    else:
        assert resp.status_code == int(cell), (resp.status_code, resp.text[:300])


@pytest.mark.slow
def test_every_route_answers_every_token_as_the_reference_says(matrix_api: Api) -> None:
    matrix = {route_key(r.method, r.path): matrix_row(r) for r in ROUTES}
    jsonrpc = {route_key(r.method, r.path) for r in ROUTES if r.protocol is not None and r.protocol.name == "jsonrpc"}
    statuses = {route_key(r.method, r.path): r.status for r in ROUTES}
    served = list(matrix)
    assert sorted(CALLS) == sorted(served), "a route was added without a call in this test"
    assert set(CALL_ORDER) == set(MATRIX_COLUMNS)
    for route, row in matrix.items():
        # docs/DESIGN.md, "Tokens": a missing, bogus or revoked token gets one and the same answer.
        assert row["none"] == row["bogus"] == row["revoked"], route

    api = matrix_api
    world = World(api)
    # A rotation ends the owner token that made it: it runs just before the
    # store is destroyed, and the owner who rotated carries on with the new token.
    last = ("POST /rotate", "DELETE /store")
    order = [r for r in served if r not in last] + list(last)
    failures: list[str] = []
    unauthorized: dict[bool, set[bytes]] = {False: set(), True: set()}
    for route in order:
        for who in CALL_ORDER:
            cell = matrix[route][who]
            touches_ours = who in ("read", "full", "owner") and cell == "2xx"
            method, url, body = CALLS[route](world, world.target(who))
            before = None if touches_ours else state(api, world.ours.owner)
            kw: dict[str, Any] = {} if body is None else {"json": body}
            if isinstance(body, Form):
                kw = {"content": urlencode(body).encode(), "headers": {
                    "Content-Type": "application/x-www-form-urlencoded", "Origin": HOST}}
            resp = api.request(method, url, world.token(who), **kw)
            if route == "POST /rotate" and resp.status_code == 200:
                world.target(who).owner = resp.json()["token"]
            try:
                check(resp, cell, route in jsonrpc, statuses[route])
                if resp.status_code == 401:
                    unauthorized[route in jsonrpc].add(resp.content)
                if not touches_ours:
                    # Refused, public or another memory's call: ours is untouched and unseen.
                    assert world.ours.marker not in resp.text, "the answer carries this memory's text"
                    assert state(api, world.ours.owner) == before, "this memory changed"
            except AssertionError as e:
                failures.append(f"{route} [{who}] expected {cell}, got {resp.status_code}: {e}")
    assert failures == [], "\n".join(failures)
    assert [len(answers) for answers in unauthorized.values()] == [1, 1], unauthorized  # one 401 per protocol
    # The last call destroyed ours: all its tokens are dead now.
    for who in ("owner", "read", "full"):
        assert_error(api.get("/wake", world.token(who)), 401, "auth.invalid")
