"""Lost answers and retries against a real ``stash serve``: a write whose
answer never reached the client, sent again with its Idempotency-Key, is
written once; and the ``stash`` client resends a write whose answer was lost,
with the same key. A server of its own, so its request counts are this
module's alone."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stash import client
from tests.support.server import CLI_TIMEOUT, REPO, Http, Server, cli_env, path_with, python_bin, start_server

WAIT = 30.0
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("idem-server"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def http(srv: Server) -> Iterator[Http]:
    h = Http(srv.url)
    yield h
    h.close()


def metric(http: Http, line_start: str) -> float:
    text = http.client.get("/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))


def wait_for(check, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def count(http: Http, token: str, text: str) -> int:
    return http.ok("POST", "/recall", token, json={"q": re.escape(text) + "$"})["total"]


def send_and_hang_up(port: int, token: str, key: str, body: dict) -> None:
    """A whole POST /note, then close the connection without reading a byte
    of the answer: to the client, the answer is lost."""
    data = json.dumps(body).encode()
    head = (
        f"POST /note HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
        f"Idempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as s:
        s.sendall(head.encode() + data)


KEY = "lost-answer-key-8c1f2e9a"


def test_a_note_whose_answer_is_lost_retried_five_times_is_one_memory(srv: Server, http: Http):
    token = http.init()["token"]
    text = "the answer to this note was lost five times"
    notes = 'stash_requests_total{method="POST",route="/note"'
    before = metric(http, notes)
    send_and_hang_up(srv.port, token, KEY, {"text": text})
    # The server went on with the write after the client hung up.
    wait_for(lambda: count(http, token, text) == 1, "the first write")
    for _ in range(4):
        send_and_hang_up(srv.port, token, KEY, {"text": text})
    wait_for(lambda: metric(http, notes) == before + 5, "the server to answer all five")
    # A sixth try finally reads its answer: the first one's, replayed.
    resp = http.post("/note", token, json={"text": text}, headers={"Idempotency-Key": KEY})
    assert resp.status_code == 200 and resp.headers["idempotent-replayed"] == "true"
    answer = resp.json()
    assert answer["head"]["count"] == 1
    assert {k: v for k, v in answer.items() if k != "head"} == {"id": 0, "nap": None}
    assert count(http, token, text) == 1
    assert http.ok("GET", "/wake", token)["T"] == 1
    assert KEY not in srv.log_text() and KEY not in http.client.get("/metrics").text
    for path in srv.data.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path.name


class FlakyProxy:
    """A TCP proxy in front of the server that spoils the first ``spoil``
    requests: ``drop`` forwards each, reads the server's whole answer and then
    closes the client's connection without it; ``502`` answers a gateway
    error without forwarding. Later requests pass through. It records the
    Idempotency-Key of every request it sees."""

    def __init__(self, target: int, mode: str, spoil: int = 1) -> None:
        self.target, self.mode, self.spoil = target, mode, spoil
        self.keys: list[str | None] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(WAIT)
                self._one(conn)

    def _one(self, conn: socket.socket) -> None:
        request = _read_request(conn)
        if request is None:
            return
        found = re.search(rb"\r\nidempotency-key: *([^\r]*)\r\n", request, re.IGNORECASE)
        self.keys.append(found.group(1).decode() if found else None)
        spoiled = len(self.keys) <= self.spoil
        if spoiled and self.mode == "502":
            conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        with socket.create_connection(("127.0.0.1", self.target), timeout=WAIT) as up:
            up.sendall(request)
            answer = _read_to_close(up)
        if not spoiled:
            conn.sendall(answer)

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=WAIT)
        self.sock.close()


def _read_request(conn: socket.socket) -> bytes | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"\r\ncontent-length: *(\d+)", head, re.IGNORECASE)
    need = int(length.group(1)) if length else 0
    while len(body) < need:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        body += chunk
    # The client asked to close after the answer; the proxy reads until the server does.
    return head + b"\r\n\r\n" + body


def _read_to_close(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


@pytest.fixture
def run_client(tmp_path: Path):
    def run(url: str, token: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        env = cli_env(url, token, path_with(python_bin(tmp_path / "bin")))
        return subprocess.run(
            [sys.executable, "-m", "stash", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
            cwd=REPO,
            input=stdin,
        )

    return run


@pytest.mark.parametrize("mode", ["drop", "502"])
def test_the_client_resends_a_lost_note_with_the_same_key(srv: Server, http: Http, run_client, mode: str):
    token = http.init()["token"]
    text = f"noted through a proxy that spoils the first answer ({mode})"
    replays = 'stash_events_total{event="idempotent_replay"}'
    before = metric(http, replays)
    proxy = FlakyProxy(srv.port, mode)
    try:
        done = run_client(f"http://127.0.0.1:{proxy.port}", token, "note", text)
    finally:
        proxy.close()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "Saved as #0."
    assert len(proxy.keys) == 2 and proxy.keys[0] == proxy.keys[1] and UUID.fullmatch(proxy.keys[0] or "")
    assert count(http, token, text) == 1
    # Dropped: the server wrote the first and replayed it to the resend. 502:
    # the first never reached it, so the resend was the first it saw.
    assert metric(http, replays) == before + (1 if mode == "drop" else 0)


def test_the_client_mints_one_grant_when_the_answer_is_lost(srv: Server, http: Http, run_client):
    token = http.init()["token"]
    proxy = FlakyProxy(srv.port, "drop")
    try:
        done = run_client(f"http://127.0.0.1:{proxy.port}", token, "grants", "read")
    finally:
        proxy.close()
    assert done.returncode == 0, done.stderr
    minted = done.stdout.splitlines()[-1]
    assert len(proxy.keys) == 2 and proxy.keys[0] == proxy.keys[1]
    grants = http.ok("GET", "/grants", token)["grants"]
    assert [g["scope"] for g in grants] == ["owner", "read"]
    assert http.ok("GET", "/wake", minted)["T"] == 0  # the token printed is the grant's


@pytest.mark.slow
def test_each_write_gets_a_fresh_key_and_reads_none(srv: Server, http: Http, run_client):
    token = http.init()["token"]
    proxy = FlakyProxy(srv.port, "drop", spoil=0)
    try:
        for verb in (("import", "-"), ("note", "same words"), ("note", "same words"), ("nap",), ("wake",)):
            done = run_client(f"http://127.0.0.1:{proxy.port}", token, *verb, stdin="2020-01-01 imported\n")
            assert done.returncode == 0, done.stderr
    finally:
        proxy.close()
    *writes, wake = proxy.keys
    assert len(writes) == len(set(writes)) == 4 and all(UUID.fullmatch(k or "") for k in writes) and wake is None
    assert count(http, token, "same words") == 2


def test_a_client_that_never_gets_an_answer_gives_up(srv: Server, http: Http, monkeypatch, capsys):
    token = http.init()["token"]
    proxy = FlakyProxy(srv.port, "502", spoil=100)
    # In process, with short pauses: the backoff itself is not what is tested here.
    monkeypatch.setattr(client, "RETRY_PAUSE", 0.01)
    monkeypatch.setenv("STASH_URL", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.setenv("STASH_TOKEN", token)
    try:
        code = client.main(["note", "never answered"])
    finally:
        proxy.close()
    err = capsys.readouterr().err
    # A gateway's 502 to the end: no Stash server answered, the client's exit status 3.
    assert code == client.UNREACHABLE == 3 and "502" in err and "Traceback" not in err
    assert len(proxy.keys) == 5 and len(set(proxy.keys)) == 1  # the first try and four resends
    assert count(http, token, "never answered") == 0
