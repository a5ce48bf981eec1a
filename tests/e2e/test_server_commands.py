"""Every curl command the server prints — in a text answer's ``Run:``
lines, in a nap's prompt, in a refusal — runs exactly as printed through
/bin/sh against the real server, and so do the commands its answer prints in
turn. An agent without the client meets only these."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.api import matched
from tests.support.docs.printed import orders
from tests.support.server import CLI_TIMEOUT, Http

FILL = {"<your line>": "a summary the test wrote", "<one line>": "a memory the test wrote"}
TEXT = {"Accept": "text/plain"}


class Agent:
    """Runs what the server asks, as printed, in the order printed; an order
    offered as an alternative (after a line starting ``Or``) is left."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env = env
        self.cwd = cwd
        self.ran: list[str] = []

    def follow(self, text: str, depth: int = 0) -> None:
        assert depth < 60, "the printed commands did not come to an end"
        lines = text.splitlines()
        chosen = [c for c in orders(text) if not lines[lines.index("Run: " + c.split("\n")[0]) - 1].startswith("Or ")]
        for command in chosen:
            line = command
            for placeholder, value in FILL.items():
                line = line.replace(placeholder, value)
            assert re.search(r"<[a-z][a-z -]*>", line) is None, command
            done = subprocess.run(
                ["/bin/sh", "-c", line], cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=CLI_TIMEOUT
            )
            assert done.returncode == 0 and done.stderr == "", (command, done.stderr)
            self.ran.append(command)
            self.follow(done.stdout, depth + 1)


def test_every_command_the_server_prints_runs_as_printed(http: Http, base_url: str, token: str, tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.fail("curl is needed: the server's instructions are curl commands")
    agent = Agent({"PATH": "/usr/bin:/bin", "STASH_URL": base_url, "STASH_TOKEN": token}, tmp_path)

    def text(method: str, path: str, **kw) -> str:
        return http.send(method, base_url + path, {"Authorization": f"Bearer {token}", **TEXT}, **kw).text

    agent.follow(text("GET", "/wake"))  # empty: how to record the first memory
    agent.follow(text("POST", "/note", json={"text": "second"}))  # the nap of 0-1
    for k in range(5):
        agent.follow(text("POST", "/note", json={"text": f"note {k}"}))
    http.ok("POST", "/config", token, json={"PART_LINES": 2})
    agent.follow(text("GET", "/wake"))  # next, part after part
    http.ok("POST", "/config", token, json={"PART_LINES": None, "WAKE_LINES": 2})
    for k in range(3):
        http.ok("POST", "/note", token, json={"text": f"unsettled {k}"})
    refusal = http.send("GET", base_url + "/wake", {"Authorization": f"Bearer {token}", **TEXT})
    assert refusal.status_code == 409 and refusal.headers["stash-error"] == "wake.needs_nap"
    agent.follow(refusal.text)  # the nap below, then wake again
    assert http.ok("GET", "/wake", token)["awake"]
    kinds = {matched(re.search(r"\$STASH_URL/(\w+)", c)).group(1) for c in agent.ran}
    assert kinds == {"note", "nap", "wake"}, agent.ran
    # A next part is fetched by the POST twin of /wake, and no command carries a query string.
    assert any(""""$STASH_URL/wake" -d '{"part": """ in c for c in agent.ran)
    assert not any("?" in c for c in agent.ran)
