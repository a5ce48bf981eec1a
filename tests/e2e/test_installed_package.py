"""The servers and clients under test are the installed package, as a user
runs it (README: ``pip install '.[test]'``, a wheel built from this checkout),
never the checkout's ``stash/`` folder (tests/support/installed.py); and what broke
only once installed holds there: an append capability is minted (its block,
skill/AGENTS-append.md, is in the wheel), a mint or an init whose block
cannot be made leaves nothing behind, and the typed library is typed for its
users (``py.typed``)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import stash
from tests.support.installed import imported_by, installed_folder
from tests.support.server import Cli, Http, Server, cli_env, path_with, python_bin


def stash_files_loaded(log: str) -> set[Path]:
    """The module files of a ``stash`` package (a top-level folder of that
    name with an ``__init__.py``, wherever it is) that a process run under
    PYTHONVERBOSE loaded: Python names each code object's file as it loads it."""
    loaded = {Path(p) for p in re.findall(r"^# code object from '(.+)'$", log, re.M)}
    return {
        p
        for p in loaded
        for top in p.parents
        if top.name == "stash" and (top / "__init__.py").is_file() and not (top.parent / "__init__.py").exists()
    }


def test_the_server_and_clients_under_test_import_the_installed_package(tmp_path: Path) -> None:
    want = installed_folder()
    # This process: what the in-process tests run.
    assert Path(stash.__file__).resolve().parent == want
    # A live server, started as every test starts one: each module file it loaded.
    server = Server(data=tmp_path / "data", log=tmp_path / "server.log", env={"PYTHONVERBOSE": "1"})
    with server.start():
        Http(server.url).ok("GET", "/health")
    loaded = stash_files_loaded(server.log_text())
    assert {"app", "agent", "serve"} <= {p.name.split(".")[0] for p in loaded}, len(loaded)
    assert [p for p in loaded if want not in p.resolve().parents] == []
    # The same recipe, asked directly; and the client as tests run it (python -m stash, in its own environment).
    assert imported_by([sys.executable], server.cwd, server.environment()) == want
    module = Cli([sys.executable], cli_env("http://127.0.0.1:9", None, path_with(python_bin(tmp_path / "bin"))))
    assert Path(module.ok("-c", "import stash; print(stash.__file__)").strip()).resolve().parent == want


def test_a_stray_copy_in_the_working_directory_is_what_the_guard_catches(tmp_path: Path) -> None:
    """The check above can fail: a server started where a ``stash`` folder
    stands (the checkout, as the tests once did) loads that copy."""
    shutil.copytree(installed_folder(), tmp_path / "stray" / "stash")
    server = Server(
        data=tmp_path / "data", log=tmp_path / "server.log", cwd=tmp_path / "stray", env={"PYTHONVERBOSE": "1"}
    )
    with server.start():
        pass
    loaded = stash_files_loaded(server.log_text())
    assert loaded and all(tmp_path / "stray" in p.parents for p in loaded)


@pytest.mark.parametrize("memory", ["main", "ci"])
def test_an_append_capability_is_minted_on_the_installed_server(http: Http, token: str, memory: str) -> None:
    """Finding: ``POST /grants {"scope": "append"}`` answered 500 on an
    installed server (skill/AGENTS-append.md was not in the wheel) and left a
    live grant nobody holds the token of."""
    body: dict[str, str] = {"scope": "append"}
    if memory != "main":
        http.ok("POST", "/memories", token, json={"name": memory})
        body["memory"] = memory
    minted = http.post("/grants", token, json=body)
    assert minted.status_code == 201, minted.text
    answer = minted.json()
    assert answer["memory"] == memory and "append" in answer["prompt"].lower()
    noted = http.post("/note", answer["token"], json={"text": "qqinstalled build 7 green"})
    assert noted.status_code == 200, noted.text
    wake = "/wake" if memory == "main" else f"/m/{memory}/wake"
    assert "qqinstalled build 7 green" in http.get(wake, token).text


def grant_ids(http: Http, token: str) -> list[int]:
    return [g["id"] for g in http.ok("GET", "/grants", token)["grants"]]


def test_an_init_or_a_mint_whose_block_cannot_be_made_writes_nothing(tmp_path: Path) -> None:
    """A server run from a copy of the installed package with a template
    taken away: the init or the mint that needs it answers 500 and writes no
    identity and no grant; put back, the same request succeeds."""
    site = tmp_path / "site"
    package = site / "stash"
    shutil.copytree(installed_folder(), package)  # links followed: the copy is a wheel's layout
    owner_block, append_block = package / "skill" / "AGENTS.md", package / "skill" / "AGENTS-append.md"
    kept = tmp_path / "kept"
    kept.mkdir()
    server = Server(data=tmp_path / "data", log=tmp_path / "server.log", env={"PYTHONPATH": str(site)})
    with server.start():
        http = Http(server.url)
        try:
            owner_block.rename(kept / owner_block.name)
            refused = http.post("/init", json={})
            assert refused.status_code == 500 and refused.json()["error"] == "internal", refused.text
            users = server.data / "users"
            assert not users.exists() or list(users.iterdir()) == []
            (kept / owner_block.name).rename(owner_block)
            token = http.init()["token"]
            before = grant_ids(http, token)
            append_block.rename(kept / append_block.name)
            refused = http.post("/grants", token, json={"scope": "append"})
            assert refused.status_code == 500 and refused.json()["error"] == "internal", refused.text
            assert grant_ids(http, token) == before
            (kept / append_block.name).rename(append_block)
            assert http.post("/grants", token, json={"scope": "append"}).status_code == 201
            assert len(grant_ids(http, token)) == len(before) + 1
        finally:
            http.close()


USER_CODE = """from stash import Stash


def first_id(mem: Stash) -> int:
    return mem.note("chose jade").id


def wrong(mem: Stash) -> str:
    return mem.note("chose jade").id
"""


@pytest.mark.slow
def test_the_library_is_typed_for_its_users(tmp_path: Path) -> None:
    """Finding: with no ``py.typed`` in the package, ``mypy --strict`` on a
    user's ``from stash import Stash`` skipped it ("missing library stubs or
    py.typed marker") and saw Any. Run outside the checkout, so mypy finds
    the installed package and no project configuration: the one error is
    the deliberate one, with the library's own types in it."""
    (tmp_path / "use.py").write_text(USER_CODE, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), "use.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert errors == ['use.py:9: error: Incompatible return value type (got "int", expected "str")  [return-value]'], (
        done.stdout + done.stderr
    )
