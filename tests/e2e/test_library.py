"""The Python library (``from stash import Stash``) against a real ``stash serve``: every method, with
its typed answer checked against the API's own state, and every kind of refusal raised as its class with
the server's code, status and message."""

from __future__ import annotations

import importlib.util
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import stash
from stash import (
    BadRequest,
    Conflict,
    Forbidden,
    Grant,
    Invalid,
    NapNeeded,
    NotFound,
    ServerError,
    Stash,
    StashError,
    TooLarge,
    Unauthorized,
    Unreachable,
)
from tests.live import Http, Server, free_port, start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("library-server"))
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def owner(served: Server) -> str:
    http = Http(served.url)
    try:
        return http.init()["token"]
    finally:
        http.close()


@pytest.fixture(autouse=True)
def own_pins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test pins into its own file, never the user's."""
    monkeypatch.setenv("STASH_PINS", str(tmp_path / "pins.json"))


def test_an_agents_session_wake_note_nap(served: Server, owner: str) -> None:
    mem = Stash(served.url, owner)
    assert mem.wake().lines == [] and mem.wake().T == 0
    first = mem.note("chose jade over chrome")
    assert first.id == 0 and first.nap is None
    second = mem.note("it's the one we'll keep")
    assert second.id == 1 and second.nap is not None and second.nap.block == "0-1"
    assert second.nap.source == [line for line in Http(served.url).ok("POST", "/wake", owner, json={})["lines"]]
    assert mem.due() == second.nap
    saved = mem.nap("0-1", "jade chosen and kept")
    assert saved.saved == "0-1" and saved.nap is None
    again = mem.nap("0-1", "jade chosen and kept")  # already settled: nothing written
    assert again.saved is None
    for k in range(2, 8):
        mem.note(f"memory {k}")
    with pytest.raises(Conflict) as wrong:
        mem.nap("4-5", "not the due block")
    assert wrong.value.status == 409 and wrong.value.code and wrong.value.message
    batch = mem.naps(8)  # blocks of at most 16 are written from the log, so all six are ready at once
    assert [n.block for n in batch] == ["2-3", "4-5", "6-7", "0-3", "4-7", "0-7"]
    done = mem.settle({n.block: f"sum {n.block}" for n in batch})
    assert done.nap is None and mem.due() is None
    wake = mem.wake()
    assert wake.T == 8 and len(wake.lines) == 8 and wake.lines[0].startswith("#0 ")

    found = mem.recall("JADE")
    assert found.total == 1 and found.matches[0].startswith("#0 ") and found.more is None
    assert mem.zoom("0-1").lines == Http(served.url).ok("POST", "/zoom", owner, json={"block": "0-1"})["lines"]
    forgot = mem.forget("4-7")
    assert forgot.dropped[0] == "4-7" and forgot.nap is not None
    with pytest.raises(ValueError):
        mem.recall()


def test_an_owners_calls(served: Server, owner: str, tmp_path: Path) -> None:
    mem = Stash(served.url, owner)
    imported = mem.import_([("2026-01-02", "old plan"), ("2026-01-03", "older decision kept")])
    assert (imported.first, imported.last, imported.pending) == (0, 1, 1)
    minted = mem.mint("read", label="reader bot")
    assert minted.token.startswith("stash1_") and minted.scope == "read" and "STASH_TOKEN" in minted.prompt
    listed = {g.id: g for g in mem.grants()}
    assert isinstance(listed[minted.id], Grant) and listed[minted.id].label == "reader bot"
    assert listed[minted.id].live and not listed[minted.id].revoked
    reader = Stash(served.url, minted.token)
    assert reader.recall("plan").total == 1
    with pytest.raises(Forbidden) as low:
        reader.note("a reader cannot write")
    assert low.value.status == 403
    revoked = mem.revoke(minted.id)
    assert revoked.id == minted.id and not revoked.already
    with pytest.raises(Unauthorized) as gone:
        reader.recall("plan")
    assert gone.value.status == 401 and gone.value.code.startswith("auth.")
    receipt = mem.erase([0])
    assert receipt.ids == [0] and receipt.erased == [0]
    assert [r.receipt for r in mem.erasures()] == [receipt.receipt]
    archive = mem.export(tmp_path / "memory.tar.gz")
    with tarfile.open(archive) as tar:
        assert "memory/LOG.txt" in tar.getnames()
    names = [m.name for m in mem.memories()]
    assert names[0] == "main"
    rotated = mem.rotate()
    assert rotated.token != owner
    assert mem.grants()  # the object moved to the new token
    with pytest.raises(Unauthorized):
        Stash(served.url, owner).grants()


def test_every_kind_of_refusal_is_its_class(served: Server, owner: str) -> None:
    mem = Stash(served.url, owner)
    with pytest.raises(Invalid) as empty:
        mem.note("")
    assert (empty.value.status, empty.value.code) == (422, "text.empty")
    with pytest.raises(TooLarge) as big:
        mem.note("x" * (2 * 1024 * 1024))
    assert big.value.status == 413
    with pytest.raises(NotFound) as unknown:
        mem.revoke(999)
    assert (unknown.value.status, unknown.value.code) == (404, "grants.unknown")
    with pytest.raises(BadRequest) as malformed:
        mem._call("POST", "/note", {"text": "a", "nonsense": 1})
    assert malformed.value.status == 400
    mem.note("one")
    mem.note("two")
    for k in range(3, 200):
        mem.note(f"line {k}")
    with pytest.raises(NapNeeded) as needs:
        mem.wake()
    assert needs.value.code == "wake.needs_nap" and needs.value.nap is not None
    assert isinstance(needs.value, Conflict) and isinstance(needs.value, StashError)
    with pytest.raises(Unauthorized):
        Stash(served.url, "stash1_" + "0" * 16 + "_" + "A" * 49).wake()
    with pytest.raises(Unreachable) as nobody:
        Stash(f"http://127.0.0.1:{free_port()}", owner).wake()
    assert nobody.value.status == 0


def test_a_damaged_store_is_a_server_error(tmp_path: Path) -> None:
    with start_server(tmp_path / "srv") as srv:
        http = Http(srv.url)
        init = http.init()
        mem = Stash(srv.url, init["token"], pin=False)
        mem.note("a line to lose")
        srv.stop()
        for f in (srv.data / "users" / init["user_id"]).glob("memory.db*"):
            f.write_bytes(b"\0" * 4096)
        srv.start(same_port=True)
        with pytest.raises(ServerError) as broken:
            mem.wake()
        assert broken.value.status >= 500 and broken.value.code.startswith("store.")
        http.close()


def test_the_example_agent_loop_runs_a_session(served: Server, owner: str, tmp_path: Path) -> None:
    """examples/agent_loop.py as CLIENT.md shows it: a real process against the real server."""
    import os
    import subprocess

    from tests.live import REPO

    notes = [f"decision {k}: kept the plan" for k in range(5)]
    env = {**os.environ, "STASH_URL": served.url, "STASH_TOKEN": owner, "STASH_PINS": str(tmp_path / "p.json"),
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(REPO / "examples" / "agent_loop.py"), *notes], env=env,
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    mem = Stash(served.url, owner)
    assert mem.due() is None  # every nap was answered
    assert [line.split(" ", 2)[2] for line in done.stdout.splitlines()] == notes


def test_the_file_fetched_from_the_server_is_the_library(served: Server, tmp_path: Path) -> None:
    """``curl -o stash_client.py $STASH_URL/client`` then ``import stash_client``: the same classes."""
    import httpx

    path = tmp_path / "stash_client.py"
    path.write_bytes(httpx.get(served.url + "/client").content)
    spec = importlib.util.spec_from_file_location("stash_client", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["stash_client"] = module
    try:
        spec.loader.exec_module(module)
        assert {"Stash", "StashError", "Nap", "Wake"} <= set(module.__all__)
        assert set(stash.__all__) >= {"Stash", "StashError"}
    finally:
        del sys.modules["stash_client"]
