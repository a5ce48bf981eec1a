"""One version in one place (issue 30 item 2): ``stash.__version__`` is the
only declaration, pyproject.toml reads it, and CHANGELOG.md's newest release
is that version, with its link reference."""

from __future__ import annotations

import re
import tomllib

from stash import __version__
from tests.support.server import REPO


def test_pyproject_reads_the_version_from_the_package() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["hatch"]["version"]["path"] == "stash/__init__.py"


def test_the_changelogs_newest_release_is_the_version() -> None:
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", text, re.M)
    assert releases and releases[0] == __version__
    assert f"\n[{__version__}]: #" in text


def test_health_answers_that_version(api) -> None:
    ans = api.get("/health")
    assert ans.status_code == 200 and ans.json()["version"] == __version__
