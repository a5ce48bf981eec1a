"""Loads ``schema.sql``, the one schema the server runs."""

from __future__ import annotations

from functools import cache

from ... import package_data


@cache
def sections() -> dict[str, str]:
    """The named parts of schema.sql, split at its ``-- @name`` lines."""
    text = package_data.read_text("schema.sql")
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("-- @"):
            current = out.setdefault(line[4:].strip(), [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines) for name, lines in out.items()}
