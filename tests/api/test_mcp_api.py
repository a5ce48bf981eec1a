"""``POST /mcp`` through the app in process: how the edge guards it before
the SDK reads a byte (a dead token's 401 and where it points, a memory
name), every refusal on the path a JSON-RPC error, the SDK's Host and
Origin checks taken from ``--url``, the protected-resource metadata, and
the SDK imported only once a request needs it. The tools themselves are
driven by the SDK's own client against a real server
(tests/e2e/test_mcp_http.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stash.web.app import create_app
from tests.support.api import Api, make_settings
from tests.support.installed import OUTSIDE

ACCEPT = "application/json, text/event-stream"
PUBLIC = "https://stash.test"  # the in-process client's host (Api of tests/support/api.py), named by --url
LIST = {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}}


@pytest.fixture
def api(data_dir: Path) -> Iterator[Api]:
    client = Api(create_app(make_settings(data_dir, public_url=PUBLIC)))
    yield client
    client.close()


@pytest.fixture
def owner(api: Api) -> str:
    return api.init()["token"]


def post(api: Api, token: str | None, body: object = LIST, path: str = "/mcp", **headers: str):
    sent = {"Accept": ACCEPT, "MCP-Protocol-Version": "2025-06-18", **headers}
    return api.post(path, token, json=body, headers=sent)


def jsonrpc_error(resp, status: int, code: str) -> dict:
    """A refusal on /mcp: a JSON-RPC error answering no message, the Stash code in its data."""
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    body = resp.json()
    assert body["jsonrpc"] == "2.0" and body["id"] is None and body["error"]["data"] == {"error": code}, body
    assert isinstance(body["error"]["code"], int) and body["error"]["message"]
    return body["error"]


def test_a_live_capability_lists_its_tools(api: Api, owner: str) -> None:
    resp = post(api, owner)
    assert resp.status_code == 200 and resp.json()["id"] == 7, resp.text
    assert {t["name"] for t in resp.json()["result"]["tools"]} == {"wake", "note", "nap", "recall", "zoom", "forget"}


def test_without_a_live_token_it_is_401_naming_the_metadata(api: Api, owner: str) -> None:
    minted = api.post("/grants", owner, json={"scope": "full"}).json()
    api.delete(f"/grants/{minted['id']}", owner)
    wrong = owner[:-8] + ("A" if owner[-8] != "A" else "B") + owner[-7:]
    answers = set()
    for token in (None, "not a token", wrong, minted["token"]):
        resp = post(api, token)
        jsonrpc_error(resp, 401, "auth.invalid")
        assert (
            resp.headers["www-authenticate"]
            == f'Bearer resource_metadata="{PUBLIC}/.well-known/oauth-protected-resource"'
        )
        answers.add(resp.content)
    assert len(answers) == 1  # one answer, whichever way the token failed
    resp = post(api, None, path="/m/work/mcp")
    assert (
        resp.headers["www-authenticate"]
        == f'Bearer resource_metadata="{PUBLIC}/.well-known/oauth-protected-resource/m/work/mcp"'
    )


def test_every_refusal_on_the_path_is_a_jsonrpc_error(api: Api, owner: str) -> None:
    for method in ("GET", "DELETE", "PUT"):  # stateless: no stream to open, no session to end
        resp = api.request(method, "/mcp", owner, headers={"Accept": ACCEPT})
        jsonrpc_error(resp, 405, "method_not_allowed")
        assert resp.headers["allow"] == "POST"
    jsonrpc_error(post(api, owner, path="/m/Not-A-Name/mcp"), 404, "memory.unknown")
    jsonrpc_error(post(api, owner, Accept="text/html"), 406, "mcp.not_acceptable")
    resp = api.post("/mcp", owner, content=b"tools/list", headers={"Accept": ACCEPT, "Content-Type": "text/plain"})
    jsonrpc_error(resp, 400, "mcp.bad_request")
    huge = {**LIST, "params": {"padding": "x" * (300 * 1024)}}
    jsonrpc_error(post(api, owner, huge), 413, "request.too_large")
    # The SDK's own protocol errors stay as it writes them: JSON-RPC, with the request's id.
    resp = post(api, owner, {"jsonrpc": "2.0", "id": 9, "method": "no/such"})
    assert resp.json()["id"] == 9 and resp.json()["error"]["code"] == -32601, resp.text


def test_host_and_origin_are_checked_against_the_url(api: Api, owner: str, data_dir: Path) -> None:
    assert post(api, owner, Origin=PUBLIC).status_code == 200
    assert post(api, owner, Host="127.0.0.1:8080", Origin="http://localhost:3000").status_code == 200
    jsonrpc_error(post(api, owner, Host="evil.example"), 421, "mcp.bad_host")
    jsonrpc_error(post(api, owner, Host="stash.test.evil.example"), 421, "mcp.bad_host")
    jsonrpc_error(post(api, owner, Origin="https://evil.example"), 403, "mcp.bad_origin")
    # Without --url, a host that is not loopback (nor the address it listens on) is refused.
    bare = Api(create_app(make_settings(data_dir.parent / "bare")))
    try:
        other = bare.init()["token"]
        jsonrpc_error(post(bare, other), 421, "mcp.bad_host")
        assert post(bare, other, Host="127.0.0.1:8080").status_code == 200
    finally:
        bare.close()


def test_protected_resource_metadata(api: Api) -> None:
    assert api.get("/.well-known/oauth-protected-resource").json() == {
        "resource": f"{PUBLIC}/mcp",
        "resource_name": "Stash",
        "authorization_servers": [PUBLIC],
        "bearer_methods_supported": ["header"],
    }
    assert api.get("/.well-known/oauth-protected-resource/m/work/mcp").json()["resource"] == f"{PUBLIC}/m/work/mcp"
    assert api.get("/.well-known/oauth-protected-resource/m/Bad!/mcp").status_code == 404


IMPORTS = """
import asyncio, sys, httpx
from stash.web.app import create_app
from stash.web.settings import Settings
from stash.crypto.keys import KdfParams

async def main():
    app = create_app(Settings(data_dir=sys.argv[1], kdf=KdfParams(time_cost=1, memory_kib=8, lanes=1)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        token = (await c.post("/init", json={})).json()["token"]
        auth = {"Authorization": "Bearer " + token}
        await c.post("/note", json={"text": "one"}, headers=auth)
        await c.get("/wake", headers=auth)
        print("before", "mcp" in sys.modules)
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                         headers={**auth, "Accept": "application/json, text/event-stream",
                                  "MCP-Protocol-Version": "2025-06-18"})
        print("after", "mcp" in sys.modules, r.status_code)

asyncio.run(main())
"""


def test_a_worker_loads_the_sdk_only_once_it_serves_mcp(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS, str(tmp_path / "data")],
        cwd=OUTSIDE,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["before", "False", "after", "True", "200"], done.stdout
