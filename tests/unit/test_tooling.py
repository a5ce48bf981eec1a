"""Tooling that must not trap a contributor (issue 30 item 22): CI keeps its
own venv and runs the README's test command, one local check command runs
the four checks, and the stricter settings stay on."""

from __future__ import annotations

import re
import tomllib

from tests.support.server import REPO


def read(path: str) -> str:
    return (REPO / path).read_text(encoding="utf-8")


def readme_test_command() -> str:
    quickstart = read("README.md").split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)\n```", quickstart, re.S)[1]


def test_ci_never_deletes_the_contributors_venv_and_runs_the_readmes_command() -> None:
    run = read(".ci/run")
    assert not re.search(r"rm -rf\s+\.venv\b", run)
    # A venv made fresh outside the checkout (and removed when CI ends), so the package under test is the one pip
    # installed there (tests/support/installed.py).
    assert 'VENV="$(mktemp -d ' in run and """trap 'rm -rf "$(dirname "$VENV")"' EXIT""" in run
    last = run.strip().splitlines()[-1]
    # The README's command, each step of it, with CI's venv for .venv (mypy and refgen --check added).
    for step in readme_test_command().split(" && "):
        assert (
            step.replace(".venv/", '"$VENV/')
            .replace("/bin/pip", '/bin/pip"')
            .replace("/bin/python", '/bin/python"')
            .replace("python3 -m venv .venv", 'python3 -m venv "$VENV"')
            in last
        ), step
    # Not editable: what the tests run is the wheel built from the checkout, as a user's install is.
    assert "pip install '.[test]'" in readme_test_command() and " -e " not in readme_test_command()


def test_one_local_check_command_runs_the_four_checks() -> None:
    check = REPO / ".ci" / "check"
    assert check.stat().st_mode & 0o111
    text = check.read_text(encoding="utf-8")
    for piece in ("-m ruff check .", "-m mypy", "-m stash.web.refgen --check", '-m pytest -m "not slow"'):
        assert piece in text, piece
    assert ".ci/check" in read("CONTRIBUTING.md") and ".ci/check" in read("README.md")


def test_strict_settings_stay_on() -> None:
    project = tomllib.loads(read("pyproject.toml"))
    assert "--strict-markers" in project["tool"]["pytest"]["ini_options"]["addopts"]
    mypy = project["tool"]["mypy"]
    assert mypy["warn_unreachable"] is True and mypy["strict"] is True
    assert {"stash", "tests"} <= set(mypy["files"])
    # Only the tests are let off annotations, and their bodies are still checked.
    relaxed = [o for o in mypy["overrides"] if False in o.values()]
    assert [o["module"] for o in relaxed] == [["tests.*"]]
    assert relaxed[0]["check_untyped_defs"] is True


def test_the_clients_all_is_what_the_package_uses_of_it() -> None:
    from stash import client

    used = set()
    for path in (REPO / "stash" / "cli").glob("*.py"):
        used |= set(re.findall(r"\bclient\.([A-Za-z_]\w*)\(?", path.read_text(encoding="utf-8")))
        used |= {
            n.strip()
            for m in re.findall(r"from \.\.client import ([\w, ]+)", path.read_text(encoding="utf-8"))
            for n in m.split(",")
        }
    used -= {"py"}  # "client.py" in prose
    assert used <= set(client.__all__), used - set(client.__all__)
    assert not [name for name in client.__all__ if name.startswith("_")]
    assert all(hasattr(client, name) for name in client.__all__)


def test_no_test_module_imports_another() -> None:
    # What tests share lives in tests/support/ (server.py, api.py, files/, ops/, docs/, mcp/), never in a
    # test module, whose collection would then run twice over or break with its neighbour.
    offenders = []
    for path in (REPO / "tests").rglob("test_*.py"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if re.match(r"\s*(from|import) tests(\.\w+)*\.test_\w+", line):
                offenders.append(f"{path.relative_to(REPO)}: {line.strip()}")
    assert offenders == []
