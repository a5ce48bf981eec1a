"""skill/: SKILL.md teaches the whole protocol with commands that name real
routes and verbs and hold no secret; AGENTS.md is, to the byte, the block
``POST /init`` answers as ``prompt`` with the address filled in.
(tests/e2e/test_skill_commands.py runs SKILL.md's commands against a server.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stash import client
from stash.cli.main import HOST_VERBS
from stash.crypto import tokens
from tests.support.api import Api
from tests.support.docs.commands import AGENTS, SKILL, curl_calls, indented_commands, route_of


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize("url", ["https://stash.example", "http://127.0.0.1:8080"])
def test_init_prompt_is_agents_md_with_the_address(api: Api, url: str) -> None:
    expected = text(AGENTS).replace("{url}", url)
    resp = api.post("/init", json={"url": url})
    assert resp.status_code == 201 and resp.json()["prompt"] == expected


def test_init_prompt_without_a_url_names_the_address_it_was_called_at(api: Api) -> None:
    assert api.post("/init").json()["prompt"] == text(AGENTS).replace("{url}", "http://stash.test")


def test_agents_md_has_one_placeholder_and_no_secret() -> None:
    block = text(AGENTS)
    assert re.findall(r"\{(\w+)\}", block) == ["url"]
    assert "{{" not in block and "}}" not in block  # the file reads exactly as the block an agent gets
    assert not re.search(tokens.TOKEN_PATTERN, block) and "stash1_" not in block
    for line in block.splitlines():
        assert len(line) < 140 or line.startswith("    curl "), line


@pytest.mark.parametrize("path", [SKILL, AGENTS], ids=lambda p: p.name)
def test_every_command_names_a_real_route_or_verb(path: Path) -> None:
    doc = text(path)
    commands = indented_commands(doc)
    assert commands
    for command in commands:
        if command.startswith("curl "):
            for method, route in curl_calls(command):
                assert route_of(method, route), f"{path.name}: {command} calls no route of the server"
        else:
            verb = command.split()[1]
            assert verb in client.VERBS or verb in HOST_VERBS, f"{path.name}: {command} names no verb of stash"
    # Commands written inline, in backticks: `stash VERB ...` and `METHOD /path`.
    for verb in re.findall(r"`stash (?:--json )?([a-z-]+)", doc):
        assert verb in client.VERBS or verb in HOST_VERBS, f"{path.name}: stash {verb}"
    for method, route in re.findall(r"`(GET|POST|DELETE) (/[^` ]*)", doc):
        assert route_of(method, route), f"{path.name}: {method} {route}"


def test_skill_md_holds_no_secret_and_says_it() -> None:
    doc = text(SKILL)
    assert not re.search(tokens.TOKEN_PATTERN, doc) and "stash1_" not in doc
    assert "$STASH_TOKEN" in doc and "no secret" in doc


def test_skill_md_is_a_skill_and_teaches_every_rule() -> None:
    doc = text(SKILL)
    front = re.match(r"---\nname: stash\ndescription: (.+)\n---\n", doc)
    assert front and len(front.group(1)) < 1024
    rules = {
        "wake first": "before any other tool call",
        "read to the end": "to the end",
        "note lasting effect": "lasting effect",
        "one line": "into one line",
        "no dates in the text": "No date in the text",
        "answer every nap first": "answer every compression before your next action",
        "recall": "stash recall",
        "zoom": "stash zoom",
        "forget a bad summary": "Forget a bad summary",
        "a subagent never writes": "A subagent never calls Stash",
        "both forms": "Every operation has two equivalent forms",
    }
    missing = [rule for rule, words in rules.items() if words.lower() not in doc.lower()]
    assert missing == []
    # every protocol call comes in both forms
    commands = indented_commands(doc)
    for verb in ("wake", "note", "nap", "recall", "zoom", "forget"):
        assert any(c.startswith(f"stash {verb}") for c in commands), verb
        assert any(
            route_of(m, p) and p == f"/{verb}" for c in commands if c.startswith("curl ") for m, p in curl_calls(c)
        ), verb
