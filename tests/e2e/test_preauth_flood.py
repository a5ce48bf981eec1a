"""A hostile tenant against a real ``stash serve`` before authenticating
(issue 11, items 1 and 5), on loopback, bounded in requests and time:

- sixteen concurrent 15 MiB imports with forged tokens for a real user id
  are refused without the server buffering them (its RSS grows by less than
  64 MiB), while the user's own wake keeps being served;
- an unknown user and a wrong secret get the same answer to the same request.

How fast the victim's wake stays meanwhile is a number, not an assertion:
bench/hostile.py measures it (bench/README.md)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from tests.support import loopback
from tests.support.forgery import (
    FLOOD,
    FLOOD_DEADLINE,
    MIB,
    forged_for,
    forged_import,
    random_secret_digits,
    rss_bytes,
    with_checksum,
)
from tests.support.server import Http, start_server


def test_forged_import_flood_is_never_buffered(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    http = Http(server.url)
    try:
        victim = http.init()["token"]
        for k in range(5):
            http.ok("POST", "/note", victim, json={"text": f"victim memory {k}"})
        for _ in range(20):  # warm: the first requests allocate what every later one reuses
            http.ok("GET", "/wake", victim)
        before = rss_bytes(server.proc.pid)
        peak = [before]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], rss_bytes(server.proc.pid))
                time.sleep(0.01)

        wakes: list[int] = []

        def victim_wakes() -> None:
            with loopback.client(base_url=server.url, timeout=30) as c:
                while True:  # at least one wake, however soon the flood ends
                    wakes.append(c.get("/wake", headers={"Authorization": f"Bearer {victim}"}).status_code)
                    if stop.is_set():
                        break

        results: list = []
        deadline = time.monotonic() + FLOOD_DEADLINE
        watchers = [threading.Thread(target=sample), threading.Thread(target=victim_wakes)]
        flood = [
            threading.Thread(target=forged_import, args=(server.port, victim, results, deadline)) for _ in range(FLOOD)
        ]
        for t in watchers + flood:
            t.start()
        for t in flood:
            t.join(FLOOD_DEADLINE + 15)
        stop.set()
        for t in watchers:
            t.join(30)
        assert sorted(results) == ["401"] * FLOOD, results
        growth = peak[0] - before
        assert growth < 64 * MIB, f"server RSS grew by {growth / MIB:.1f} MiB under the forged flood"
        assert wakes and set(wakes) == {200}, wakes[:20]
        assert http.ok("GET", "/wake", victim)["T"] == 5  # nothing was imported
    finally:
        http.close()
        server.stop()


def test_unknown_user_and_wrong_secret_answer_alike(http: Http) -> None:
    owner = http.init()["token"]
    http.ok("GET", "/wake", owner)
    user = owner[7:23]
    stranger = ("0" if user[0] != "0" else "1") + user[1:]
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", "/wake?x=1", {}),
        ("POST", "/note", {"json": {"x": 1}}),
        ("POST", "/import", {"content": b"x" * (2 * MIB)}),
        ("GET", "/recall", {}),
        ("DELETE", "/grants/abc", {}),
    ]
    for method, url, kw in cases:
        wrong = http.request(method, url, forged_for(owner), **kw)
        unknown = http.request(method, url, with_checksum(f"stash1_{stranger}_" + random_secret_digits()), **kw)
        assert wrong.status_code == unknown.status_code == 401, (url, wrong.text, unknown.text)
        assert wrong.content == unknown.content
    assert http.request("GET", "/wake?x=1", owner).status_code == 400  # the field check is real, after auth
