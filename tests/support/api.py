"""Helpers shared by every kind of test: the in-process API client, the
settings tests run with, and the one check of the error shape of
(docs/DESIGN.md, "HTTP surface")."""

from __future__ import annotations

import asyncio
import re
import tarfile
import time
from pathlib import Path

import httpx

from stash.crypto import tokens
from stash.crypto.keys import KdfParams
from stash.web.settings import Settings

# The one cheap KDF of the suite: the cheapest argon2id the key ring accepts
# (one pass over 8 KiB), for every test where the KDF is not what is tested
# (tests/unit/test_keys.py tests argon2 itself and keeps its own costs). As an
# object for a Vault or Settings, and as flags for a ``stash serve``.
CHEAP_KDF = KdfParams(time_cost=1, memory_kib=8, lanes=1)
CHEAP_KDF_FLAGS = ("--kdf-time", str(CHEAP_KDF.time_cost), "--kdf-memory", str(CHEAP_KDF.memory_kib))

ERROR_CODE = re.compile(r"[a-z_]+(\.[a-z_]+)*")


def member_bytes(tar: tarfile.TarFile, member: str | tarfile.TarInfo) -> bytes:
    """A regular file's bytes from an archive (extractfile answers None for any other member)."""
    f = tar.extractfile(member)
    assert f is not None, f"{member} is not a regular file"
    return f.read()


def matched(found: re.Match[str] | None) -> re.Match[str]:
    """A match the test counts on: a miss fails here, by name, not as an AttributeError on None."""
    assert found is not None, "no match"
    return found


def token_parts(text: str) -> tokens.Token:
    """The parts of a token the server issued (tokens.parse answers None only for a malformed one)."""
    parsed = tokens.parse(text)
    assert parsed is not None, "not a token"
    return parsed


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


class Lifespan:
    """The ASGI lifespan protocol as a server speaks it: startup before the
    first request, shutdown after the last."""

    def __init__(self, app) -> None:
        self.app = app
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.task: asyncio.Task | None = None

    async def _say(self, kind: str) -> None:
        await self.inbox.put({"type": f"lifespan.{kind}"})
        answer = await self.outbox.get()
        if answer["type"] != f"lifespan.{kind}.complete":
            raise RuntimeError(f"the app's lifespan {kind} failed: {answer.get('message', '')}")

    async def start(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        self.task = asyncio.get_running_loop().create_task(self.app(scope, self.inbox.get, self.outbox.put))
        await self._say("startup")

    async def stop(self) -> None:
        await self._say("shutdown")
        assert self.task is not None
        await self.task


class Api(BearerClient):
    """A synchronous face over httpx's ASGI transport, for plain test
    functions. The app runs its lifespan, as a served one does: started here,
    stopped by :meth:`close` (with ``keep_open`` in its settings, it keeps
    users' files open between requests and closes them there)."""

    def __init__(self, app, *, lifespan: bool = True) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://stash.test")
        self.lifespan = Lifespan(app) if lifespan else None
        if self.lifespan is not None:
            self.loop.run_until_complete(self.lifespan.start())

    def send(self, method: str, url: str, headers: dict, **kw) -> httpx.Response:
        return self.loop.run_until_complete(self.client.request(method, url, headers=headers, **kw))

    def init(self) -> dict:
        resp = self.post("/init", json={"url": "https://stash.test"})
        assert resp.status_code == 201, resp.text
        return resp.json()

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        if self.lifespan is not None:
            self.loop.run_until_complete(self.lifespan.stop())
        self.loop.close()


def wal_folded(*paths: Path, within: float = 10.0) -> bool:
    """True once each file's WAL is empty or gone: a server's pool folds a
    kept file's WAL once the file has been quiet (storage/sqlite/pool.py); False
    when ``within`` seconds pass first."""
    deadline = time.monotonic() + within
    while True:
        sizes = [Path(f"{p}-wal").stat().st_size if Path(f"{p}-wal").exists() else 0 for p in paths]
        if not any(sizes):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def make_settings(data_dir: Path, **kw) -> Settings:
    """Settings for tests: every request comes from one address, so the
    per-address limits are lifted unless a test sets them; and a memory's
    files are closed after every request (``keep_open`` 0) unless a test
    keeps them open (tests/api/conftest.py runs modules both ways)."""
    kw.setdefault("keep_open", 0.0)
    kw.setdefault("init_per_minute", 10_000)
    kw.setdefault("auth_failures_per_minute", 10_000)
    kw.setdefault("oauth_registrations_per_hour", 10_000)
    return Settings(data_dir=data_dir, **kw)
