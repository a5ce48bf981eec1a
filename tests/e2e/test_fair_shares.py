"""Fair shares against a real ``stash serve`` (issue 11, item 2), on
loopback and bounded: a tenant with 20,000 long memories floods slow
recalls; one runs at a time and the rest are answered 429 with Retry-After
and advice, while another tenant's wakes and notes are served throughout.
With ``--slow-slots 1``, a third tenant's recall meanwhile is told the server
is busy, not queued behind the flood.

How fast the victim's wake stays is measured, not asserted: bench/hostile.py
(bench/README.md)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support import loopback
from tests.support.api import assert_error
from tests.support.server import REPO, Http, start_server

pytestmark = pytest.mark.slow

FLOOD_MEMORIES = 20_000
SLOW_PATTERN = "e.{200}"  # defeats RE2's DFA: about 75 µs per line, so each recall takes a second or more
FLOODERS = 8


def import_long_memories(http: Http, token: str, n: int) -> None:
    filler = "e" * 240
    entries = [{"date": "2024-01-01", "text": f"memory {k} {filler}"} for k in range(n)]
    http.ok("POST", "/import", token, json={"entries": entries})


def flood(url: str, token: str, answers: list, start: threading.Barrier) -> None:
    with loopback.client(base_url=url, timeout=120) as c:
        start.wait(30)
        r = c.post("/recall", headers={"Authorization": f"Bearer {token}"}, json={"q": SLOW_PATTERN})
        answers.append(r)


def test_a_recall_flood_runs_one_at_a_time_and_others_are_served(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--slow-slots", "1")
    http = Http(server.url)
    try:
        flooder = http.init()["token"]
        victim = http.init()["token"]
        bystander = http.init()["token"]
        import_long_memories(http, flooder, FLOOD_MEMORIES)
        http.ok("POST", "/note", victim, json={"text": "the victim's memory"})
        http.ok("POST", "/note", bystander, json={"text": "a bystander's memory"})

        answers: list[httpx.Response] = []
        start = threading.Barrier(FLOODERS)
        threads = [threading.Thread(target=flood, args=(server.url, flooder, answers, start)) for _ in range(FLOODERS)]
        for t in threads:
            t.start()
        # While the flood runs: the victim wakes and notes; the bystander's recall is told to come back.
        served, bystander_answers = [], []
        while len(answers) < FLOODERS - 1 and any(t.is_alive() for t in threads):
            served.append(http.request("GET", "/wake", victim).status_code)  # the flood's refusals come back first
        while any(t.is_alive() for t in threads):
            served.append(http.request("GET", "/wake", victim).status_code)
            bystander_answers.append(http.request("POST", "/recall", bystander, json={"q": "bystander"}))
        for t in threads:
            t.join(120)
        http.ok("POST", "/note", victim, json={"text": "noted after the flood"})

        ok = [r for r in answers if r.status_code == 200]
        busy = [r for r in answers if r.status_code != 200]
        assert len(answers) == FLOODERS and ok and busy, [r.status_code for r in answers]
        for r in busy:
            body = assert_error(r, 429, "busy.slow")
            assert int(r.headers["retry-after"]) >= 1
            assert "one at a time" in body["message"]
        assert served and set(served) == {200}
        assert any(r.status_code == 429 and r.json()["error"] == "busy.server" for r in bystander_answers)
        # Once the flood is over the bystander's recall runs.
        assert http.ok("POST", "/recall", bystander, json={"q": "bystander"})["total"] == 1
    finally:
        http.close()
        server.stop()


def recall_refusals(url: str) -> float:
    """How many recalls the server has refused 429 so far (its /metrics)."""
    text = loopback.get(url + "/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("stash_requests_total{") and 'route="/recall"' in line and 'status="429"' in line
    )


def test_the_client_waits_as_told_when_the_slow_slot_is_taken_then_answers(tmp_path: Path) -> None:
    """An import whose body is still arriving holds the server's one slow
    slot (taken before the body is read). The client's recall is refused
    429 busy.*, waits Retry-After and sends it again — safe, since a busy
    refusal did nothing — and answers once the slot is free."""
    server = start_server(tmp_path, "--slow-slots", "1")
    http = Http(server.url)
    try:
        owner = http.init()["token"]
        other = http.init()["token"]
        http.ok("POST", "/note", other, json={"text": "the heron came back"})
        # Larger than a note's cap, so nothing of it is read before the token is checked.
        body = json.dumps({"entries": [{"date": "2024-01-01", "text": f"held {k}"} for k in range(4000)]}).encode()
        head = (
            f"POST /import HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {owner}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
            sock.sendall(head + body[:5])  # the slot is held while the rest is awaited
            env = {**os.environ, "STASH_URL": server.url, "STASH_TOKEN": other, "STASH_PIN": "off"}
            client = subprocess.Popen(
                [sys.executable, "-m", "stash", "recall", "heron"],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                deadline = time.monotonic() + 60
                while recall_refusals(server.url) < 1:
                    assert time.monotonic() < deadline and client.poll() is None, client.communicate()
                    time.sleep(0.05)
                sock.sendall(body[5:])  # the import finishes and frees the slot
                assert sock.recv(65536).startswith(b"HTTP/1.1 200"), "the held import was answered"
                out, err = client.communicate(timeout=60)
            finally:
                client.kill()
        assert client.returncode == 0, (out, err)
        assert "#0 " in out and "the heron came back" in out and "1 match." in out, out
        assert recall_refusals(server.url) >= 1
    finally:
        http.close()
        server.stop()
