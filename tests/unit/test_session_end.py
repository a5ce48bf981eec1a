"""The end of a session after its answer (service/session_end.py): run
once, by whoever comes first; failures logged by class only; and, on real
files, a capability's session really ends after the answer leaves (the key
ring's copy of the head not raised yet, the user's lock still held shared),
while the next session of that user in the process ends it first, and an
owner's session still ends before its answer."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import urllib.parse
from pathlib import Path

import orjson
import pytest

from stash.service import access, operation
from stash.service.access import Vault
from stash.service.session_end import Deferred, Pending
from stash.storage import userlock
from stash.storage.keyring import open_keyring
from tests.support.api import CHEAP_KDF, Lifespan, make_settings

NOTE = operation.Effects(scope="append", record="memory", adds=lambda f: 1)
WAKE = operation.Effects(scope="read")
LIMITS = operation.Limits(memories=1_000_000, bytes=1 << 40)


def note(s, f, _ctx):
    return s.open_memory().note(f["text"])


def wake(s, _f, _ctx):
    return s.open_memory().wake()


def test_a_deferred_runs_once_and_a_second_caller_waits_for_its_end():
    started, release, ran = threading.Event(), threading.Event(), []

    def work():
        ran.append(1)
        started.set()
        release.wait(5)

    d = Deferred(work)
    first = threading.Thread(target=d.run)
    first.start()
    started.wait(5)
    second_done = threading.Event()

    def run_then_mark() -> None:
        d.run()
        second_done.set()

    second = threading.Thread(target=run_then_mark)
    second.start()
    time.sleep(0.05)
    assert not second_done.is_set()  # it waits while the first caller runs the work
    release.set()
    first.join(5)
    second.join(5)
    assert second_done.is_set() and ran == [1] and not d.pending


def test_a_failure_is_logged_by_its_class_and_never_raised(caplog: pytest.LogCaptureFixture):
    secret = "memory text that must not be logged"

    def work():
        raise OSError(secret)

    with caplog.at_level(logging.ERROR, logger="stash.error"):
        Deferred(work).run()
    assert "OSError" in caplog.text and secret not in caplog.text


def test_pending_runs_one_users_work_and_forgets_what_ran():
    p = Pending()
    ran: list[str] = []
    a = p.add("a", lambda: ran.append("a1"))
    p.add("a", lambda: ran.append("a2"))
    p.add("b", lambda: ran.append("b"))
    assert p.count() == 3
    p.run_for("a")
    assert ran == ["a1", "a2"] and p.count() == 1 and not a.pending
    a.run()  # a second run does nothing
    p.run_all()
    assert ran == ["a1", "a2", "b"] and p.count() == 0


def copy_count(data: Path, user_id: str) -> int:
    """The key ring's copy of the log head, read straight from the file."""
    ring = open_keyring(data / "users" / user_id / "keyring.db", user_id)
    try:
        head = ring.log_head()
        return 0 if head is None else head.count
    finally:
        ring.close()


def lock_free(data: Path, user_id: str) -> bool:
    with userlock.exclusive_within(data / "users" / user_id, 0.05) as held:
        return held


def test_a_capabilitys_session_ends_after_its_answer_and_the_next_session_ends_it_first(tmp_path: Path):
    data = tmp_path / "data"
    vault = Vault(data, CHEAP_KDF, "sqlcipher")
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        s.open_memory().note("first")
        _, full = vault.mint_grant(s, "full")
    assert copy_count(data, ident.user_id) == 1

    done = operation.perform(vault, full, None, NOTE, "POST /note", {"text": "second"}, None, LIMITS, note)
    assert done.body["id"] == 1 and done.finish is not None
    # Answered, its write committed, and its session not ended yet.
    assert copy_count(data, ident.user_id) == 1 and not lock_free(data, ident.user_id)

    later = operation.perform(vault, full, None, WAKE, "GET /wake", {}, None, LIMITS, wake)
    # The next session of this user ended the last one before it read anything.
    assert copy_count(data, ident.user_id) == 2 and later.body["lines"]
    assert later.finish is not None
    later.finish()
    done.finish()  # ran already: nothing more
    assert lock_free(data, ident.user_id) and vault.after.count() == 0


def test_an_owners_session_ends_before_its_answer(tmp_path: Path):
    data = tmp_path / "data"
    vault = Vault(data, CHEAP_KDF, "sqlcipher")
    ident = vault.create_identity()
    done = operation.perform(vault, ident.token, None, NOTE, "POST /note", {"text": "one"}, None, LIMITS, note)
    assert done.finish is None and copy_count(data, ident.user_id) == 1 and lock_free(data, ident.user_id)
    assert vault.after.count() == 0


def test_a_session_refused_midway_ends_at_once(tmp_path: Path):
    data = tmp_path / "data"
    vault = Vault(data, CHEAP_KDF, "sqlcipher")
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        _, full = vault.mint_grant(s, "full")
    with pytest.raises(Exception, match="one line"):
        operation.perform(vault, full, None, NOTE, "POST /note", {"text": "two\nlines"}, None, LIMITS, note)
    assert vault.after.count() == 0 and lock_free(data, ident.user_id)


async def _asgi_call(app, method: str, target: str, token: str, body: dict | None, events: list[str]) -> int:
    path, _, query = target.partition("?")
    raw = b"" if body is None else orjson.dumps(body)
    headers = [(b"host", b"stash.test"), (b"authorization", f"Bearer {token}".encode())]
    if body is not None:
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": urllib.parse.unquote(path),
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    status = [0]
    sent = [False]

    async def receive() -> dict:
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            status[0] = message["status"]
        elif message["type"] == "http.response.body" and not message.get("more_body"):
            events.append("answer sent")

    await app(scope, receive, send)
    return status[0]


def test_through_the_app_the_answer_leaves_before_the_copy_is_raised_for_a_capability_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from stash.web.app import create_app

    data = tmp_path / "data"
    vault = Vault(data, CHEAP_KDF, "sqlcipher")
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        _, full = vault.mint_grant(s, "full")
    events: list[str] = []
    real = access.Session.publish_head

    def publish_head(self) -> None:
        events.append("copy raised")
        real(self)

    monkeypatch.setattr(access.Session, "publish_head", publish_head)

    async def run() -> None:
        app = create_app(make_settings(data, keep_open=5.0))
        life = Lifespan(app)
        await life.start()
        try:
            assert await _asgi_call(app, "POST", "/note", full, {"text": "by the capability"}, events) == 200
            after_capability = list(events)
            events.clear()
            assert await _asgi_call(app, "POST", "/note", ident.token, {"text": "by the owner"}, events) == 200
            assert after_capability == ["answer sent", "copy raised"]
            assert events == ["copy raised", "answer sent"]
        finally:
            await life.stop()

    asyncio.run(run())
    assert copy_count(data, ident.user_id) == 2
