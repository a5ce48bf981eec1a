"""An agent that has only the AGENTS.md block lives through a stand-in broker
(docs/DESIGN.md, "HTTP surface"): a loopback proxy that, like a gateway, refuses any query string
and any trailing slash. The agent follows only what the server prints — the
block's commands, the served skill and reference, each wake's ``next``, each
nap's and batch's answering command, each recall's next page — run through
``/bin/sh`` with real curl, exactly as printed. Nothing it is told to run may
be refused by the broker."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.api import matched
from tests.support.docs.commands import indented_commands
from tests.support.docs.printed import orders
from tests.support.server import CLI_TIMEOUT, REPO, Http

pytestmark = pytest.mark.slow

# Host passes through, as a reverse proxy that keeps it does, so the server names the broker's address.
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class Broker:
    """Forwards each request to ``upstream`` unless its target has a query
    string or ends in ``/``; remembers what it passed and what it refused."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        assert parts.hostname is not None
        self.host, self.port = parts.hostname, parts.port
        self.passed: list[str] = []
        self.refused: list[str] = []
        broker = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep the test output clean
                pass

            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                line = f"{self.command} {self.path}"
                if "?" in self.path or (self.path != "/" and self.path.endswith("/")):
                    broker.refused.append(line)
                    payload = b'{"error": "broker.refused", "message": "No query strings or trailing slashes."}'
                    self.send_response(400)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                broker.passed.append(line)
                conn = http.client.HTTPConnection(broker.host, broker.port, timeout=CLI_TIMEOUT)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP_HEADERS:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _relay

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Broker:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def broker(base_url: str) -> Iterator[Broker]:
    with Broker(base_url) as b:
        yield b


def test_the_broker_refuses_what_a_gateway_refuses(broker: Broker) -> None:
    """The stand-in is strict: without this, the walk below proves nothing."""
    for target in ("/wake?part=2", "/health/"):
        conn = http.client.HTTPConnection("127.0.0.1", int(broker.url.rsplit(":", 1)[1]), timeout=CLI_TIMEOUT)
        conn.request("GET", target)
        assert conn.getresponse().status == 400
        conn.close()
    assert broker.refused == ["GET /wake?part=2", "GET /health/"]


class Agent:
    """Runs printed commands in a shell that has the two variables."""

    def __init__(self, url: str, token: str, cwd: Path) -> None:
        self.env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(cwd),
            "LANG": "C.UTF-8",
            "STASH_URL": url,
            "STASH_TOKEN": token,
        }
        self.cwd = cwd
        self.runs = 0

    def run(self, command: str) -> str:
        assert re.search(r"<[a-z][a-z -]*>", command) is None, command
        self.runs += 1
        done = subprocess.run(
            ["/bin/sh", "-c", command], env=self.env, cwd=self.cwd, capture_output=True, text=True, timeout=CLI_TIMEOUT
        )
        assert done.returncode == 0, (command, done.stderr)
        return done.stdout

    def json(self, command: str) -> dict:
        return json.loads(self.run(command))


def block_commands(block: str) -> list[str]:
    return indented_commands(block)


def test_an_agent_lives_through_a_broker_on_what_the_server_prints(broker: Broker, http: Http, tmp_path: Path) -> None:
    # A person mints the memory, naming the broker as the public address.
    minted = http.post("/init", json={"url": broker.url}).json()
    block = minted["prompt"]
    agent = Agent(broker.url, minted["token"], tmp_path)
    commands = block_commands(block)

    # The block points at the served skill and reference, never at a file.
    assert "SKILL.md" not in block and "API-REFERENCE.md" not in block
    skill_cmd = next(c for c in commands if c.endswith('"$STASH_URL/skill"'))
    assert agent.run(skill_cmd) == (REPO / "skill" / "SKILL.md").read_text(encoding="utf-8")
    assert "$STASH_URL/reference" in block
    assert agent.run('curl -fsS "$STASH_URL/reference"') == (REPO / "API-REFERENCE.md").read_text(encoding="utf-8")
    openapi = agent.json('curl -fsS "$STASH_URL/openapi.json"')
    assert openapi["servers"] == [{"url": broker.url}]

    # The owner moves 600 old memories in and sets small parts; then the agent's session starts.
    entries = [{"date": "2024-02-03", "text": f"imported memory number {i}"} for i in range(600)]
    token = minted["token"]
    assert http.post("/import", token, json={"entries": entries}).status_code == 200
    assert http.post("/config", token, json={"PART_LINES": 40, "PART_CHARS": 1500}).status_code == 200

    wake_cmd = next(c for c in commands if c.endswith('"$STASH_URL/wake"'))
    answer = agent.run(wake_cmd)
    assert answer.startswith("Cannot wake: ")
    batches = 0
    while True:
        nap, *offer = orders(answer)
        if offer:
            listed = agent.run(offer[0])
            batches += 1
            command = orders(listed)[-1]
            for block in re.findall(r"^#(\d+-\d+):$", listed, re.M):
                command = command.replace(f"<your line for {block}>", f"summary of {block}")
        elif " wake" in nap or nap.endswith('"$STASH_URL/wake"'):
            break
        else:
            command = nap.replace("<your line>", "one summary")
        answer = agent.run(command)
        if not orders(answer) or answer.startswith("Nothing left"):
            break
    assert batches >= 2

    # Wake to the end, part by part, each through the order the last part printed.
    answer = agent.run(wake_cmd)
    lines: list[str] = []
    while True:
        text = answer.splitlines()
        if "You are awake." in text:
            lines += text[1 : text.index("You are awake.")]
            break
        assert text[-2] == "Not awake yet." and "?" not in text[-1]
        lines += text[1:-2]
        answer = agent.run(orders(answer)[0])
    assert "Compress" not in answer and len(lines) == 96
    assert lines[-1] == "#599 2024-02-03 imported memory number 599"

    # Recall pages through every match by the order each page prints.
    recall_cmd = next(c for c in commands if '"$STASH_URL/recall"' in c).replace("<regex>", "number")
    page = agent.run(recall_cmd)
    found = [x for x in page.splitlines() if x.startswith("#")]
    pages = 1
    while orders(page):
        page = agent.run(orders(page)[0].replace("<the same regex>", "number"))
        found = [x for x in page.splitlines() if x.startswith("#")] + found
        pages += 1
    assert pages > 1
    assert found == [f"#{i} 2024-02-03 imported memory number {i}" for i in range(600)]

    # Zoom into the oldest summary line of the wake, by the block's command.
    oldest = matched(re.match(r"#(\d+-\d+) ", lines[0])).group(1)
    zoom_cmd = next(c for c in commands if '"$STASH_URL/zoom"' in c).replace("<lo-hi>", oldest)
    assert len(agent.run(zoom_cmd).splitlines()) == 2

    assert broker.refused == [], broker.refused
    assert len(broker.passed) >= agent.runs
