"""A request cut by the shutdown timeout never answers a bare 500, and a
write it committed is never reported as failed (web/stopping.py): SIGTERM a
real server under ``--shutdown-timeout 0.1`` in the middle of a long
import, then start it again and resend with the same Idempotency-Key."""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support import loopback
from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.server import Http, Server

pytestmark = pytest.mark.slow

LINES = 20_000


def test_sigterm_during_a_long_import_answers_its_real_answer_or_503(tmp_path: Path):
    server = Server(
        data=tmp_path / "data", log=tmp_path / "server.log", extra=["--shutdown-timeout", "0.1", *CHEAP_KDF_FLAGS]
    ).start()
    http = Http(server.url)
    owner = http.init()
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    body = "\n".join(f"{today} imported line {k}" for k in range(LINES))
    headers = {
        "Authorization": f"Bearer {owner['token']}",
        "Idempotency-Key": "cut-import-1",
        "Content-Type": "text/plain",
    }
    answers: list[httpx.Response] = []

    def send() -> None:
        with loopback.client(base_url=server.url, timeout=60) as client:
            answers.append(client.post("/import", content=body, headers=headers))

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(0.4)  # the body is in and the import is writing
    server.stop()
    sender.join(timeout=60)
    http.close()
    assert answers, "the cut request got no answer at all"
    first = answers[0]
    assert first.status_code in (200, 503), first.text
    assert "Traceback" not in server.log_text()
    if first.status_code == 503:
        assert first.json()["error"] == "server.stopping"
    server.start()
    http = Http(server.url)
    try:
        again = loopback.post(f"{server.url}/import", content=body, headers=headers, timeout=60)
        assert again.status_code == 200, again.text
        if first.status_code == 200:
            # Reported done, and it was: the resend is its replay.
            assert again.headers.get("Idempotent-Replayed") == "true" and again.json() == first.json()
        # Imported exactly once, whichever way the first answer went.
        assert http.ok("GET", "/config", owner["token"]) is not None
        wake = http.ok("POST", "/recall", owner["token"], json={"q": f"imported line {LINES - 1}$"})
        assert len(wake["matches"]) == 1
        assert again.json()["last"] - again.json()["first"] + 1 == LINES
    finally:
        server.stop()
        http.close()
