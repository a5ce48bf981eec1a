"""Every curl command the server prints — in a message, in ``next``, in a
nap's ``prompt``, in a refusal — runs exactly as printed through /bin/sh
against the real server, and so do the commands its answer prints in turn.
An agent without the client meets only these."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.live import CLI_TIMEOUT, Http

FILL = {"<your line>": "a summary the test wrote", "<one line>": "a memory the test wrote"}
CURL = re.compile(r"curl -s [^\n]*")


def strings(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for v in node.values() for s in strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in strings(v)]
    return []


class Agent:
    """Runs what the server asks, as printed, last command first (a refused
    wake says: do the nap below, then wake again: ...)."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env = env
        self.cwd = cwd
        self.ran: list[str] = []

    def follow(self, answer: object, depth: int = 0) -> None:
        assert depth < 60, "the printed commands did not come to an end"
        commands = [c for s in strings(answer) for c in CURL.findall(s)]
        for command in reversed(commands):
            line = command
            for placeholder, value in FILL.items():
                line = line.replace(placeholder, value)
            assert "<" not in line, command
            done = subprocess.run(["/bin/sh", "-c", line], cwd=self.cwd, env=self.env, capture_output=True,
                                  text=True, timeout=CLI_TIMEOUT)
            assert done.returncode == 0, (command, done.stderr)
            body = json.loads(done.stdout)
            assert "error" not in body, (command, body)
            self.ran.append(re.sub(r"'.*'", "'…'", command))
            self.follow(body, depth + 1)


def test_every_command_the_server_prints_runs_as_printed(http: Http, base_url: str, token: str,
                                                         tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.fail("curl is needed: the server's instructions are curl commands")
    agent = Agent({"PATH": "/usr/bin:/bin", "STASH_URL": base_url, "STASH_TOKEN": token}, tmp_path)
    agent.follow(http.ok("GET", "/wake", token))  # empty: how to record the first memory
    agent.follow(http.ok("POST", "/note", token, json={"text": "second"}))  # the nap of 0-1
    for k in range(5):
        agent.follow(http.ok("POST", "/note", token, json={"text": f"note {k}"}))
    http.ok("POST", "/config", token, json={"PART_LINES": 2})
    agent.follow(http.ok("GET", "/wake", token))  # next, part after part
    http.ok("POST", "/config", token, json={"PART_LINES": None, "WAKE_LINES": 2})
    for k in range(3):
        http.ok("POST", "/note", token, json={"text": f"unsettled {k}"})
    refusal = http.get("/wake", token)
    assert refusal.status_code == 409
    agent.follow(refusal.json())  # the nap below, then wake again
    assert http.ok("GET", "/wake", token)["awake"]
    kinds = {re.search(r"\$STASH_URL/(\w+)", c).group(1) for c in agent.ran}
    assert kinds == {"note", "nap", "wake"}, agent.ran
    assert any("part=" in c for c in agent.ran)
