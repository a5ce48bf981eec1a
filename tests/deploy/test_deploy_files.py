"""The files in deploy/ are accepted by the tools that will read them: the
systemd units by `systemd-analyze verify`, the Caddyfile by `caddy validate`,
and the Dockerfile has the properties deploy/README.md promises (the image is
not built here: there is no Docker daemon on the CI host)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from stash import package_data
from stash.cli import serve
from tests.support.api import matched
from tests.support.ops.deploy import (
    DEPLOY,
    REPO,
    TOOL_TIMEOUT,
    UNIT_BACKUP_SCRIPT,
    UNIT_BINARY,
    UNITS,
    directives,
    stash_executable,
    tool,
)

# ---------------------------------------------------------------- systemd


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    """The units as shipped, with only the installed paths pointed at real
    files of this machine (verify checks that ExecStart's binary exists)."""
    backup_script = DEPLOY / "stash-backup.sh"
    for name in UNITS:
        text = (DEPLOY / name).read_text(encoding="utf-8")
        text = text.replace(UNIT_BINARY, str(stash_executable())).replace(UNIT_BACKUP_SCRIPT, str(backup_script))
        (tmp_path / name).write_text(text, encoding="utf-8")
    res = subprocess.run(
        [tool("systemd-analyze"), "verify", *(str(tmp_path / n) for n in UNITS)],
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        cwd=tmp_path,
    )
    # verify only warns about an unknown directive or a misspelt filter group: any output is a failure.
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), (res.stdout, res.stderr)


def test_verify_catches_a_misspelt_directive(tmp_path: Path) -> None:
    """The check above can fail: a typo in the sandbox is reported."""
    text = (DEPLOY / "stash.service").read_text(encoding="utf-8").replace(UNIT_BINARY, str(stash_executable()))
    (tmp_path / "stash.service").write_text(text.replace("NoNewPrivileges=", "NoNewPrivilege="), encoding="utf-8")
    res = subprocess.run(
        [tool("systemd-analyze"), "verify", str(tmp_path / "stash.service")],
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        cwd=tmp_path,
    )
    assert "NoNewPrivilege" in res.stderr


def test_the_server_unit_is_sandboxed() -> None:
    d = directives("stash.service")
    expected = {
        "NoNewPrivileges": "yes",
        "PrivateTmp": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "CapabilityBoundingSet": "",
        "MemoryDenyWriteExecute": "yes",
        "StateDirectory": "stash",
        "ReadWritePaths": "/var/lib/stash",
        "SystemCallFilter": "@system-service",
        "User": "stash",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
    }
    for key, value in expected.items():
        assert d.get(key) == [value], (key, d.get(key))
    argv = d["ExecStart"][0].split()
    assert argv[:2] == [UNIT_BINARY, "serve"]
    # The server listens on loopback only and believes only the local proxy.
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--data") + 1] == "/var/lib/stash"
    proxies = [argv[i + 1] for i, a in enumerate(argv) if a == "--trusted-proxy"]
    assert sorted(proxies) == ["127.0.0.1", "::1"]


def test_the_backup_unit_runs_stash_backup_on_a_timer() -> None:
    d = directives("stash-backup.service")
    assert d["ExecStart"] == [UNIT_BACKUP_SCRIPT]
    assert d["Type"] == ["oneshot"] and d["User"] == ["stash"]
    assert "/var/backups/stash" in d["ReadWritePaths"][0].split()
    script = (DEPLOY / "stash-backup.sh").read_text(encoding="utf-8")
    assert re.search(r'"\$stash" backup ', script) and re.search(r'"\$stash" verify ', script)
    res = subprocess.run(
        ["sh", "-n", str(DEPLOY / "stash-backup.sh")], capture_output=True, text=True, timeout=TOOL_TIMEOUT
    )
    assert res.returncode == 0, res.stderr
    timer = directives("stash-backup.timer", "Timer")
    assert timer["OnCalendar"] and timer["Persistent"] == ["true"]


# ---------------------------------------------------------------- Caddy


def caddy_validate(path: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool("caddy"), "validate", "--adapter", "caddyfile", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        cwd=cwd,
    )


def test_caddyfile_validates(tmp_path: Path) -> None:
    """`caddy validate` builds the whole config, automatic HTTPS included,
    without contacting a certificate authority."""
    res = caddy_validate(DEPLOY / "Caddyfile", tmp_path)
    assert res.returncode == 0, res.stderr
    assert "Valid configuration" in res.stdout + res.stderr
    assert '"level":"warn"' not in res.stderr and '"level":"error"' not in res.stderr, res.stderr


def test_caddy_validate_can_fail(tmp_path: Path) -> None:
    broken = (DEPLOY / "Caddyfile").read_text(encoding="utf-8").replace("reverse_proxy", "reverse_proxx")
    (tmp_path / "Caddyfile").write_text(broken, encoding="utf-8")
    assert caddy_validate(tmp_path / "Caddyfile", tmp_path).returncode != 0


def test_caddy_proxies_to_the_units_address() -> None:
    caddy = (DEPLOY / "Caddyfile").read_text(encoding="utf-8")
    argv = directives("stash.service")["ExecStart"][0].split()
    upstream = f"{argv[argv.index('--host') + 1]}:{argv[argv.index('--port') + 1]}"
    assert re.search(rf"^\s*reverse_proxy {re.escape(upstream)}\s*$", caddy, re.M), upstream
    # No access log: Caddy's would record query strings, and a recall query is memory text.
    assert not re.search(r"^\s*log\b", caddy, re.M)


# ---------------------------------------------------------------- Docker


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuations joined."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text(encoding="utf-8"))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_properties() -> None:
    steps = dockerfile()
    froms = [a for i, a in steps if i == "FROM"]
    assert froms and all(a.split()[0].startswith("python:3.11-slim") for a in froms), froms
    final = steps[max(n for n, (i, _) in enumerate(steps) if i == "FROM") :]
    args = {i: a for i, a in final}
    assert args["USER"] not in ("root", "0"), "the server must not run as root"
    assert args["VOLUME"] == '["/data"]'
    assert "STASH_DATA=/data" in args["ENV"] and "STASH_HOST=0.0.0.0" in args["ENV"]
    assert args["ENTRYPOINT"] == '["stash", "serve"]'
    health = args["HEALTHCHECK"]
    assert "/health" in health and "urllib.request" in health
    # The health check's Python is valid, and reads the port the server uses.
    code = matched(re.search(r'"-c", "(.*)"\]$', health)).group(1)
    compile(code, "HEALTHCHECK", "exec")
    assert "STASH_PORT" in code
    # The install step copies everything the package build needs.
    copied = " ".join(a for i, a in steps if i == "COPY")
    for needed in ("pyproject.toml", "README.md", "schema.sql", "skill", "stash"):
        assert needed in copied, needed


# ---------------------------------------------------------------- docs


# The options deploy/README.md walks an operator through (the needs of issue 6).
OPERATOR_FLAGS = (
    "--data",
    "--host",
    "--port",
    "--workers",
    "--url",
    "--trusted-proxy",
    "--init",
    "--max-body",
    "--max-import-body",
    "--user-id-prefix",
)


def test_every_serve_option_is_in_the_reference() -> None:
    """The reference of every option is deploy/README.md's section 7."""
    text = (DEPLOY / "README.md").read_text(encoding="utf-8").split("## 7. Reference", 1)[1]
    flags = [max(a.option_strings, key=len) for a in serve.parser()._actions if a.dest != "help"]
    missing = [f for f in flags if f"`{f}" not in text]
    assert missing == [], f"deploy/README.md's reference does not document {missing}"
    for rule in ("STASH_<OPTION>", "STASH_PUBLIC_URL"):
        assert rule in text


def test_the_deploy_guide_names_each_operator_option_and_its_variable() -> None:
    text = (DEPLOY / "README.md").read_text(encoding="utf-8")
    missing = [
        word
        for flag in OPERATOR_FLAGS
        for word in (f"`{flag}", serve.env_name(flag.lstrip("-").replace("-", "_")))
        if word not in text
    ]
    assert missing == [], f"deploy/README.md does not mention {missing}"


@pytest.mark.slow
def test_what_the_image_copies_builds_the_package(tmp_path: Path) -> None:
    """The build stage sees only its COPY sources (and Dockerfile.dockerignore
    lets only those through): from exactly those, the package builds, with the
    data files the server reads at run time (every one stash/package_data.py
    declares)."""
    ctx = tmp_path / "context"
    ctx.mkdir()
    for instruction, args in dockerfile():
        if instruction != "COPY" or args.startswith("--from"):
            continue
        *sources, _ = args.split()
        for src in sources:
            path = REPO / src
            if path.is_dir():  # links kept as links, as COPY keeps them: stash/skill -> ../skill must be copied too
                shutil.copytree(path, ctx / src, symlinks=True)
            else:
                shutil.copy2(path, ctx / src)
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), str(ctx)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    wheels = list((tmp_path / "dist").glob("*.whl"))
    assert len(wheels) == 1
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    assert sorted(f"stash/{name}" for name in package_data.FILES if f"stash/{name}" not in names) == []
    assert "stash/cli/serve.py" in names
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").split()
    for src in ("pyproject.toml", "README.md", "API-REFERENCE.md", "schema.sql", "skill/", "stash/"):
        assert f"!{src}" in ignore, src
