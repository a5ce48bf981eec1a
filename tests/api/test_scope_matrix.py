"""The scope matrix of API-REFERENCE.md, checked against the live server:
every route of ``ROUTES``, called with no token, a bogus one, another
memory's owner token, read, full, owner and a revoked token of this memory,
answers as the matrix says. The matrix is generated from each route's scope
(stash/web/refgen.py, whose check keeps the document's copy fresh); this test
holds the server to it."""

from __future__ import annotations

import os
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
from tests.support.route_calls import CALLS, HOST, Form, route_key

# Refused callers go first and the owner last, so the one destructive call of
# a row (DELETE /store) comes after every other caller of it has been heard.
CALL_ORDER = ("none", "bogus", "revoked", "read", "full", "other user", "owner")


# ---------------------------------------------------------------- the world


@dataclass
class Store:
    owner: str
    marker: str


class World:
    """Two memories. Ours has a read, a full and a revoked capability; theirs
    is only reached through its owner token, the "other user" column."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.set_up = False  # a set-up below ran since the test last looked: it may have written to ours
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
            "none": None,
            "bogus": self.bogus,
            "other user": self.theirs.owner,
            "read": self.read,
            "full": self.full,
            "owner": self.ours.owner,
            "revoked": self.revoked,
        }[who]

    def target(self, who: str) -> Store:
        """The memory the caller's token names."""
        return self.theirs if who == "other user" else self.ours

    # set-ups that let a call of the table (tests/support/route_calls.py) succeed on the memory it targets

    def forgettable(self, store: Store) -> str:
        """Every pending nap answered, so block 0-1 holds a summary."""
        self.set_up = True
        nap = self.api.post("/nap", store.owner, json={}).json()["nap"]
        while nap is not None:
            resp = self.api.post("/nap", store.owner, json={"block": nap["block"], "text": f"sum {nap['block']}"})
            assert resp.status_code == 200, resp.text
            nap = resp.json()["nap"]
        return "0-1"

    def deletable_memory(self, store: Store) -> str:
        self.set_up = True
        name = f"m{os.urandom(4).hex()}"
        assert self.api.post("/memories", store.owner, json={"name": name}).status_code == 201
        return name

    def revocable_grant(self, store: Store) -> int:
        self.set_up = True
        self._grant(store, "read")
        return self._grant_ids(store)[-1]


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
    # Ours as the last untouching call left it, read after that call: the state before the next one, unless a
    # set-up or a call that may write to ours came between.
    known: dict[str, bytes] | None = None
    for route in order:
        for who in CALL_ORDER:
            cell = matrix[route][who]
            touches_ours = who in ("read", "full", "owner") and cell == "2xx"
            method, url, body = CALLS[route](world, world.target(who))
            if touches_ours or world.set_up:
                known, world.set_up = None, False
            before = None if touches_ours else known if known is not None else state(api, world.ours.owner)
            kw: dict[str, Any] = {} if body is None else {"json": body}
            if isinstance(body, Form):
                kw = {
                    "content": urlencode(body).encode(),
                    "headers": {"Content-Type": "application/x-www-form-urlencoded", "Origin": HOST},
                }
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
                    known = state(api, world.ours.owner)
                    assert known == before, "this memory changed"
            except AssertionError as e:
                failures.append(f"{route} [{who}] expected {cell}, got {resp.status_code}: {e}")
                known = None
    assert failures == [], "\n".join(failures)
    assert [len(answers) for answers in unauthorized.values()] == [1, 1], unauthorized  # one 401 per protocol
    # The last call destroyed ours: all its tokens are dead now.
    for who in ("owner", "read", "full"):
        assert_error(api.get("/wake", world.token(who)), 401, "auth.invalid")
