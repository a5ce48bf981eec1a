"""deploy/stash-replicated.conf, the drop-in that turns a host into a
replicated one: systemd accepts stash.service with it, and the one setting it
adds is what `stash serve` reads as --replicate, which makes new stores plain
files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from stash.cli import serve
from tests.support.ops.deploy import DEPLOY, TOOL_TIMEOUT, UNIT_BINARY, stash_executable, tool

DROP_IN = DEPLOY / "stash-replicated.conf"


def drop_in_environment() -> dict[str, str]:
    out = {}
    for line in DROP_IN.read_text(encoding="utf-8").splitlines():
        if line.startswith("Environment="):
            name, value = line.removeprefix("Environment=").split("=", 1)
            out[name] = value
    return out


def test_the_unit_with_the_drop_in_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """systemd reads a drop-in's [Service] lines as if they ended the unit's
    own section: verified that way, with the binary pointed at this machine's."""
    unit = (DEPLOY / "stash.service").read_text(encoding="utf-8").replace(UNIT_BINARY, str(stash_executable()))
    head, install = unit.split("\n[Install]\n")
    extra = DROP_IN.read_text(encoding="utf-8").split("[Service]\n", 1)[1]
    (tmp_path / "stash.service").write_text(f"{head}\n{extra}\n[Install]\n{install}", encoding="utf-8")
    res = subprocess.run(
        [tool("systemd-analyze"), "verify", str(tmp_path / "stash.service")],
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        cwd=tmp_path,
    )
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), (res.stdout, res.stderr)


def test_the_drop_in_turns_on_replication_and_plain_files(tmp_path: Path) -> None:
    env = drop_in_environment()
    assert set(env) == {"STASH_REPLICATE"}
    settings_file = tmp_path / "replica.json"
    settings_file.write_text(
        json.dumps(
            {
                "type": "sftp",
                "host": "203.0.113.20:22",
                "user": "stash",
                "key-path": "/etc/stash/replica_key",
                "path": "/srv/replica/host-a",
            }
        )
    )
    args = serve.parse([], {"STASH_REPLICATE": str(settings_file)})
    settings = serve.settings_from(args, {})
    assert settings.replicate == str(settings_file) and settings.file_cipher == "none"
    refused = serve.parse(["--file-cipher", "sqlcipher"], {"STASH_REPLICATE": str(settings_file)})
    try:
        serve.settings_from(refused, {})
    except serve.ConfigError as e:
        assert "--file-cipher none" in str(e)
    else:
        raise AssertionError("--replicate with --file-cipher sqlcipher was accepted")
