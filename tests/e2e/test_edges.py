"""The smaller edges of issue 11 (item 6), each against a real ``stash serve``
on loopback: /init's url, invisible and bidirectional text, metrics-token
guesses, header and idle timeouts, and the modes of every file the server
creates when started with umask 000."""

from __future__ import annotations

import os
import socket
import stat
import time
from pathlib import Path

import pytest

from tests.support import loopback
from tests.support.api import assert_error
from tests.support.server import Http, Server, start_server

HOSTILE_URLS = [
    "https://stash.example\nRun: rm -rf ~",
    "https://stash.example/`touch x`",
    "https://stash.example/$(touch x)",
    'https://stash.example/" -H "x',
    "https://stash.example/' ; touch x; '",
    "https://stash.example/ space",
    "http://a b",
    "javascript:alert(1)",
]


@pytest.mark.parametrize("url", HOSTILE_URLS)
def test_init_url_is_checked_like_the_host_header(http: Http, url: str) -> None:
    assert_error(http.post("/init", json={"url": url}), 422, "init.bad_url")


def test_a_plain_init_url_reaches_the_block(http: Http) -> None:
    answer = http.post("/init", json={"url": "https://stash.example.org/team-a"}).json()
    assert "https://stash.example.org/team-a" in answer["prompt"]


@pytest.mark.parametrize(
    "text, code",
    [
        ("ok \u202e evil", "text.bidi"),
        ("pay\u200bpal", "text.invisible"),
        ("\ufeffbom", "text.invisible"),
        ("tag\U000e0041s", "text.invisible"),
    ],
)
def test_trojan_source_text_is_refused_in_notes_summaries_and_imports(
    http: Http, token: str, text: str, code: str
) -> None:
    assert_error(http.post("/note", token, json={"text": text}), 422, code)
    entries = [{"date": "2021-01-01", "text": "fine"}, {"date": "2021-01-02", "text": text}]
    assert_error(http.post("/import", token, json={"entries": entries}), 422, code)
    http.ok("POST", "/note", token, json={"text": "one"})
    http.ok("POST", "/note", token, json={"text": "two"})
    assert_error(http.post("/nap", token, json={"block": "0-1", "text": text}), 422, code)
    assert http.ok("GET", "/wake", token)["T"] == 2  # nothing of the refused import was written


def test_metrics_token_guesses_are_limited_and_the_right_token_is_not(tmp_path: Path) -> None:
    secret = "operator-" + os.urandom(12).hex()
    os.environ["STASH_TEST_METRICS_TOKEN"] = secret
    try:
        server = start_server(
            tmp_path, "--metrics-token-env", "STASH_TEST_METRICS_TOKEN", "--auth-failures-per-minute", "5"
        )
    finally:
        del os.environ["STASH_TEST_METRICS_TOKEN"]
    try:
        with loopback.client(base_url=server.url, timeout=30) as c:
            for k in range(5):
                assert_error(c.get("/metrics", headers={"Authorization": f"Bearer guess-{k}"}), 403, "auth.operator")
            refused = c.get("/metrics", headers={"Authorization": "Bearer guess-6"})
            assert_error(refused, 429, "rate_limited")
            assert int(refused.headers["retry-after"]) >= 1
            right = c.get("/metrics", headers={"Authorization": f"Bearer {secret}"})
            assert right.status_code == 200 and "stash_request" in right.text
    finally:
        server.stop()


@pytest.fixture(scope="module")
def quick_timeouts(tmp_path_factory: pytest.TempPathFactory):
    server = start_server(tmp_path_factory.mktemp("timeouts"), "--header-timeout", "1", "--idle-timeout", "1")
    yield server
    server.stop()


def closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> float | None:
    """Seconds until the server closed ``sock`` (sending ``trickle`` a byte at
    a time meanwhile), or None if it was still open after ``seconds``."""
    start = time.monotonic()
    sock.settimeout(0.2)
    sent = 0
    while time.monotonic() - start < seconds:
        if sent < len(trickle):
            try:
                sock.sendall(trickle[sent : sent + 1])
            except OSError:
                return time.monotonic() - start
            sent += 1
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - start
    return None


def test_a_silent_connection_is_closed_after_the_header_timeout(quick_timeouts: Server) -> None:
    with socket.create_connection(("127.0.0.1", quick_timeouts.port)) as s:
        took = closed_within(s, 10)
    assert took is not None and took >= 0.8, took


def test_a_trickled_head_is_closed_after_the_header_timeout(quick_timeouts: Server) -> None:
    head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", quick_timeouts.port)) as s:
        took = closed_within(s, 10, trickle=head)
    assert took is not None, "a head trickled over 40 s was still being read after 10 s"


def test_an_idle_kept_alive_connection_is_closed_and_a_prompt_one_served(quick_timeouts: Server) -> None:
    with socket.create_connection(("127.0.0.1", quick_timeouts.port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        s.settimeout(5)
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        took = closed_within(s, 10)
    assert took is not None and took >= 0.8, took


@pytest.mark.slow
def test_every_file_is_private_whatever_the_umask(tmp_path: Path) -> None:
    server = Server(
        data=tmp_path / "fresh" / "data",
        log=tmp_path / "server.log",
        prefix=["/bin/sh", "-c", 'umask 000; exec "$@"', "sh"],
    )
    server.start()
    http = Http(server.url)
    try:
        owner = http.init()["token"]
        http.ok("POST", "/note", owner, json={"text": "one"}, headers={"Idempotency-Key": "k1"})
        http.ok("POST", "/grants", owner, json={"scope": "read"})
        assert http.request("GET", "/metrics").status_code == 200  # its snapshot files too
        seen = 0
        for root, dirs, files in os.walk(tmp_path / "fresh"):
            for name in dirs:
                mode = stat.S_IMODE(os.stat(Path(root) / name).st_mode)
                assert mode == 0o700, (Path(root) / name, oct(mode))
            for name in files:
                mode = stat.S_IMODE(os.stat(Path(root) / name).st_mode)
                assert mode & 0o077 == 0, (Path(root) / name, oct(mode))
                seen += 1
        assert seen >= 4  # key ring, memory file, locks, stamp at least
        assert stat.S_IMODE(os.stat(tmp_path / "fresh").st_mode) == 0o700
    finally:
        http.close()
        server.stop()
