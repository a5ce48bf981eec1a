"""Documents that restate code, held to it (issue 30): CLIENT.md's MCP tool
table names each tool's parameters as stash/tools/definitions.py declares them."""

from __future__ import annotations

import re

from stash.tools.definitions import TOOLS as DECLARED
from tests.support.server import REPO

TOOLS = ("wake", "note", "nap", "recall", "zoom", "forget")


def declared_tool_parameters() -> dict[str, list[str]]:
    return {name: list(tool.arguments) for name, tool in DECLARED.items()}


def documented_tool_parameters() -> dict[str, list[str]]:
    text = (REPO / "stash" / "CLIENT.md").read_text(encoding="utf-8")
    table = text.split("| tool | parameters | HTTP | hints |", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = re.findall(r"(?:^|, )`(\w+)` \(", cells[1])
    return rows


def test_clientmds_mcp_table_names_every_parameter_of_every_tool() -> None:
    declared = declared_tool_parameters()
    assert sorted(declared) == sorted(TOOLS)
    assert documented_tool_parameters() == declared


def readme() -> str:
    return (REPO / "README.md").read_text(encoding="utf-8")


def test_the_readme_says_the_first_session_needs_a_second_terminal_and_shows_port() -> None:
    text = readme()
    quickstart = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    first = text.split("## A first session", 1)[1].split("\n## ", 1)[0]
    assert "--port" in quickstart
    assert "second terminal" in first.split("```", 1)[0] or "second one" in quickstart


def test_the_readmes_quickstart_prose_has_no_sentence_over_60_words() -> None:
    quickstart = readme().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    prose = re.sub(r"```.*?```", "", quickstart, flags=re.S)
    sentences = re.split(r"(?<=[.:])\s+(?=[A-Z*`(-])|\n\s*\n|\n- ", prose)
    longest = max(sentences, key=lambda s: len(s.split()))
    assert len(longest.split()) <= 60, longest


def test_restore_fails_when_it_restored_nobody_or_skipped_anyone() -> None:
    from stash.cli.operate import INCOMPLETE
    from stash.cli.replicate import restore_status

    assert restore_status(3, 0, 0) == 0
    assert restore_status(0, 0, 4) == INCOMPLETE != 0  # the quickstart folder's SQLCipher stores, all skipped
    assert restore_status(2, 0, 1) == INCOMPLETE
    assert restore_status(0, 0, 0) == INCOMPLETE
    assert restore_status(2, 1, 1) == 1


def test_contributing_has_a_debugging_section_that_names_stash_debug() -> None:
    text = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = text.split("## Debugging\n", 1)[1].split("\n## ", 1)[0]
    from stash.web.tracelog import DEBUG_ENV

    assert f"{DEBUG_ENV}=1" in section and "tests/support/server.py" in section and "stash/web/tracelog.py" in section
    assert (REPO / "stash" / "web" / "tracelog.py").is_file()


def test_designs_code_map_names_only_modules_that_exist_and_every_section() -> None:
    text = (REPO / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    code_map = text.split("\n## Code map\n", 1)[1].split("\n## ", 1)[0]
    for path in set(re.findall(r"`((?:stash/)?[a-z_/]+\.py)`", code_map)):
        candidates = [
            REPO / path,
            REPO / "stash" / path,
            REPO / "stash" / "web" / path,
            REPO / "stash" / "storage" / "memfile" / path,
        ]
        assert any(c.is_file() for c in candidates), path
    sections = [s for s in re.findall(r"^## (.+)$", text, re.M) if s != "Code map"]
    table = code_map.split("### Which module holds each section", 1)[1].split("###", 1)[0]
    named = {
        name.strip() for row in table.splitlines()[3:] if row.startswith("|") for name in row.split("|")[1].split(",")
    }
    assert set(sections) <= named, set(sections) - named
    assert "POST /note" in code_map and "userlock" in code_map and "pool" in code_map
