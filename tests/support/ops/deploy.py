"""What the deploy tests share: where deploy/ is, the installed paths its
units name, a reader of unit files, and the tools that check them."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
UNITS = ("stash.service", "stash-backup.service", "stash-backup.timer")
TOOL_TIMEOUT = 60

# The installed paths the units name, and what a test run points them at.
UNIT_BINARY = "/opt/stash/bin/stash"
UNIT_BACKUP_SCRIPT = "/usr/local/lib/stash/stash-backup"


def stash_executable() -> Path:
    """The `stash` console script installed beside this interpreter."""
    exe = Path(sys.executable).parent / "stash"
    assert exe.is_file(), f"no stash executable beside {sys.executable}: install the package into this environment"
    return exe


def unit_entries(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) for every assignment of a unit file, in order;
    a key may repeat, as systemd allows."""
    out, section = [], ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not an assignment: {line!r}"
        out.append((section, key.strip(), value.strip()))
    return out


def directives(name: str, section: str = "Service") -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for sec, key, value in unit_entries((DEPLOY / name).read_text(encoding="utf-8")):
        if sec == section:
            found.setdefault(key, []).append(value)
    return found


def tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed; .ci/run installs it (apt-get install {name})"
    return path
