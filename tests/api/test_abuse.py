"""Abuse (docs/DESIGN.md, "Tokens"; API-REFERENCE "Limits and rate limiting"): failed
authentication and identity minting are limited per client address, a
bogus token never costs an argon2 run, /init can be closed or put behind an
invite, and a token sent in a query string is refused and never logged."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import argon2.low_level
import httpx
import pytest

from stash.crypto import tokens
from stash.web.app import create_app
from tests.support.api import CHEAP_KDF, Api, assert_error, make_settings
from tests.support.forgery import random_secret_digits, with_checksum


def at(app, host: str) -> Api:
    """A client of ``app`` whose requests come from ``host``."""
    client = Api(app)
    client.loop.run_until_complete(client.client.aclose())
    client.client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, client=(host, 40000)), base_url="http://stash.test"
    )
    return client


@pytest.fixture
def clients():
    made: list[Api] = []

    def make(app, host: str = "127.0.0.1") -> Api:
        made.append(at(app, host))
        return made[-1]

    yield make
    for c in made:
        c.close()


def users(data_dir: Path) -> list[str]:
    folder = data_dir / "users"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def retry_after(resp) -> int:
    assert_error(resp, 429, "rate_limited")
    value = resp.headers["retry-after"]
    assert value.isdigit() and 1 <= int(value) <= 60, value
    return int(value)


# ---------------------------------------------------------------- failed authentication


def test_failed_authentication_is_limited_per_address(data_dir: Path, clients) -> None:
    app = create_app(make_settings(data_dir, auth_failures_per_minute=5, kdf=CHEAP_KDF))
    a, b, c = clients(app, "203.0.113.7"), clients(app, "198.51.100.9"), clients(app, "192.0.2.44")
    owner = a.init()["token"]
    bogus = owner[:-1] + ("A" if owner[-1] != "A" else "B")
    # Successful requests cost nothing from the budget.
    for _ in range(8):
        assert a.get("/wake", owner).status_code == 200
    # Every way of failing counts: no token, bad checksum, unknown grant.
    unknown_grant = with_checksum(owner[:24] + random_secret_digits())
    assert tokens.parse(unknown_grant) is not None
    for token in (None, bogus, unknown_grant, bogus, None):
        assert_error(a.get("/wake", token), 401, "auth.invalid")
    # The sixth failure is refused before any token work, but a valid token is not: others failing at
    # its address (a NAT, a shared proxy) never lock it out.
    retry_after(a.get("/wake", bogus))
    retry_after(a.get("/wake", unknown_grant))
    assert a.get("/wake", owner).status_code == 200
    assert a.post("/note", owner, json={"text": "not locked out"}).status_code == 200
    # Another address has its own budget.
    assert_error(b.get("/wake", bogus), 401, "auth.invalid")
    wake = b.get("/wake", owner)
    assert wake.status_code == 200 and wake.json()["T"] == 1
    # A valid token's malformed request does not count; an unknown grant's is refused as such before its
    # body is read (so it counts, and says nothing of the body).
    for _ in range(4):
        assert_error(c.post("/note", owner, content=b"{not json"), 400, "request.bad_json")
    for _ in range(5):
        assert_error(c.post("/note", unknown_grant, content=b"{not json"), 401, "auth.invalid")
    retry_after(c.post("/note", unknown_grant, content=b"{not json"))
    assert c.get("/wake", owner).status_code == 200


def test_a_bogus_token_never_reaches_argon2(data_dir: Path, clients, monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app(make_settings(data_dir, kdf=CHEAP_KDF))
    api = clients(app)
    owner = api.init()["token"]
    other = api.init()["token"]
    reader = api.post("/grants", owner, json={"scope": "read"}).json()
    assert api.delete(f"/grants/{reader['id']}", owner).status_code == 200

    calls = []
    real = argon2.low_level.hash_secret_raw

    def counting(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(argon2.low_level, "hash_secret_raw", counting)
    # The instrument works: one valid request runs argon2 exactly once.
    assert api.get("/wake", owner).status_code == 200
    assert len(calls) == 1
    calls.clear()

    bad = {
        "bad checksum": owner[:-1] + ("A" if owner[-1] != "A" else "B"),
        "malformed": "stash1_nothing_like_a_token",
        "unknown grant": with_checksum(owner[:24] + random_secret_digits()),
        "unknown user": with_checksum(f"stash1_{os.urandom(8).hex()}_" + random_secret_digits()),
        "another user's secret": with_checksum(owner[:24] + other[24:-6]),
        "revoked": reader["token"],
    }
    for name, token in bad.items():
        for method, url, body in (("GET", "/wake", None), ("POST", "/note", {"text": "x"}), ("DELETE", "/store", None)):
            kw = {} if body is None else {"json": body}
            assert_error(api.request(method, url, token, **kw), 401, "auth.invalid")
        assert calls == [], f"{name}: argon2 ran {len(calls)} times"


# ---------------------------------------------------------------- minting identities


def test_init_is_limited_per_address(data_dir: Path, clients) -> None:
    app = create_app(make_settings(data_dir, init_per_minute=3, kdf=CHEAP_KDF))
    a, b = clients(app, "203.0.113.7"), clients(app, "198.51.100.9")
    # Refused mints do not count.
    for _ in range(4):
        assert_error(a.post("/init", json={"url": "ftp://nope"}), 422, "init.bad_url")
    minted = [a.post("/init", json={}) for _ in range(3)]
    assert [r.status_code for r in minted] == [201, 201, 201]
    retry_after(a.post("/init", json={}))
    assert len(users(data_dir)) == 3, "a refused mint created a memory"
    assert b.post("/init", json={}).status_code == 201
    assert len(users(data_dir)) == 4
    # The memories minted before the limit work.
    for r in minted:
        assert a.get("/wake", r.json()["token"]).status_code == 200


def test_init_can_be_switched_off(data_dir: Path, clients) -> None:
    app = create_app(make_settings(data_dir, init="off", kdf=CHEAP_KDF))
    api = clients(app)
    for body in ({}, {"url": "https://stash.test"}, {"invite": "anything"}):
        assert_error(api.post("/init", json=body), 403, "init.disabled")
    assert_error(api.post("/init"), 403, "init.disabled")
    assert users(data_dir) == []
    # The rest of the server works for identities the operator made another way.
    ident = app.state.vault.create_identity()
    assert api.post("/note", ident.token, json={"text": "made by the operator"}).status_code == 200


def test_init_by_invitation(data_dir: Path, clients) -> None:
    invite = os.urandom(12).hex()
    app = create_app(
        make_settings(data_dir, init="invite", invite_secret=invite, auth_failures_per_minute=3, kdf=CHEAP_KDF)
    )
    a, b = clients(app, "203.0.113.7"), clients(app, "198.51.100.9")
    missing = a.post("/init", json={})
    wrong = a.post("/init", json={"invite": invite[:-1] + ("0" if invite[-1] != "0" else "1")})
    for resp in (missing, wrong):
        assert_error(resp, 403, "init.invite_required")
    assert missing.content == wrong.content, "a missing and a wrong invite must get the same answer"
    assert users(data_dir) == []
    right = a.post("/init", json={"invite": invite})
    assert right.status_code == 201, right.text
    assert a.get("/wake", right.json()["token"]).status_code == 200
    # Wrong invites are failed authentications: the third locks the address out,
    # even for the right invite.
    assert_error(a.post("/init", json={"invite": ""}), 403, "init.invite_required")
    retry_after(a.post("/init", json={"invite": invite}))
    assert len(users(data_dir)) == 1
    assert b.post("/init", json={"invite": invite}).status_code == 201
    assert len(users(data_dir)) == 2


# ---------------------------------------------------------------- tokens in query strings


def test_a_token_in_a_query_string_is_refused_and_never_logged(
    data_dir: Path, clients, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(make_settings(data_dir, kdf=CHEAP_KDF))
    api = clients(app)
    owner = api.init()["token"]
    assert api.post("/note", owner, json={"text": "one memory"}).status_code == 200
    secret = owner[24:-6]
    caplog.set_level(logging.DEBUG)
    caplog.clear()
    requests = [
        ("GET", f"/wake?token={owner}", owner),
        ("GET", f"/wake?access_token={owner}", None),
        ("GET", f"/recall?q={owner}", owner),
        ("GET", f"/zoom?block=0-1&Authorization={owner}", owner),
        ("GET", f"/health?api_key={owner}", None),
        ("GET", f"/shape?T=3&lines={owner}", None),
        ("GET", f"/export?bearer={owner}", owner),
        ("POST", f"/note?token={owner}", owner),
        ("DELETE", f"/store?key={owner}", owner),
        ("GET", f"/no-such-route?token={owner}", None),
    ]
    for method, url, token in requests:
        kw = {"json": {"text": "smuggled"}} if method == "POST" else {}
        resp = api.request(method, url, token, **kw)
        if "no-such-route" in url:
            assert_error(resp, 404, "route.unknown")
        else:
            assert_error(resp, 400, "auth.token_in_query")
        assert secret not in resp.text
    # Nothing ran: the memory is as it was, and it still exists.
    wake = api.get("/wake", owner).json()
    assert wake["T"] == 1 and wake["lines"][0].endswith(" one memory")
    # The capture sees what is logged: the test client's own log line does carry
    # the URL, token and all. The server's loggers must not.
    assert any(secret in r.getMessage() for r in caplog.records if r.name.startswith("httpx"))
    records = [r for r in caplog.records if r.name.startswith("stash")]
    access = [r for r in records if r.name == "stash.access"]
    assert len(access) >= len(requests), "the access log did not record the requests"
    for r in records:
        text = " ".join([r.getMessage(), repr(r.args), r.exc_text or "", str(r.msg)])
        assert secret not in text and "stash1_" not in text, (r.name, text)
    # The access log carries the route template, never the query string.
    assert all("?" not in r.getMessage() for r in access)
