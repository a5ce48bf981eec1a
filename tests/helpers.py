"""Helpers shared by every kind of test: the in-process API client, the
settings tests run with, and the one check of the error shape of
(docs/DESIGN.md, "HTTP surface")."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx

from stash.crypto.keys import KdfParams
from stash.web.settings import Settings

# The one cheap KDF of the suite: the cheapest argon2id the key ring accepts
# (one pass over 8 KiB), for every test where the KDF is not what is tested
# (tests/unit/test_keys.py tests argon2 itself and keeps its own costs). As an
# object for a Vault or Settings, and as flags for a ``stash serve``.
CHEAP_KDF = KdfParams(time_cost=1, memory_kib=8, lanes=1)
CHEAP_KDF_FLAGS = ("--kdf-time", str(CHEAP_KDF.time_cost), "--kdf-memory", str(CHEAP_KDF.memory_kib))

ERROR_CODE = re.compile(r"[a-z_]+(\.[a-z_]+)*")


def assert_error(resp: httpx.Response, status: int, code: str | None = None) -> dict:
    """The answer is the error of (docs/DESIGN.md, "HTTP surface"): the status, a JSON object with a stable
    dotted ``error`` code and a one-sentence ``message``, and nothing that
    looks like a traceback, a path or a token."""
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert isinstance(body, dict)
    assert ERROR_CODE.fullmatch(body["error"]), body
    assert isinstance(body["message"], str) and body["message"].strip()
    text = resp.text
    for leak in ("Traceback", 'File "', "/tmp/", "/home/", "/root/", "stash1_"):
        assert leak not in text.replace("stash1_…", ""), text
    if code is not None:
        assert body["error"] == code, body
    return body


class BearerClient:
    """get/post/delete with an optional token sent as the bearer header."""

    def send(self, method: str, url: str, headers: dict, **kw) -> httpx.Response:
        raise NotImplementedError

    def request(self, method: str, url: str, token: str | None = None, **kw) -> httpx.Response:
        headers = dict(kw.pop("headers", {}) or {})
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return self.send(method, url, headers, **kw)

    def get(self, url: str, token: str | None = None, **kw) -> httpx.Response:
        return self.request("GET", url, token, **kw)

    def post(self, url: str, token: str | None = None, **kw) -> httpx.Response:
        return self.request("POST", url, token, **kw)

    def delete(self, url: str, token: str | None = None, **kw) -> httpx.Response:
        return self.request("DELETE", url, token, **kw)


class Api(BearerClient):
    """A synchronous face over httpx's ASGI transport, for plain test functions."""

    def __init__(self, app) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://stash.test")

    def send(self, method: str, url: str, headers: dict, **kw) -> httpx.Response:
        return self.loop.run_until_complete(self.client.request(method, url, headers=headers, **kw))

    def init(self) -> dict:
        resp = self.post("/init", json={"url": "https://stash.test"})
        assert resp.status_code == 201, resp.text
        return resp.json()

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()


def make_settings(data_dir: Path, **kw) -> Settings:
    """Settings for tests: every request comes from one address, so the
    per-address limits are lifted unless a test sets them."""
    kw.setdefault("init_per_minute", 10_000)
    kw.setdefault("auth_failures_per_minute", 10_000)
    return Settings(data_dir=data_dir, **kw)
