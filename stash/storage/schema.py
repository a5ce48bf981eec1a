"""Loads ``schema.sql``, the one schema the server runs."""

from __future__ import annotations

from functools import cache
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# Installed wheels carry the file inside the package; a source checkout has it
# at the top of the repository.
_CANDIDATES = (_HERE.parent / "schema.sql", _HERE.parent.parent / "schema.sql")


@cache
def sections() -> dict[str, str]:
    """The named parts of schema.sql, split at its ``-- @name`` lines."""
    for path in _CANDIDATES:
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            break
    else:
        raise RuntimeError("schema.sql is missing from the installation")
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("-- @"):
            current = out.setdefault(line[4:].strip(), [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines) for name, lines in out.items()}
