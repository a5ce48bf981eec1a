"""The documents the server serves about itself: the skill (``GET /skill``)
and the API reference (``GET /reference``), so an agent that has only the
AGENTS.md block can read the whole protocol from the server it talks to
(docs/DESIGN.md, "HTTP surface")."""

from __future__ import annotations

from .. import package_data


def skill() -> str:
    """skill/SKILL.md, as the server serves it at ``GET /skill``."""
    return package_data.read_text("skill/SKILL.md")


def reference() -> str:
    """API-REFERENCE.md, as the server serves it at ``GET /reference``."""
    return package_data.read_text("API-REFERENCE.md")
