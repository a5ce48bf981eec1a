"""Every install line of the docs works as printed (issue 12 item 10): the
distribution is not on the public index (where ``stash-memory`` belongs to
an unrelated project), so no document installs Stash from it, and the line
``stash mcp`` prints when its extra is missing installs exactly that extra's
requirement."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from stash.cli import mcp_server

REPO = Path(__file__).resolve().parents[2]
DOCS = [
    REPO / "README.md",
    REPO / "API-REFERENCE.md",
    REPO / "deploy" / "README.md",
    REPO / "bench" / "README.md",
    REPO / "skill" / "SKILL.md",
    REPO / "SECURITY.md",
    REPO / "stash" / "CLIENT.md",
]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def install_targets(text: str) -> list[str]:
    """What each ``pip install`` line installs (its last argument)."""
    out = []
    for m in re.finditer(r"pip install ([^\n`#&;]+)", text):
        words = [w for w in m.group(1).split() if not w.startswith("-")]
        if words:
            out.append(words[-1].strip("'\""))
    return out


def test_no_document_installs_stash_from_the_index() -> None:
    name = PROJECT["name"]
    targets = [t for doc in DOCS for t in install_targets(doc.read_text(encoding="utf-8"))]
    assert targets
    for target in targets:
        base = re.split(r"[\[<>=! ]", target, maxsplit=1)[0]
        # A path (., ./x, /usr/local/src/stash) or a requirement that is not Stash's own name.
        assert base.startswith((".", "/")) or base not in (name, "stash-memory", "stash"), target


def test_the_mcp_hint_installs_the_extras_own_requirement() -> None:
    (req,) = PROJECT["optional-dependencies"]["mcp"]
    assert mcp_server.INSTALL == f"pip install '{req}'"
