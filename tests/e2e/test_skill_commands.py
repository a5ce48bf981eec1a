"""Every command of skill/SKILL.md runs against a real ``stash serve``: the
curl forms in order on one memory, the ``stash`` forms in order on another
(each form is a whole walk through the protocol; run interleaved, the second
``forget`` would find nothing left to drop), both memories in the state the
examples speak of — 64 memories, every summary written, wake parts of 40
lines, so ``wake?part=2&T=64`` and ``zoom 32-63`` mean something."""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path

import pytest

from tests.support.docs.commands import SKILL, indented_commands
from tests.support.server import CLI_TIMEOUT, Http, path_with

pytestmark = pytest.mark.slow

FILL = {
    "<one line>": "a memory from the skill example",
    "<your line for 0-1>": "a summary from the skill example",
    "<your line>": "a summary from the skill example",
    "<regex>": "deploy|rollback",
    "<the same regex>": "deploy",
    "<lo-hi>": "32-63",
    "YYYY-MM-DD": dt.datetime.now(dt.UTC).date().isoformat(),
}


def prepared(http: Http) -> str:
    token = http.init()["token"]
    entries = [{"date": "2024-03-01", "text": f"deploy number {k} went fine"} for k in range(64)]
    http.ok("POST", "/import", token, json={"entries": entries})
    nap = http.ok("POST", "/nap", token, json={})["nap"]
    while nap is not None:
        nap = http.ok("POST", "/nap", token, json={"block": nap["block"], "text": f"sum {nap['block']}"})["nap"]
    http.ok("POST", "/config", token, json={"PART_LINES": 40})
    assert http.ok("GET", "/wake", token)["parts"] == 2
    return token


@pytest.mark.parametrize("form", ["curl", "stash"])
def test_skill_commands_run_as_printed(form: str, http: Http, base_url: str, client_file: Path, tmp_path: Path) -> None:
    commands = [c for c in indented_commands(SKILL.read_text(encoding="utf-8")) if c.startswith(form + " ")]
    assert len(commands) >= 8
    token = prepared(http)
    # The file the skill's batch example tells the agent to write, one "BLOCK LINE" per block.
    (tmp_path / "summaries.txt").write_text("0-1 a summary from the skill example\n", encoding="utf-8")
    # The file the skill's file-form import names: dated today, so it comes after every memory noted.
    today = dt.datetime.now(dt.UTC).date().isoformat()
    (tmp_path / "memories.txt").write_text(f"{today} imported from the skill's file example\n", encoding="utf-8")
    env = {
        "PATH": path_with(client_file.parent),
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "STASH_URL": base_url,
        "STASH_TOKEN": token,
    }
    for command in commands:
        line = command
        for placeholder, value in FILL.items():
            line = line.replace(placeholder, value)
        done = subprocess.run(
            ["/bin/sh", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT
        )
        # The skill's nap examples name blocks this memory settled already: they save nothing, and the
        # client says so by its status (1, "nothing was saved").
        answered = done.returncode == 1 and "nothing was saved" in done.stderr and "already settled" in done.stdout
        assert done.returncode == 0 or answered, (command, done.stdout, done.stderr)
        if form == "curl" and " -o " not in line:
            # curl -s exits 0 on a refusal too: the plain-text answer must not be an error's
            assert done.stdout, command
            assert '-H "Accept: text/plain"' in command or "/skill" in command
        assert token not in done.stdout + done.stderr
    # the walk did what it says: its note and its import are in the log, and 32-63 was forgotten
    assert http.ok("POST", "/recall", token, json={"q": "memory from the skill example"})["total"] == 2
    assert http.ok("GET", "/zoom?block=0-63", token)["lines"][1] == "#32-63 not compressed yet"
