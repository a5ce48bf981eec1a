"""Operating a real ``stash serve``: a SIGTERM that lets the request in flight
finish, readiness that fails when the data folder cannot be written, and
/metrics in the Prometheus text format with nothing of a user in it."""

from __future__ import annotations

import json
import math
import re
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest

from stash.service.access import Vault
from tests.support import loopback
from tests.support.api import CHEAP_KDF_FLAGS, assert_error
from tests.support.server import Http, metrics_folder, start_server, worker_pids

pytestmark = pytest.mark.slow

EXIT_TIMEOUT = 30.0
POLL_S = 0.05

workers = pytest.mark.parametrize("n_workers", [1, 2], ids=["1-worker", "2-workers"])


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """Status and body of one HTTP/1.1 answer, read until the server closes
    the connection (it does after a request that arrived while stopping)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def wait_in_flight(url: str, n: int) -> None:
    """Until the server counts ``n`` requests in flight (its /metrics gauge,
    which does not count the scrape itself)."""
    deadline = time.monotonic() + EXIT_TIMEOUT
    while time.monotonic() < deadline:
        text = loopback.get(url + "/metrics", timeout=EXIT_TIMEOUT).text
        found = re.search(r"^stash_requests_in_flight (\S+)$", text, re.M)
        if found and float(found[1]) >= n:
            return
        time.sleep(POLL_S)
    raise AssertionError(f"the server never had {n} request(s) in flight")


def wait_until_unanswered(url: str) -> None:
    """Until a new request goes unanswered: the server has begun to stop
    (it no longer accepts connections, or leaves them waiting)."""
    deadline = time.monotonic() + EXIT_TIMEOUT
    while time.monotonic() < deadline:
        try:
            loopback.get(url + "/health", timeout=0.5)
        except httpx.TransportError:
            return
        time.sleep(POLL_S)
    raise AssertionError("the server still answered new requests long after SIGTERM")


@workers
def test_sigterm_finishes_the_request_in_flight_then_exits_0(tmp_path: Path, n_workers: int):
    server = start_server(tmp_path, "--workers", str(n_workers), *CHEAP_KDF_FLAGS)
    try:
        http = Http(server.url)
        token = http.init()["token"]
        http.close()
        entries = [{"date": "2026-01-02", "text": f"entry {k} of the import"} for k in range(3000)]
        body = json.dumps({"entries": entries}).encode()
        head = (
            f"POST /import HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=EXIT_TIMEOUT) as sock:
            # The request is in flight from its head on: half its body is sent
            # before the signal, the rest after.
            sock.sendall(head + body[: len(body) // 2])
            wait_in_flight(server.url, 1)
            server.proc.send_signal(signal.SIGTERM)
            wait_until_unanswered(server.url)
            sock.sendall(body[len(body) // 2 :])
            status, answer = read_response(sock)
        assert status == 200, answer
        assert json.loads(answer)["first"] == 0 and json.loads(answer)["last"] == 2999
        assert server.proc.wait(timeout=EXIT_TIMEOUT) == 0, server.log_text()[-3000:]
        with pytest.raises(httpx.TransportError):
            loopback.get(server.url + "/health", timeout=2)
    finally:
        server.stop()

    # Every file was closed: the last close folded each WAL into its file.
    users = server.data / "users"
    assert not list(users.rglob("*-wal")) and not list(users.rglob("*-shm")), list(users.rglob("*"))
    with Vault(server.data).session(token, "read") as s:
        assert [text for _, _, text in s.open_memory().mf.memories(0, 3000)] == [e["text"] for e in entries]

    # and the server starts again on the same files
    server.start()
    try:
        http = Http(server.url)
        found = http.ok("GET", "/recall", token, params={"q": "entry 2999 "})
        assert found == {
            "matches": ["#2999 2026-01-02 entry 2999 of the import"],
            "total": 1,
            "more": None,
            "message": "1 match.",
            "run": [],
        }
        http.close()
    finally:
        server.stop()


def test_readiness_fails_while_the_data_folder_cannot_be_written(tmp_path: Path):
    """Tests run as root, for whom permission bits do not stop a write, so the
    folder is made unwritable for real: replaced by a regular file."""
    server = start_server(tmp_path, *CHEAP_KDF_FLAGS)
    http = Http(server.url)
    moved = tmp_path / "data.moved"
    try:
        assert http.ok("GET", "/health", params={"ready": 1})["ready"] is True
        assert http.ok("GET", "/health")["ready"] is None
        server.data.rename(moved)
        server.data.write_bytes(b"not a folder")
        assert_error(http.get("/health", params={"ready": 1}), 503, "ready.unwritable")
        # liveness is still fine: the process serves
        assert http.ok("GET", "/health")["ok"] is True
        assert_error(http.get("/health", params={"ready": 2}), 422, "request.bad_value")
        server.data.unlink()
        moved.rename(server.data)
        assert http.ok("GET", "/health", params={"ready": 1})["ready"] is True
        # the probe leaves nothing behind
        assert [p.name for p in (server.data / "users").iterdir()] == []
    finally:
        http.close()
        server.stop()


# ---------------------------------------------------------------- /metrics

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*"'
VALUE = r"[+-]?(?:\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|Inf|NaN)"
SAMPLE = re.compile(rf"({NAME})(?:\{{((?:{LABEL})(?:,{LABEL})*)?\}})? ({VALUE})(?: -?\d+)?")
HELP = re.compile(rf"# HELP ({NAME}) (.*)")
TYPE = re.compile(rf"# TYPE ({NAME}) (counter|gauge|histogram|summary|untyped)")
LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text: str) -> dict[str, dict]:
    """A strict reader of the Prometheus text format 0.0.4: every line is a
    HELP, a TYPE or a sample of a family declared before it; no family is
    declared twice and no series appears twice; a histogram's buckets are
    cumulative and end in +Inf equal to its _count. Returns each family's
    type and samples as {(name, labels): value}."""
    assert text.endswith("\n"), "the text must end with a newline"
    families: dict[str, dict] = {}
    seen: set[tuple] = set()
    for line in text.splitlines():
        if m := HELP.fullmatch(line):
            assert "help" not in families.setdefault(m[1], {"samples": {}}), f"two HELP for {m[1]}"
            families[m[1]]["help"] = m[2]
            continue
        if m := TYPE.fullmatch(line):
            fam = families.setdefault(m[1], {"samples": {}})
            assert "type" not in fam and not fam["samples"], f"TYPE of {m[1]} twice or after its samples"
            fam["type"] = m[2]
            continue
        assert not line.startswith("#") and line.strip(), f"not a line of the format: {line!r}"
        m = SAMPLE.fullmatch(line)
        assert m, f"not a sample: {line!r}"
        name, labels, value = m[1], tuple(LABEL_PAIR.findall(m[2] or "")), float(m[3].replace("Inf", "inf"))
        assert (name, labels) not in seen, f"series twice: {line!r}"
        seen.add((name, labels))
        base = next(
            (
                name[: -len(s)]
                for s in ("_bucket", "_sum", "_count")
                if name.endswith(s) and families.get(name[: -len(s)], {}).get("type") == "histogram"
            ),
            name,
        )
        assert base in families and "type" in families[base], f"{name} has no TYPE before it"
        families[base]["samples"][(name, labels)] = value
    for base, fam in families.items():
        assert "help" in fam and "type" in fam, base
        if fam["type"] == "counter":
            assert all(v >= 0 and math.isfinite(v) for v in fam["samples"].values()), base
        if fam["type"] == "histogram":
            series: dict[tuple, list[tuple[float, float]]] = {}
            for (name, labels), v in fam["samples"].items():
                if name.endswith("_bucket"):
                    le = dict(labels)["le"]
                    rest = tuple(p for p in labels if p[0] != "le")
                    series.setdefault(rest, []).append((float(le.replace("Inf", "inf")), v))
            for rest, buckets in series.items():
                buckets.sort()
                counts = [v for _, v in buckets]
                assert counts == sorted(counts), f"{base}{rest} buckets not cumulative"
                assert buckets[-1][0] == math.inf
                assert buckets[-1][1] == fam["samples"][(base + "_count", rest)]
    return families


def value_of(families: dict, family: str, name: str, **labels: str) -> float | None:
    want = set(labels.items())
    for (n, got), v in families[family]["samples"].items():
        if n == name and want <= set(got):
            return v
    return None


@workers
def test_metrics_parse_and_hold_nothing_of_a_user(tmp_path: Path, n_workers: int):
    server = start_server(tmp_path, "--workers", str(n_workers), *CHEAP_KDF_FLAGS)
    http = Http(server.url)
    memory = "the vault code is ZEBRA-4471-QUARTZ"
    query = "QUARTZ|secretquerytext"
    notes = 6
    try:
        ident = http.init()
        token = ident["token"]
        for k in range(notes):
            http.ok("POST", "/note", token, json={"text": f"{memory} {k}"})
        http.ok("GET", "/recall", token, params={"q": query})
        http.request("GET", "/wake", token)
        assert_error(http.get("/wake", token=token[:-3] + "AAA"), 401, "auth.invalid")
        assert_error(http.get("/no-such-route"), 404, "route.unknown")
        assert_error(http.post("/note", token=token, json={"text": "a\nb"}), 422)

        # With several workers each one publishes its counts every second;
        # the answer adds them up, so it reaches every request made.
        deadline = time.monotonic() + 60
        while True:
            resp = http.get("/metrics")
            assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
            families = parse_exposition(resp.text)
            got = value_of(families, "stash_requests_total", "stash_requests_total", route="/note", status="200")
            # every worker is up and has published (a slow machine starts them slowly)
            up = value_of(families, "stash_workers", "stash_workers")
            if (got == notes and up == n_workers) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        text = resp.text
        # the workers' counter files, where there are several
        folders = [metrics_folder(min(worker_pids(server.proc.pid)))] if n_workers > 1 else []
        snapshots = b"".join(p.read_bytes() for f in folders for p in f.rglob("*") if p.is_file())
        assert snapshots or n_workers == 1
    finally:
        http.close()
        server.stop()

    assert got == notes
    assert families["stash_requests_total"]["type"] == "counter"
    assert families["stash_request_seconds"]["type"] == "histogram"
    # the six notes and the refused one
    assert value_of(families, "stash_request_seconds", "stash_request_seconds_count", route="/note") == notes + 1
    assert value_of(families, "stash_requests_total", "stash_requests_total", route="/wake", status="401") == 1
    assert value_of(families, "stash_errors_total", "stash_errors_total", code="auth.invalid") == 1
    assert value_of(families, "stash_errors_total", "stash_errors_total", code="route.unknown") == 1
    assert value_of(families, "stash_users", "stash_users") == 1
    assert value_of(families, "stash_workers", "stash_workers") == n_workers
    assert (value_of(families, "stash_resident_bytes", "stash_resident_bytes") or 0) > 0
    secret = token.split("_")[2]
    for forbidden in (ident["user_id"], token, secret, secret[:16], "ZEBRA", "QUARTZ", "secretquerytext", "vault code"):
        assert forbidden not in text, forbidden
        assert forbidden.encode() not in snapshots, forbidden
