"""Fair shares against a real ``stash serve`` (issue 11, item 2), on
loopback and bounded: a tenant with 20,000 long memories floods slow
recalls; one runs at a time and the rest are answered 429 with Retry-After
and advice, while another tenant's wakes and notes are served throughout.
With ``--slow-slots 1``, a third tenant's recall meanwhile is told the server
is busy, not queued behind the flood.

How fast the victim's wake stays is measured, not asserted: bench/hostile.py
(bench/README.md)."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from tests.helpers import assert_error
from tests.live import Http, start_server

FLOOD_MEMORIES = 20_000
SLOW_PATTERN = "e.{200}"  # defeats RE2's DFA: about 75 µs per line, so each recall takes a second or more
FLOODERS = 8


def import_long_memories(http: Http, token: str, n: int) -> None:
    filler = "e" * 240
    entries = [{"date": "2024-01-01", "text": f"memory {k} {filler}"} for k in range(n)]
    http.ok("POST", "/import", token, json={"entries": entries})


def flood(url: str, token: str, answers: list, start: threading.Barrier) -> None:
    with httpx.Client(base_url=url, timeout=120) as c:
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
