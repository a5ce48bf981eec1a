"""deploy/Caddyfile in front of a real `stash serve`
processes, with real Caddy. Only what needs the internet is changed: the site
is served over plain http on a loopback port instead of its domain with ACME
certificates, and the upstream addresses are this test's ports.

Single host: a client's own X-Forwarded-For never reaches Stash (Caddy
replaces it), so the rate limit counts the real client; /metrics stays on
the host; an MCP host reaches /mcp under the public name that --url gives
(the MCP SDK's Host and Origin checks), and a page of another origin, or a
Host that is not that name, is refused. A fleet's router is generated from
its placement: tests/deploy/test_fleet_router.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support import loopback
from tests.support.mcp.oauth import authorize, pkce, register
from tests.support.mcp.session import Session, run_http_session
from tests.support.ops.deploy import DEPLOY, caddy_running
from tests.support.server import Server, free_port, start_server

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
BOGUS = "stash1_0123456789abcdef_" + "1" * 49
PUBLIC = "stash.example.com"  # the site's name, which the client sends as its Host; no DNS is asked


def render(name: str, upstreams: dict[str, int]) -> str:
    """deploy/<name> with its site on http://127.0.0.1:{PORT} and, under its own
    name, http://stash.example.com:{PORT}, its upstreams on this test's ports,
    and no admin endpoint (other tests may be running Caddy)."""
    text = (DEPLOY / name).read_text(encoding="utf-8")
    text = text.replace("email ops@example.com", "admin off\n\tauto_https off")
    text, sites = re.subn(
        r"^stash\.example\.com \{", f"http://127.0.0.1:{{PORT}}, http://{PUBLIC}:{{PORT}} {{", text, flags=re.M
    )
    assert sites == 1
    for address, local in upstreams.items():
        assert address in text, address
        text = text.replace(address, f"127.0.0.1:{local}")
    return text


@contextmanager
def caddy(config: str, tmp: Path, port: int | None = None) -> Iterator[str]:
    port = port or free_port()
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return loopback.get(base + "/health", timeout=2.0).status_code == 200
        except httpx.TransportError:
            return False

    with caddy_running(config.replace("{PORT}", str(port)), tmp, up):
        yield base


def refused_on_mcp(resp: httpx.Response, status: int, code: str) -> None:
    assert resp.status_code == status and resp.json()["error"]["data"] == {"error": code}, resp.text


def mcp_under_the_public_name(srv: Server, base: str, public: str) -> None:
    """Through Caddy, under the name --url gives: the SDK's client connects (initialize) and calls a tool,
    and the OAuth consent page keeps its own referrer policy (its form's Origin check needs it); a page of
    another origin is refused, and so is a request straight to the server under a name that is not the
    server's (DNS rebinding)."""
    host = public.split("://", 1)[1]
    owner = loopback.post(base + "/init", json={}, headers={"Host": host}, timeout=30.0).json()["token"]
    said: list[str] = []

    async def script(s: Session) -> None:
        said.append(await s.ok("note", text="noted through the proxy"))

    run_http_session(base + "/mcp", owner, script, "legacy", headers={"Host": host, "Origin": public})
    assert said and said[0].startswith("Saved as #0"), said
    with loopback.client(base_url=base, headers={"Host": host}, timeout=30.0) as http:
        page = authorize(http, register(http)["client_id"], pkce()[1])
        assert page.status_code == 200 and page.headers.get_list("referrer-policy") == ["same-origin"], page.headers
        assert http.get("/health").headers.get_list("referrer-policy") == ["no-referrer"]
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    sent = {
        "Authorization": f"Bearer {owner}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-06-18",
    }
    assert loopback.post(base + "/mcp", json=rpc, headers={**sent, "Host": host}, timeout=30.0).status_code == 200
    refused_on_mcp(
        loopback.post(
            base + "/mcp", json=rpc, headers={**sent, "Host": host, "Origin": "https://evil.example"}, timeout=30.0
        ),
        403,
        "mcp.bad_origin",
    )
    refused_on_mcp(
        loopback.post(srv.url + "/mcp", json=rpc, headers={**sent, "Host": "evil.example"}, timeout=30.0),
        421,
        "mcp.bad_host",
    )


def test_behind_caddy_a_forged_forwarded_for_buys_nothing_and_mcp_answers_for_the_url(tmp_path: Path) -> None:
    port = free_port()
    public = f"http://{PUBLIC}:{port}"
    srv = start_server(
        tmp_path / "stash", "--trusted-proxy", "127.0.0.1", "--auth-failures-per-minute", "3", "--url", public
    )
    try:
        with caddy(render("Caddyfile", {"127.0.0.1:8080": srv.port}), tmp_path, port) as base:
            mcp_under_the_public_name(srv, base, public)
            for n in range(3):
                resp = loopback.get(
                    base + "/wake",
                    headers={"Authorization": f"Bearer {BOGUS}", "X-Forwarded-For": f"203.0.113.{n}"},
                    timeout=30.0,
                )
                assert resp.status_code == 401, resp.text
            # Had Caddy passed the forged addresses on, each would be a new client.
            resp = loopback.get(
                base + "/wake",
                headers={"Authorization": f"Bearer {BOGUS}", "X-Forwarded-For": "203.0.113.99"},
                timeout=30.0,
            )
            assert resp.status_code == 429 and resp.json()["error"] == "rate_limited", resp.text
            assert loopback.get(base + "/metrics", timeout=30.0).status_code == 404
            assert "server" not in loopback.get(base + "/health", timeout=30.0).headers
        # Straight to the server, the host's own scraper still reads /metrics.
        assert loopback.get(srv.url + "/metrics", timeout=30.0).status_code == 200
    finally:
        srv.stop()
