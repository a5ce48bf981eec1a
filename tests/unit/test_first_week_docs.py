"""Documents that restate code, held to it (issue 30): CLIENT.md's MCP tool
table names each tool's parameters as stash/cli/mcp_server.py declares them."""

from __future__ import annotations

import ast
import re

from tests.live import REPO

TOOLS = ("wake", "note", "nap", "recall", "zoom", "forget")


def declared_tool_parameters() -> dict[str, list[str]]:
    tree = ast.parse((REPO / "stash" / "cli" / "mcp_server.py").read_text(encoding="utf-8"))
    build = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "build")
    return {fn.name: [a.arg for a in fn.args.args] for fn in build.body
            if isinstance(fn, ast.FunctionDef) and fn.name in TOOLS}


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
