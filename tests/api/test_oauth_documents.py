"""Client ID Metadata Documents: a host named by the URL of its document,
which the server fetches, the one request it makes on anyone's say-so. A
real HTTP server on loopback serves the documents (the operator option the
tests set lets loopback in); without it, and for any private or loopback
address, nothing is fetched at all."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import cast

import pytest

from stash.web.app import create_app
from tests.support.api import Api, make_settings
from tests.support.mcp.oauth import REDIRECT, answer, authorize, code_of, exchange, nonce_of, pkce

PUBLIC = "https://stash.test"
SLOW_S = 6.0  # longer than the fetch's bound (3 s)


class Documents(BaseHTTPRequestHandler):
    """Serves each test's documents, and counts the requests it was sent."""

    hits: list[str] = []

    def do_GET(self) -> None:
        Documents.hits.append(self.path)
        base = f"http://127.0.0.1:{cast(tuple[str, int], self.server.server_address)[1]}"
        doc = {"client_id": base + self.path, "client_name": "Doc host", "redirect_uris": [REDIRECT]}
        if self.path == "/huge.json":
            doc["padding"] = "x" * 6000
        elif self.path == "/wrong-id.json":
            doc["client_id"] = base + "/good.json"
        elif self.path == "/secret.json":
            doc["token_endpoint_auth_method"] = "client_secret_basic"
        elif self.path == "/moved.json":
            self.send_response(302)
            self.send_header("Location", "/good.json")
            self.end_headers()
            return
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.path != "/huge.json":
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path == "/slow.json":
            time.sleep(SLOW_S)
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def documents() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Documents)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def app(data_dir: Path, loopback: str) -> Api:
    return Api(create_app(make_settings(data_dir, public_url=PUBLIC, oauth_loopback_clients=loopback)))


@pytest.fixture
def api(data_dir: Path) -> Iterator[Api]:
    client = app(data_dir, "on")
    yield client
    client.close()


def refused(resp) -> None:
    assert resp.status_code == 401 and resp.headers["stash-error"] == "oauth.invalid_client", resp.text[:500]
    assert "location" not in resp.headers


def test_a_host_named_by_its_document_connects(api: Api, documents: str) -> None:
    owner = api.init()["token"]
    client_id = f"{documents}/good.json"
    verifier, challenge = pkce()
    page = authorize(api, client_id, challenge)
    assert page.status_code == 200 and "Doc host" in page.text
    code = code_of(answer(api, nonce_of(page.text), owner, PUBLIC))
    token = exchange(api, code, verifier, client_id).json()["access_token"]
    assert api.post("/wake", token, json={}).status_code == 200
    assert [g["label"] for g in api.get("/grants", owner).json()["grants"] if g["id"] > 1] == ["Doc host"]


def test_a_document_that_is_not_one_is_refused(api: Api, documents: str) -> None:
    _, challenge = pkce()
    for path in ("/huge.json", "/wrong-id.json", "/secret.json", "/moved.json", "/"):
        refused(authorize(api, documents + path, challenge))
    # A redirect URI the document does not list is refused too.
    resp = authorize(api, f"{documents}/good.json", challenge, "http://127.0.0.1:1/elsewhere")
    assert resp.status_code == 400 and resp.headers["stash-error"] == "oauth.invalid_redirect_uri"


@pytest.mark.slow
def test_a_slow_document_is_given_up_on(api: Api, documents: str) -> None:
    """The document is a good one, sent after SLOW_S: refused, the fetch gave up before it came."""
    refused(authorize(api, f"{documents}/slow.json", pkce()[1]))


def test_private_and_loopback_addresses_are_never_fetched(data_dir: Path, documents: str) -> None:
    port = documents.rsplit(":", 1)[1]
    api = app(data_dir, "off")
    try:
        Documents.hits.clear()
        for client_id in (
            f"{documents}/good.json",
            f"https://127.0.0.1:{port}/good.json",
            f"https://localhost:{port}/good.json",
            f"https://[::1]:{port}/good.json",
            "https://10.1.2.3/client.json",
            "https://192.168.0.1/client.json",
            "https://169.254.169.254/latest/meta-data",
            "https://[fd00::1]/client.json",
            "https://0.0.0.0/client.json",
            "http://93.184.215.14/client.json",
            "https://user@example.com/client.json",
        ):
            refused(authorize(api, client_id, pkce()[1]))
        assert Documents.hits == []  # refused before any connection: not even loopback's own server was asked
    finally:
        api.close()
