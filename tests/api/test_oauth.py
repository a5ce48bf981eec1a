"""OAuth for MCP hosts through the app in process, step by step
(tests/support/mcp/oauth.py): the metadata, both kinds of client, the consent
form, the code exchange, and each attack the flow is built against — a
replayed code, a wrong verifier, another client's code, an unregistered
redirect URI, an approval never redeemed, a form posted without its nonce
or from elsewhere, a hostile host name, and what is left on disk of a
redeemed token."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stash.fleet import host
from stash.fleet import placement as pl
from stash.service import oauth
from stash.storage import oauth_state
from stash.web.app import create_app
from tests.support.api import Api, assert_error, make_settings
from tests.support.fleet import placement_doc
from tests.support.mcp.oauth import (
    REDIRECT,
    answer,
    approved_code,
    authorize,
    code_of,
    exchange,
    nonce_of,
    pkce,
    register,
)

PUBLIC = "https://stash.test"  # --url: the in-process client's host
ACCEPT = "application/json, text/event-stream"
SWEEP_WAIT_S = 20.0  # the sweeper runs every second; a loaded machine may be slow to get to it


@pytest.fixture
def api(data_dir: Path) -> Iterator[Api]:
    client = Api(create_app(make_settings(data_dir, public_url=PUBLIC, oauth_code_seconds=2)))
    yield client
    client.close()


@pytest.fixture
def owner(api: Api) -> str:
    return api.init()["token"]


def tools(api: Api, token: str, path: str = "/mcp") -> set[str] | int:
    resp = api.post(
        path,
        token,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Accept": ACCEPT, "MCP-Protocol-Version": "2025-06-18"},
    )
    return {t["name"] for t in resp.json()["result"]["tools"]} if resp.status_code == 200 else resp.status_code


def grant(api: Api, owner: str, grant_id: int) -> dict:
    return next(g for g in api.get("/grants", owner).json()["grants"] if g["id"] == grant_id)


def oauth_error(resp, status: int, error: str) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert body["error"] == error and body["error_description"], body
    assert resp.headers["cache-control"] == "no-store"
    return body


def test_the_metadata_points_a_host_at_every_endpoint(api: Api) -> None:
    prm = api.get("/.well-known/oauth-protected-resource").json()
    assert prm["authorization_servers"] == [PUBLIC] and prm["resource"] == f"{PUBLIC}/mcp"
    asm = api.get("/.well-known/oauth-authorization-server").json()
    assert asm["issuer"] == PUBLIC and asm["authorization_endpoint"] == f"{PUBLIC}/authorize"
    assert asm["token_endpoint"] == f"{PUBLIC}/token" and asm["registration_endpoint"] == f"{PUBLIC}/register"
    assert asm["code_challenge_methods_supported"] == ["S256"] and asm["client_id_metadata_document_supported"]
    assert asm["token_endpoint_auth_methods_supported"] == ["none"]


def test_the_flow_hands_the_host_a_capability_labelled_with_its_name(api: Api, owner: str) -> None:
    code, verifier, reg = approved_code(api, owner, PUBLIC, scope="read", expires="30d")
    resp = exchange(api, code, verifier, reg["client_id"])
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["token_type"] == "Bearer" and body["scope"] == "read" and 0 < body["expires_in"] <= 30 * 86400
    assert resp.headers["cache-control"] == "no-store"
    token = body["access_token"]
    assert tools(api, token) == {"wake", "recall", "zoom"}
    listed = [g for g in api.get("/grants", owner).json()["grants"] if g["label"] == "Test host"]
    assert len(listed) == 1 and listed[0]["scope"] == "read" and listed[0]["live"] and listed[0]["expires"]
    assert any(e["event"] == "mint" and e["grant"] == 1 for e in api.get("/audit", owner).json()["events"])
    # Revoked by the owner: refused at the host's next request.
    assert api.delete(f"/grants/{listed[0]['id']}", owner).status_code == 200
    assert tools(api, token) == 401


def test_a_memory_path_fixes_the_memory(api: Api, owner: str) -> None:
    assert api.post("/memories", owner, json={"name": "work"}).status_code == 201
    reg = register(api)
    verifier, challenge = pkce()
    page = authorize(api, reg["client_id"], challenge, resource=f"{PUBLIC}/m/work/mcp")
    assert 'value="work" readonly' in page.text
    # Whatever the form says, the memory is the one the host connects to.
    code = code_of(answer(api, nonce_of(page.text), owner, PUBLIC, memory="main"))
    token = exchange(api, code, verifier, reg["client_id"], resource=f"{PUBLIC}/m/work/mcp").json()["access_token"]
    assert tools(api, token, "/m/work/mcp") == {"wake", "note", "nap", "recall", "zoom", "forget"}
    assert api.post("/note", token, json={"text": "in work"}).status_code == 200
    assert api.post("/m/work/recall", owner, json={"q": "in work"}).json()["total"] == 1
    assert api.post("/recall", owner, json={"q": "in work"}).json()["total"] == 0


def test_a_replayed_code_is_refused_and_revokes_its_grant(api: Api, owner: str) -> None:
    code, verifier, reg = approved_code(api, owner, PUBLIC)
    token = exchange(api, code, verifier, reg["client_id"]).json()["access_token"]
    assert tools(api, token) != 401
    oauth_error(exchange(api, code, verifier, reg["client_id"]), 400, "invalid_grant")
    assert tools(api, token) == 401
    assert not [g for g in api.get("/grants", owner).json()["grants"] if g["label"] == "Test host" and g["live"]]
    oauth_error(exchange(api, code, verifier, reg["client_id"]), 400, "invalid_grant")  # and stays refused


@pytest.mark.parametrize("wrong", ["verifier", "client", "redirect", "resource"])
def test_a_code_redeemed_wrongly_gives_nothing_and_ends_its_grant(api: Api, owner: str, wrong: str) -> None:
    code, verifier, reg = approved_code(api, owner, PUBLIC)
    other = register(api, "Another host")
    args = {
        "verifier": (code, pkce()[0], reg["client_id"]),
        "client": (code, verifier, other["client_id"]),
        "redirect": (code, verifier, reg["client_id"], "http://127.0.0.1:43117/elsewhere"),
        "resource": (code, verifier, reg["client_id"]),
    }[wrong]
    more = {"resource": f"{PUBLIC}/m/other/mcp"} if wrong == "resource" else {}
    oauth_error(exchange(api, *args, **more), 400, "invalid_grant")
    # Nobody holds its token now: the grant is withdrawn, and the right redemption finds nothing either.
    oauth_error(exchange(api, code, verifier, reg["client_id"]), 400, "invalid_grant")
    (minted,) = [g for g in api.get("/grants", owner).json()["grants"] if g["label"] == "Test host"]
    assert minted["revoked"] and not minted["live"]


def test_redirect_uris_match_exactly_but_a_loopback_port(api: Api, owner: str) -> None:
    reg = register(api)
    _, challenge = pkce()
    for refused in (
        "http://127.0.0.1:43117/other",
        "https://evil.example/callback",
        "http://127.0.0.1:43117/callback/",
        "http://localhost:43117/callback",
    ):
        resp = authorize(api, reg["client_id"], challenge, refused)
        assert resp.status_code == 400 and "location" not in resp.headers, refused
        assert resp.headers["stash-error"] == "oauth.invalid_redirect_uri"
    # RFC 8252: a native app's loopback listener takes whatever port is free.
    assert authorize(api, reg["client_id"], challenge, "http://127.0.0.1:50001/callback").status_code == 200
    for uris in (["http://evil.example/callback"], ["https://x.example/cb#frag"], ["ftp://x.example/cb"], []):
        resp = api.post("/register", json={"redirect_uris": uris})
        assert oauth_error(resp, 400, "invalid_redirect_uri")
    assert authorize(api, "stash-client-unknown", challenge).status_code == 401  # an unknown client: on the page


def test_pkce_s256_is_required(api: Api) -> None:
    reg = register(api)
    for challenge, method in ((None, "S256"), ("a" * 43, "plain")):
        resp = authorize(api, reg["client_id"], challenge, code_challenge_method=method)
        assert resp.status_code == 303
        assert resp.headers["location"].startswith(REDIRECT + "?error=invalid_request&")
        assert "state=state-1" in resp.headers["location"]


def test_an_approval_never_redeemed_leaves_no_usable_grant(api: Api, owner: str, data_dir: Path) -> None:
    """--oauth-code-seconds 2 here (at most 55 on a server): the code lapses, and its grant is withdrawn by
    the sweep within the next second, whoever might have seen the code."""
    code, verifier, reg = approved_code(api, owner, PUBLIC)
    (minted,) = [g for g in api.get("/grants", owner).json()["grants"] if g["label"] == "Test host"]
    assert minted["live"]
    deadline = time.monotonic() + SWEEP_WAIT_S
    while grant(api, owner, minted["id"])["live"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not grant(api, owner, minted["id"])["live"], "the unredeemed grant is still live"
    oauth_error(exchange(api, code, verifier, reg["client_id"]), 400, "invalid_grant")
    with sqlite3.connect(data_dir / "oauth.db") as conn:
        assert conn.execute("SELECT count(*) FROM oauth_codes").fetchone()[0] == 0


def test_the_consent_form_needs_its_nonce_and_this_origin(api: Api, owner: str) -> None:
    reg = register(api)
    _, challenge = pkce()
    page = authorize(api, reg["client_id"], challenge)
    policy = page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy and "'unsafe-inline'" not in policy
    assert "form-action 'self' http://127.0.0.1:43117" in policy and page.headers["x-frame-options"] == "DENY"
    assert "<script" not in page.text
    nonce = nonce_of(page.text)
    for origin in ("https://evil.example", None):
        resp = answer(api, nonce, owner, origin)
        assert resp.status_code == 403 and resp.headers["stash-error"] == "consent.bad_origin"
    resp = answer(api, "A" * 43, owner, PUBLIC)  # no such nonce
    assert resp.status_code == 400 and resp.headers["stash-error"] == "consent.expired"
    resp = api.post(
        "/authorize",
        content=b"decision=approve&owner_token=" + owner.encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded", "Origin": PUBLIC},
    )
    assert resp.status_code == 400 and resp.headers["stash-error"] == "request.missing_field"
    assert answer(api, nonce, owner, PUBLIC).status_code == 303  # the page's own form, at last
    assert answer(api, nonce, owner, PUBLIC).headers["stash-error"] == "consent.expired"  # taken once
    assert owner not in json.dumps(dict(resp.headers)) and owner not in resp.text


def test_a_wrong_owner_token_keeps_the_form_and_mints_nothing(api: Api, owner: str) -> None:
    reg = register(api)
    _, challenge = pkce()
    nonce = nonce_of(authorize(api, reg["client_id"], challenge).text)
    before = api.get("/grants", owner).json()["grants"]
    stranger = api.init()["token"]
    for token in (owner[:-3] + "AAA", stranger[:30]):
        resp = answer(api, nonce, token, PUBLIC)
        assert resp.status_code == 401 and 'id="error"' in resp.text and token not in resp.text
        nonce = nonce_of(resp.text)  # the form again, under a fresh nonce
    assert api.get("/grants", owner).json()["grants"] == before
    assert (
        answer(api, nonce, owner, PUBLIC, decision="deny")
        .headers["location"]
        .startswith(REDIRECT + "?error=access_denied")
    )


def test_wrong_owner_tokens_on_the_consent_page_spend_the_addresss_failure_budget(data_dir: Path) -> None:
    """The consent page is no way around the failure budget every token route has: past it, even the right
    owner token is refused, and nothing is minted."""
    api = Api(create_app(make_settings(data_dir, public_url=PUBLIC, auth_failures_per_minute=2)))
    try:
        owner = api.init()["token"]
        _, challenge = pkce()
        nonce = nonce_of(authorize(api, register(api)["client_id"], challenge).text)
        for _ in range(2):
            resp = answer(api, nonce, owner[:-3] + "AAA", PUBLIC)
            assert resp.status_code == 401, resp.status_code
            nonce = nonce_of(resp.text)
        resp = answer(api, nonce, owner, PUBLIC)
        assert resp.status_code == 429 and resp.headers["stash-error"] == "rate_limited", resp.status_code
        assert int(resp.headers["retry-after"]) > 0 and "location" not in resp.headers
        assert [g["id"] for g in api.get("/grants", owner).json()["grants"]] == [1]
    finally:
        api.close()


def test_a_hostile_client_name_is_text_on_the_page_and_in_the_label(api: Api, owner: str) -> None:
    hostile = '<script>alert(1)</script><img src=x onerror="x()"> \u202eevil "quoted" & more'
    reg = register(api, hostile)
    verifier, challenge = pkce()
    page = authorize(api, reg["client_id"], challenge)
    assert "<script>" not in page.text and "<img" not in page.text and "&lt;script&gt;alert(1)" in page.text
    code = code_of(answer(api, nonce_of(page.text), owner, PUBLIC))
    assert exchange(api, code, verifier, reg["client_id"]).status_code == 200
    (label,) = [g["label"] for g in api.get("/grants", owner).json()["grants"] if g["id"] > 1]
    assert label.startswith("<script>alert(1)</script>") and "\u202e" not in label and len(label.encode()) <= 64


def test_nothing_of_a_redeemed_token_is_left_in_any_file(api: Api, owner: str, data_dir: Path) -> None:
    code, verifier, reg = approved_code(api, owner, PUBLIC)
    with sqlite3.connect(data_dir / "oauth.db") as conn:
        (sealed,) = conn.execute("SELECT sealed FROM oauth_codes").fetchone()
    sealed = bytes(sealed)
    token = exchange(api, code, verifier, reg["client_id"]).json()["access_token"]
    pieces = [sealed, sealed[24:56], token.encode(), token.split("_")[2][:20].encode(), code.encode()]
    for path in data_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not [p for p in pieces if p in data], path.name
    assert (data_dir / "oauth.db").is_file()


def test_registration_is_rate_limited_per_address(data_dir: Path) -> None:
    api = Api(create_app(make_settings(data_dir, public_url=PUBLIC, oauth_registrations_per_hour=3)))
    try:
        registrations_are_limited(api)
    finally:
        api.close()


def registrations_are_limited(api: Api) -> None:
    for _ in range(3):
        register(api)
    resp = api.post("/register", json={"redirect_uris": [REDIRECT]})
    assert oauth_error(resp, 429, "temporarily_unavailable") and int(resp.headers["retry-after"]) > 0
    assert_error(api.get("/wake", "not-a-token"), 401)  # other routes are not the registration limit's


def test_a_fleet_hosts_names_are_bound_into_what_they_name(data_dir: Path) -> None:
    """On a host of a fleet the client id names the host, the nonce the host, the code its user's shard
    (what any host sends each step on by); the name is part of the code, so a code renamed to travel to
    another shard is an unknown code there and here, and the code as given still works."""
    data_dir.mkdir(parents=True, exist_ok=True)
    # Host a's adopted placement: every shard is a's.
    pl.write(data_dir / "placement.json", pl.parse(placement_doc({"a": 8080}, [("0-f", "a")])))
    api = Api(create_app(make_settings(data_dir, public_url=PUBLIC, fleet_host="a")))
    try:
        owner = api.init()["token"]
        reg = register(api)
        assert reg["client_id"].startswith("stash-client-a.")
        verifier, challenge = pkce()
        page = authorize(api, reg["client_id"], challenge)
        assert nonce_of(page.text).startswith("a.")
        code = code_of(answer(api, nonce_of(page.text), owner, PUBLIC))
        digit = owner.split("_")[1][0]
        assert code.startswith(f"{digit}.")
        other = "0" if digit != "0" else "1"
        oauth_error(exchange(api, other + code[1:], verifier, reg["client_id"]), 400, "invalid_grant")
        assert exchange(api, code, verifier, reg["client_id"]).status_code == 200
    finally:
        api.close()


@pytest.mark.parametrize("memory", ["main", "notes"])
def test_a_host_that_no_longer_holds_the_owner_takes_nothing_of_its_code(data_dir: Path, memory: str) -> None:
    """Host a approved a code, then a placement gave the owner's shard to b and a moved the owner aside, as
    its serve master does: the code's exchange, answered on a (marked as sent on by another host), is 421
    fleet.elsewhere whatever its verifier, and once the code is past its time a's sweep does not count its
    grant withdrawn (it cannot reach it: the grant lives on b) nor forget the code."""
    data_dir.mkdir(parents=True, exist_ok=True)
    first = pl.parse(placement_doc({"a": 8080, "b": 9}, [("0-f", "a")], replica_root="/nonexistent/replicas"))
    host.adopt(data_dir, first, "a")
    api = Api(create_app(make_settings(data_dir, public_url=PUBLIC, fleet_host="a", oauth_code_seconds=2)))
    try:
        owner = api.init()["token"]
        if memory != "main":
            assert api.post("/memories", owner, json={"name": memory}).status_code == 201
        reg = register(api)
        verifier, challenge = pkce()
        page = authorize(api, reg["client_id"], challenge)
        code = code_of(answer(api, nonce_of(page.text), owner, PUBLIC, memory=memory))
        moved = first.with_shard_on("0-f", "b")
        host.adopt(data_dir, moved, "a")
        deadline = time.monotonic() + SWEEP_WAIT_S
        while api.get("/health").json()["placement_epoch"] != moved.epoch:
            assert time.monotonic() < deadline, "the app never read the new placement"
            time.sleep(0.05)
        assert host.release(data_dir, moved, "a") == [owner.split("_")[1]]
        for sent in ("x" * 43, verifier):  # a wrong verifier first: it must not spend the code either
            refused = exchange(api, code, sent, reg["client_id"], hop="b")
            oauth_error(refused, 421, "invalid_request")
            assert refused.headers["stash-error"] == "fleet.elsewhere"
        vault = api.app.state.vault
        with oauth_state.opened(data_dir) as conn:
            while not oauth_state.unredeemed_past(conn):  # the code's lifetime passes (2 s)
                assert time.monotonic() < deadline, "the code is gone before its time"
                time.sleep(0.05)
            assert oauth.sweep(vault) == 0
            assert len(oauth_state.unredeemed_past(conn)) == 1
    finally:
        api.close()
