"""deploy/Caddyfile and deploy/Caddyfile.fleet in front of real `stash serve`
processes, with real Caddy. Only what needs the internet is changed: the site
is served over plain http on a loopback port instead of its domain with ACME
certificates, and the upstream addresses are this test's ports.

Single host: a client's own X-Forwarded-For never reaches Stash (Caddy
replaces it), so the rate limit counts the real client; /metrics stays on
the host. Fleet: identities minted through the proxy land on the host whose
shard their id belongs to, and every later request is routed there by the
token's user id."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.deploy_kit import DEPLOY, tool
from tests.live import Server, free_port, start_server

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
BOGUS = "stash1_0123456789abcdef_" + "1" * 49


def render(name: str, upstreams: dict[str, int]) -> str:
    """deploy/<name> with its site on http://127.0.0.1:{PORT}, its upstreams on
    this test's ports, and no admin endpoint (other tests may be running Caddy)."""
    text = (DEPLOY / name).read_text(encoding="utf-8")
    text = text.replace("email ops@example.com", "admin off\n\tauto_https off")
    text, sites = re.subn(r"^stash\.example\.com \{", "http://127.0.0.1:{PORT} {", text, flags=re.M)
    assert sites == 1
    for address, local in upstreams.items():
        assert address in text, address
        text = text.replace(address, f"127.0.0.1:{local}")
    return text


@contextmanager
def caddy(config: str, tmp: Path) -> Iterator[str]:
    port = free_port()
    path = tmp / "Caddyfile"
    path.write_text(config.replace("{PORT}", str(port)), encoding="utf-8")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp),
           "XDG_DATA_HOME": str(tmp / "data"), "XDG_CONFIG_HOME": str(tmp / "config")}
    log = tmp / "caddy.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([tool("caddy"), "run", "--adapter", "caddyfile", "--config", str(path)], env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            try:
                if httpx.get(base + "/health", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)


def test_behind_caddy_a_forged_forwarded_for_buys_nothing(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "stash", "--trusted-proxy", "127.0.0.1", "--auth-failures-per-minute", "3")
    try:
        with caddy(render("Caddyfile", {"127.0.0.1:8080": srv.port}), tmp_path) as base:
            for n in range(3):
                resp = httpx.get(base + "/wake", headers={"Authorization": f"Bearer {BOGUS}",
                                                         "X-Forwarded-For": f"203.0.113.{n}"}, timeout=30.0)
                assert resp.status_code == 401, resp.text
            # Had Caddy passed the forged addresses on, each would be a new client.
            resp = httpx.get(base + "/wake", headers={"Authorization": f"Bearer {BOGUS}",
                                                     "X-Forwarded-For": "203.0.113.99"}, timeout=30.0)
            assert resp.status_code == 429 and resp.json()["error"] == "rate_limited", resp.text
            assert httpx.get(base + "/metrics", timeout=30.0).status_code == 404
            assert "server" not in httpx.get(base + "/health", timeout=30.0).headers
        # Straight to the server, the host's own scraper still reads /metrics.
        assert httpx.get(srv.url + "/metrics", timeout=30.0).status_code == 200
    finally:
        srv.stop()


def shard(tmp: Path, digits: str) -> Server:
    args = ["--trusted-proxy", "127.0.0.1"]
    for d in digits:
        args += ["--user-id-prefix", d]
    return start_server(tmp, *args)


def users_on(srv: Server) -> set[str]:
    return {p.name for p in (srv.data / "users").iterdir()}


def test_a_sharded_fleet_routes_each_user_to_its_host(tmp_path: Path) -> None:
    a, b = shard(tmp_path / "a", "01234567"), shard(tmp_path / "b", "89abcdef")
    try:
        config = render("Caddyfile.fleet", {"10.0.0.11:8080": a.port, "10.0.0.12:8080": b.port})
        with caddy(config, tmp_path) as base, httpx.Client(base_url=base, timeout=30.0) as http:
            minted = [http.post("/init", json={}).json() for _ in range(6)]
            # One identity minted on each host directly, so both shards are exercised whatever the balancer did.
            minted += [httpx.post(srv.url + "/init", json={}, timeout=30.0).json() for srv in (a, b)]
            for ident in minted:
                auth = {"Authorization": f"Bearer {ident['token']}"}
                resp = http.post("/note", json={"text": f"I am {ident['user_id']}"}, headers=auth)
                assert resp.status_code == 200, resp.text
                wake = http.get("/wake", headers=auth)
                assert wake.status_code == 200 and f"I am {ident['user_id']}" in wake.text, wake.text
            assert http.get("/metrics", headers={"Authorization": f"Bearer {minted[0]['token']}"}).status_code \
                == 404
        ids = {m["user_id"] for m in minted}
        assert users_on(a) == {i for i in ids if i[0] in "01234567"}
        assert users_on(b) == {i for i in ids if i[0] in "89abcdef"}
        assert users_on(a) and users_on(b)
    finally:
        a.stop()
        b.stop()
