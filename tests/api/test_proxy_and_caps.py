"""Operator options at the HTTP edge: the client address behind trusted
proxies (`--trusted-proxy`), as the rate limits and the /metrics check see it,
and the body caps (`--max-body`, `--max-import-body`)."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest

from stash.web.app import create_app
from tests.support.api import CHEAP_KDF, Api, assert_error, make_settings

BOGUS = "stash1_0123456789abcdef_" + "1" * 49  # the right shape, a wrong checksum: refused without file work
LOOPBACK_PROXY = ("127.0.0.1", "::1")


def at(app, host: str) -> Api:
    """A client of ``app`` whose TCP peer address is ``host``."""
    client = Api(app)
    client.loop.run_until_complete(client.client.aclose())
    client.client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, client=(host, 40000)), base_url="http://stash.test"
    )
    return client


@pytest.fixture
def peers():
    made: list[Api] = []

    def make(app, host: str) -> Api:
        made.append(at(app, host))
        return made[-1]

    yield make
    for c in made:
        c.close()


def xff(value: str | bytes) -> dict:
    return {"headers": {"X-Forwarded-For": value}}


def fail_auth(client: Api, times: int, **kw) -> None:
    for _ in range(times):
        assert_error(client.get("/wake", BOGUS, **kw), 401, "auth.invalid")


def limited(resp: httpx.Response) -> None:
    assert_error(resp, 429, "rate_limited")
    assert resp.headers["retry-after"].isdigit()


# ---------------------------------------------------------------- trusted proxies


def test_by_default_a_spoofed_header_is_ignored(data_dir: Path, peers) -> None:
    app = create_app(make_settings(data_dir, auth_failures_per_minute=3))
    attacker = peers(app, "198.51.100.4")
    for n in range(3):
        assert_error(attacker.get("/wake", BOGUS, **xff(f"203.0.113.{n}")), 401, "auth.invalid")
    # A fresh forged address does not buy a fresh budget: the peer is the client.
    limited(attacker.get("/wake", BOGUS, **xff("203.0.113.200")))
    limited(attacker.get("/wake", BOGUS))


def test_an_untrusted_peer_is_not_believed_even_when_proxies_are_configured(data_dir: Path, peers) -> None:
    app = create_app(make_settings(data_dir, auth_failures_per_minute=3, trusted_proxies=LOOPBACK_PROXY))
    attacker = peers(app, "198.51.100.4")
    for n in range(3):
        assert_error(attacker.get("/wake", BOGUS, **xff(f"127.0.0.{n + 1}")), 401, "auth.invalid")
    limited(attacker.get("/wake", BOGUS, **xff("203.0.113.200")))
    # Claiming to be loopback does not open /metrics either.
    assert_error(attacker.get("/metrics", **xff("127.0.0.1")), 403, "auth.operator")


def test_behind_a_trusted_proxy_the_real_client_is_limited(data_dir: Path, peers) -> None:
    app = create_app(
        make_settings(
            data_dir, auth_failures_per_minute=3, init_per_minute=2, kdf=CHEAP_KDF, trusted_proxies=LOOPBACK_PROXY
        )
    )
    proxy = peers(app, "127.0.0.1")
    owner = proxy.post("/init", json={}, **xff("192.0.2.50")).json()["token"]
    fail_auth(proxy, 3, **xff("203.0.113.9"))
    limited(proxy.get("/wake", BOGUS, **xff("203.0.113.9")))
    # Whatever that client writes to the left of what the proxy appended is its own text.
    limited(proxy.get("/wake", BOGUS, **xff("192.0.2.50, 203.0.113.9")))
    # Another client behind the same proxy keeps its budget, and its token works.
    assert proxy.get("/wake", owner, **xff("192.0.2.50")).status_code == 200
    assert_error(proxy.get("/wake", BOGUS, **xff("192.0.2.51")), 401, "auth.invalid")
    # Minting is counted per real client too: 192.0.2.50 minted once above.
    assert proxy.post("/init", json={}, **xff("192.0.2.50")).status_code == 201
    limited(proxy.post("/init", json={}, **xff("192.0.2.50")))
    assert proxy.post("/init", json={}, **xff("192.0.2.77")).status_code == 201


def test_ipv6_clients_behind_a_proxy_count_per_64(data_dir: Path, peers) -> None:
    app = create_app(make_settings(data_dir, auth_failures_per_minute=2, trusted_proxies=LOOPBACK_PROXY))
    proxy = peers(app, "::1")
    fail_auth(proxy, 1, **xff("2001:db8:1:2::a"))
    fail_auth(proxy, 1, **xff("2001:db8:1:2::b"))
    limited(proxy.get("/wake", BOGUS, **xff("2001:db8:1:2:ffff::1")))
    assert_error(proxy.get("/wake", BOGUS, **xff("2001:db8:1:3::a")), 401, "auth.invalid")


def test_metrics_see_the_resolved_client(data_dir: Path, peers) -> None:
    app = create_app(make_settings(data_dir, trusted_proxies=LOOPBACK_PROXY))
    proxy = peers(app, "127.0.0.1")
    # A request relayed from outside is not loopback, though the proxy is.
    assert_error(proxy.get("/metrics", **xff("203.0.113.9")), 403, "auth.operator")
    assert_error(proxy.get("/metrics", **xff("garbage")), 403, "auth.operator")
    # The proxy's own request (no header), or one made on the proxy host, is.
    assert proxy.get("/metrics").status_code == 200
    assert proxy.get("/metrics", **xff("127.0.0.1")).status_code == 200
    # Without trusted proxies the old rule holds: a loopback peer is loopback.
    plain = peers(create_app(make_settings(data_dir)), "127.0.0.1")
    assert plain.get("/metrics", **xff("203.0.113.9")).status_code == 200


MALFORMED = [
    b"",
    b",",
    b"garbage",
    b"203.0.113.9:443",
    b"1.1.1.1,, 2.2.2.2,",
    b"\xff\xfe\xfd",
    b"[::1",
    b"::1]",
    b"unknown",
    b"-",
    b"300.1.1.1",
    b"fe80::1%eth0",
    b"1.1.1.1 " * 2000,
    b",".join([b"10.0.0.1"] * 500),
]


@pytest.mark.parametrize("value", MALFORMED, ids=lambda v: repr(v[:20]))
def test_malformed_headers_never_break_a_request(data_dir: Path, peers, value: bytes) -> None:
    app = create_app(make_settings(data_dir, trusted_proxies=("127.0.0.1", "10.0.0.0/8")))
    proxy = peers(app, "127.0.0.1")
    assert proxy.get("/health", **xff(value)).status_code == 200
    assert proxy.post("/init", json={}, **xff(value)).status_code == 201
    assert_error(proxy.get("/wake", BOGUS, **xff(value)), 401, "auth.invalid")
    assert proxy.get("/metrics", **xff(value)).status_code in (200, 403)


def test_unreadable_chains_share_one_budget(data_dir: Path, peers) -> None:
    app = create_app(make_settings(data_dir, auth_failures_per_minute=2, trusted_proxies=LOOPBACK_PROXY))
    proxy = peers(app, "127.0.0.1")
    fail_auth(proxy, 1, **xff("garbage-one"))
    fail_auth(proxy, 1, **xff("garbage-two"))
    limited(proxy.get("/wake", BOGUS, **xff("1.2.3.4:5")))
    # Neither the proxy itself nor a readable client paid for them.
    assert_error(proxy.get("/wake", BOGUS), 401, "auth.invalid")
    assert_error(proxy.get("/wake", BOGUS, **xff("203.0.113.9")), 401, "auth.invalid")


# ---------------------------------------------------------------- body caps


def padded(obj: dict, size: int) -> bytes:
    """``obj`` as JSON, padded with trailing whitespace (still valid JSON) to exactly ``size`` bytes."""
    raw = orjson.dumps(obj)
    assert len(raw) <= size
    return raw + b" " * (size - len(raw))


def streamed(raw: bytes):
    async def chunks():
        for i in range(0, len(raw), 1000):
            yield raw[i : i + 1000]

    return chunks()


@pytest.fixture
def capped(data_dir: Path):
    api = Api(create_app(make_settings(data_dir, max_body=4096, max_import_body=8192, kdf=CHEAP_KDF)))
    yield api, api.init()["token"]
    api.close()


def test_a_body_at_the_cap_is_accepted_and_one_byte_more_is_413(capped) -> None:
    api, token = capped
    at_cap = padded({"text": "exactly at the cap"}, 4096)
    over = padded({"text": "one byte over"}, 4097)
    assert api.post("/note", token, content=at_cap).status_code == 200
    body = assert_error(api.post("/note", token, content=over), 413, "request.too_large")
    assert "4096" in body["message"]
    # Without a Content-Length the same bytes are counted as they stream.
    assert api.post("/note", token, content=streamed(at_cap)).status_code == 200
    assert_error(api.post("/note", token, content=streamed(over)), 413, "request.too_large")
    # Only the two accepted notes were written.
    assert api.get("/wake", token).json()["T"] == 2


def test_the_cap_holds_on_public_routes_too(capped) -> None:
    api, _ = capped
    assert api.post("/init", content=padded({}, 4096)).status_code == 201
    assert_error(api.post("/init", content=padded({}, 4097)), 413, "request.too_large")


def test_import_has_its_own_cap(capped) -> None:
    api, token = capped

    def batch(size: int) -> bytes:
        return padded({"entries": [{"date": "2021-03-04", "text": "imported"}]}, size)

    # Over the general cap but within the import cap.
    assert api.post("/import", token, content=batch(4097)).status_code == 200
    assert api.post("/import", token, content=batch(8192)).status_code == 200
    assert_error(api.post("/import", token, content=batch(8193)), 413, "request.too_large")
    assert_error(api.post("/import", token, content=streamed(batch(8193))), 413, "request.too_large")
    assert api.get("/wake", token).json()["T"] == 2


def test_openapi_states_this_servers_caps(capped) -> None:
    api, _ = capped
    paths = api.get("/openapi.json").json()["paths"]
    assert "at most 4096 bytes" in paths["/note"]["post"]["requestBody"]["description"]
    assert "at most 8192 bytes" in paths["/import"]["post"]["requestBody"]["description"]


# ---------------------------------------------------------------- shards


def test_a_shard_host_mints_only_its_own_user_ids(data_dir: Path) -> None:
    api = Api(create_app(make_settings(data_dir, kdf=CHEAP_KDF, id_prefixes=("a", "b"))))
    try:
        minted = [api.init() for _ in range(12)]
    finally:
        api.close()
    ids = [m["user_id"] for m in minted]
    assert all(i[0] in "ab" for i in ids), ids
    # The token carries the id the proxy routes on.
    assert all(m["token"].split("_")[1] == m["user_id"] for m in minted)
    assert sorted(p.name for p in (data_dir / "users").iterdir()) == sorted(ids)
