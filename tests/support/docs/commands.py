"""Reading the documents (API-REFERENCE.md, skill/) and the commands they print: which route a curl command
calls, which verb a ``stash`` command names. Shared by the tests that hold
API-REFERENCE.md and skill/ to the server."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from stash.web.routes import ROUTES
from tests.support.docs.printed import DELIMITER, commands

REFERENCE = Path(__file__).resolve().parents[3] / "API-REFERENCE.md"
SKILL_DIR = Path(__file__).resolve().parents[3] / "skill"
SKILL = SKILL_DIR / "SKILL.md"
AGENTS = SKILL_DIR / "AGENTS.md"


def reference() -> str:
    assert REFERENCE.is_file(), f"{REFERENCE.name} is missing: the design says shapes are written down there"
    return REFERENCE.read_text(encoding="utf-8")


def indented_commands(doc: str) -> list[str]:
    """The commands of the document: its indented code lines that start
    with curl or stash, each with the lines of its quoted here-document
    through the closing delimiter, as one text."""
    return commands(
        doc.splitlines(), lambda line: line.strip() if re.match(r"^ {4,}(curl|stash) ", line) else None, str.strip
    )


def without_heredoc(text: str) -> str:
    """``text`` with the lines of each quoted here-document left out: they
    are data, not shell."""
    out, inside = [], False
    for line in text.split("\n"):
        if inside:
            inside = line != DELIMITER
            continue
        out.append(line)
        inside = line.endswith(f"<<'{DELIMITER}'")
    return "\n".join(out)


def curl_calls(text: str) -> list[tuple[str, str]]:
    """(method, path) of every curl command in ``text``, read as curl reads
    its arguments: -X names the method, else -d makes it POST, else GET."""
    calls = []
    for command in re.split(r"&&|;|\n", without_heredoc(text)):
        if not command.lstrip().startswith("curl "):
            continue  # another program's line, which may hold a ; inside its quotes
        words = shlex.split(command.split(" <<'")[0])
        method = "POST" if "-d" in words or "--data-binary" in words else "GET"
        if "-X" in words:
            method = words[words.index("-X") + 1]
        urls = [w for w in words if w.startswith("$STASH_URL")]
        assert len(urls) == 1, command
        path = urls[0].removeprefix("$STASH_URL").split("?")[0] or "/"
        calls.append((method, path))
    return calls


def route_of(method: str, path: str) -> tuple[str, str] | None:
    """The route of ROUTES a request for ``method path`` reaches, if any."""
    for r in ROUTES:
        pattern = "^" + re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(r.path)) + "$"
        if r.method == method and re.match(pattern, path):
            return r.method, r.path
    return None
