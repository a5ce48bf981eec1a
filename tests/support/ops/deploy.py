"""What the deploy tests share: where deploy/ is, the installed paths its
units name, a reader of unit files, and the tools that check them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


CADDY_START_TIMEOUT = 30.0
CADDY_STOP_TIMEOUT = 10.0


@contextmanager
def caddy_running(config: str, folder: Path, up: Callable[[], bool]) -> Iterator[subprocess.Popen[bytes]]:
    """A real Caddy on ``config`` (a Caddyfile), in ``folder`` with an
    environment of its own, once ``up()`` says it answers; stopped at exit."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "Caddyfile"
    path.write_text(config, encoding="utf-8")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(folder),
        "XDG_DATA_HOME": str(folder / "data"),
        "XDG_CONFIG_HOME": str(folder / "config"),
    }
    log = folder / "caddy.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [tool("caddy"), "run", "--adapter", "caddyfile", "--config", str(path)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=folder,
        )
    try:
        deadline = time.monotonic() + CADDY_START_TIMEOUT
        while not up():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.05)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=CADDY_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=CADDY_STOP_TIMEOUT)
