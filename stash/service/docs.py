"""The documents the server serves about itself: the skill (``GET /skill``)
and the API reference (``GET /reference``), so an agent that has only the
AGENTS.md block can read the whole protocol from the server it talks to
(docs/DESIGN.md, "HTTP surface"). Installed wheels carry both inside the package; a source checkout
has them in the repository."""

from __future__ import annotations

from functools import cache
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_PACKAGE = _HERE.parent
_REPO = _PACKAGE.parent


def _read(*candidates: Path) -> str:
    for path in candidates:
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise RuntimeError(f"{candidates[0].name} is missing from the installation")


@cache
def skill() -> str:
    """skill/SKILL.md, as the server serves it at ``GET /skill``."""
    return _read(_PACKAGE / "skill" / "SKILL.md", _REPO / "skill" / "SKILL.md")


@cache
def reference() -> str:
    """API-REFERENCE.md, as the server serves it at ``GET /reference``."""
    return _read(_PACKAGE / "API-REFERENCE.md", _REPO / "API-REFERENCE.md")
