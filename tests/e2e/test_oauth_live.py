"""An MCP host connecting by OAuth to a real ``stash serve --workers 2``:
the MCP SDK's own client-side OAuth (discovery from the 401, Dynamic Client
Registration, PKCE, the code exchange) with the consent page shown to the
owner in Debian's headless Chromium and answered there as a person would,
keys and all; then the capability it got at work over /mcp, listed with the
host's name, and refused at its next request once revoked. A host named by
its Client ID Metadata Document connects step by step (the SDK's client
takes only https documents). Screenshots of the consent page land in
test-artifacts/."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.to_thread
import httpx2
import pytest
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata
from pydantic import AnyUrl

from tests.e2e.browser import Chromium, desktop_page
from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.mcp.oauth import REDIRECT, TokenMemory, answer, authorize, code_of, exchange, nonce_of, pkce
from tests.support.server import REPO, Http, Server, start_server

pytestmark = pytest.mark.slow

ARTIFACTS = REPO / "test-artifacts"
HOSTILE_NAME = '<img src=x onerror="document.title=\'pwned\'"> Agent "Host" & co'
WAIT_S = 60.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp("oauth-live"), "--workers", "2", "--oauth-loopback-clients", "on", *CHEAP_KDF_FLAGS
    )
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def chrome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    with desktop_page(tmp_path_factory.mktemp("oauth-chromium") / "profile") as browser:
        yield browser


class Listener(BaseHTTPRequestHandler):
    """The host's redirect URI: what reaches it, for the test to read."""

    received: queue.Queue[str] = queue.Queue()
    referers: list[str | None] = []
    document: dict | None = None

    def do_GET(self) -> None:
        if self.path.startswith("/callback"):
            Listener.referers.append(self.headers.get("Referer"))
            Listener.received.put(self.path)
            body = b"<!doctype html><title>connected</title><p>You may close this page."
            kind = "text/html"
        else:  # the host's metadata document
            body, kind = json.dumps(Listener.document).encode(), "application/json"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def listener() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Listener)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def consent_in_chromium(chrome: Chromium, url: str, owner: str, scope: str) -> list[str]:
    """The owner's part, in the browser: the page as shown, the token typed, the scope picked, Approve
    pressed with the keyboard. The page's own script is off: the form works without any."""
    chrome.call("Emulation.setScriptExecutionDisabled", {"value": True})
    try:
        chrome.goto(url)
        assert chrome.js("document.title") == "Stash · connect an MCP host"
        assert chrome.js("document.getElementById('host-name').textContent") == HOSTILE_NAME
        assert chrome.js("document.querySelectorAll('img').length") == 0  # the name is text, not markup
        assert chrome.js("document.querySelectorAll('script').length") == 0
        chrome.screenshot(ARTIFACTS / "consent-1280.png")
        chrome.js("document.getElementById('owner_token').focus()")
        chrome.type_text(owner)
        chrome.js(f"document.querySelector('input[name=scope][value={scope}]').click()")
        chrome.js("document.getElementById('approve').focus()")
        chrome.enter()
        landed = Listener.received.get(timeout=WAIT_S)
        assert chrome.js("document.title") != "pwned"
        return [landed] + [e["request"]["url"] for e in chrome.seen("Network.requestWillBeSent")]
    finally:
        chrome.call("Emulation.setScriptExecutionDisabled", {"value": False})


class AskedAgain(Exception):
    """The SDK went back to the owner: it does so only when a request was refused with 401."""


def test_a_host_connects_through_the_sdks_oauth_with_the_consent_in_chromium(
    server: Server, chrome: Chromium, listener: str
) -> None:
    http = Http(server.url)
    owner = http.init()["token"]
    store = TokenMemory()
    urls: list[str] = []
    consents: list[str] = []

    async def redirect_handler(url: str) -> None:
        consents.append(url)
        if len(consents) > 1:
            raise AskedAgain(url)
        urls.extend(await anyio.to_thread.run_sync(consent_in_chromium, chrome, url, owner, "full"))

    async def callback_handler() -> AuthorizationCodeResult:
        query = parse_qs(urlsplit(urls[0]).query)
        return AuthorizationCodeResult(code=query["code"][0], state=query["state"][0])

    provider = OAuthClientProvider(
        server_url=server.url + "/mcp",
        storage=store,
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
        client_metadata=OAuthClientMetadata(client_name=HOSTILE_NAME, redirect_uris=[AnyUrl(f"{listener}/callback")]),
    )
    minted: list[dict] = []

    async def main() -> None:
        with anyio.fail_after(WAIT_S * 2):
            async with httpx2.AsyncClient(auth=provider, timeout=httpx2.Timeout(WAIT_S)) as client_http:
                async with Client(streamable_http_client(server.url + "/mcp", http_client=client_http)) as client:
                    names = {t.name for t in (await client.list_tools()).tools}
                    assert names == {"wake", "note", "nap", "recall", "zoom", "forget"}
                    noted = await client.call_tool("note", {"text": "noted by a host that came through OAuth"})
                    assert not noted.is_error, noted
                    minted.extend(g for g in http.get("/grants", owner).json()["grants"] if g["id"] > 1)
                    assert len(minted) == 1 and http.delete(f"/grants/{minted[0]['id']}", owner).status_code == 200
                    await client.call_tool("wake", {})  # refused: the SDK goes back to the owner

    with pytest.raises(BaseException) as refused:
        anyio.run(main)
    assert (
        refused.group_contains(AskedAgain)
        if isinstance(refused.value, BaseExceptionGroup)
        else refused.type is AskedAgain
    ), refused.value
    assert len(consents) == 2, consents
    # PKCE S256 in the address the owner was sent to; the host registered itself (DCR) and got the grant.
    query = parse_qs(urlsplit(consents[0]).query)
    assert query["code_challenge_method"] == ["S256"] and len(query["code_challenge"][0]) == 43
    assert store.client is not None and query["client_id"] == [store.client.client_id]
    assert store.client.client_id.startswith("stash-client-")
    (grant,) = minted
    assert grant["label"] == HOSTILE_NAME and grant["scope"] == "full" and grant["memory"] == "main"
    assert grant["live"] and grant["last_used"] is not None
    assert Listener.referers == [None], "the consent page's address reached the host as a Referer"
    assert http.ok("POST", "/recall", owner, json={"q": "came through OAuth"})["total"] == 1
    assert store.tokens is not None
    token = store.tokens.access_token
    dead = http.post(
        "/mcp",
        token,
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={"Accept": "application/json, text/event-stream"},
    )
    assert dead.status_code == 401 and "resource_metadata=" in dead.headers["www-authenticate"]
    log = server.log_text()
    for line in (
        "GET /.well-known/oauth-protected-resource",
        "GET /.well-known/oauth-authorization-server",
        "POST /register 201",
        "POST /authorize 303",
        "POST /token 200",
        "POST /mcp 200",
    ):
        assert line in log, line  # discovered, registered, approved and exchanged as the SDK was told to
    secrets = (owner, owner.split("_")[2], token, token.split("_")[2])
    assert not [u for u in urls + consents if any(s in u for s in secrets)], "a token travelled in a URL"
    assert not [s for s in secrets if s in log] and "Traceback" not in log
    http.close()


def test_a_host_named_by_its_metadata_document_connects(server: Server, listener: str) -> None:
    http = Http(server.url)
    owner = http.init()["token"]
    client_id = f"{listener}/host.json"
    Listener.document = {"client_id": client_id, "client_name": "Documented host", "redirect_uris": [REDIRECT]}
    verifier, challenge = pkce()
    page = authorize(http, client_id, challenge, resource=f"{server.url}/mcp")
    assert page.status_code == 200 and "Documented host" in page.text
    code = code_of(answer(http, nonce_of(page.text), owner, server.url, scope="append"))
    token = exchange(http, code, verifier, client_id, resource=f"{server.url}/mcp").json()["access_token"]
    assert http.post("/note", token, json={"text": "noted through a documented host"}).status_code == 200
    assert http.post("/wake", token, json={}).status_code == 403  # append reads nothing
    assert [g["label"] for g in http.get("/grants", owner).json()["grants"] if g["id"] > 1] == ["Documented host"]
    http.close()


def test_the_consent_page_refuses_to_be_framed_and_to_run_script(
    server: Server, chrome: Chromium, listener: str
) -> None:
    """Framed by another page, the consent form does not load; and its policy lets no script run."""
    http = Http(server.url)
    reg = http.post("/register", json={"client_name": "framed", "redirect_uris": [f"{listener}/callback"]}).json()
    _, challenge = pkce()
    page = authorize(http, reg["client_id"], challenge, f"{listener}/callback")
    policy = page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and page.headers["x-frame-options"] == "DENY"
    frame = Path(chrome.log).parent / "frame.html"
    frame.write_text(f'<iframe id="f" src="{page.url}"></iframe>')
    chrome.goto(frame.as_uri())
    chrome.wait_console("frame-ancestors")  # the browser refused to show it framed
    http.close()
