"""Hosts read the placement (`stash serve --placement FILE --fleet-host
NAME`, stash/fleet/host.py): real `stash serve --workers 2` processes serve
and mint only the users of the shards the placement gives them, a standby
holds none, a newer placement written to the file while they run is adopted
by every worker (the released users stop being served, move aside, and the
replication follows the new replica), and an older or a bad placement is
refused naming what is wrong."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from stash.web.fields import SECURED
from stash.web.routes import ROUTES
from tests.support import loopback
from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.fleet import placement_doc
from tests.support.route_calls import CALLS, route_key
from tests.support.server import Server, free_port

WAIT_S = 30.0
ELSEWHERE = "This host does not serve this user's shard now; send requests through the fleet's router."
TOKEN_ROUTES = [r for r in ROUTES if r.scope in (*SECURED, "capability")]


def write(path: Path, doc: dict) -> Path:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc), encoding="utf-8")
    tmp.replace(path)  # whole, as an operator's tool would write it
    return path


def host(tmp: Path, name: str, placement: Path, port: int, *extra: str) -> Server:
    (tmp / name).mkdir(parents=True, exist_ok=True)
    srv = Server(
        data=tmp / name / "data",
        log=tmp / name / "server.log",
        extra=["--placement", str(placement), "--fleet-host", name, "--workers", "2", *CHEAP_KDF_FLAGS, *extra],
    )
    srv.port = port
    return srv.start(same_port=True)


def refused_to_start(tmp: Path, name: str, placement: Path, *extra: str) -> subprocess.CompletedProcess:
    srv = Server(data=tmp / name / "data", log=tmp / "unused.log", extra=["--placement", str(placement), *extra])
    srv.port = free_port()
    argv = srv.argv() if "--fleet-host" in extra else [*srv.argv(), "--fleet-host", name]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=srv.environment(), cwd=srv.cwd)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    return done


class Anything:
    """A scope-test world whose answers are never read: a refused request's body is never looked at."""

    api: Any = None

    def forgettable(self, target):
        return "0-1"

    def revocable_grant(self, target):
        return 1

    def deletable_memory(self, target):
        return "notes"


def token_calls(memory: str) -> list[tuple[str, str, dict | None]]:
    """Every route that takes a token, once, on ``memory`` (a route's /m/{name} copy names it)."""
    out = []
    for r in TOKEN_ROUTES:
        method, url, body = CALLS[route_key(r.method, r.path)](Anything(), None)
        if r.under:
            url = url.replace("/m/main", f"/m/{memory}", 1)
        out.append((method, url, body))
    return out


def request(base: str, method: str, url: str, token: str, body: dict | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    return loopback.request(method, base + url, json=body, headers=headers, timeout=30)


def epoch_everywhere(srv: Server, epoch: int, tries: int = 40) -> None:
    """Wait until the master says the placement of ``epoch`` is in force
    (every worker has had time to see it), then hold /health to answering it
    on ``tries`` new connections in a row, which the kernel hands to both
    workers."""
    wait_for(lambda: f"placement epoch {epoch} in force" in srv.log_text(), srv.log_text()[-3000:])
    seen = {loopback.get(srv.url + "/health", timeout=10).json()["placement_epoch"] for _ in range(tries)}
    assert seen == {epoch}, seen


def wait_for(what, message: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not what():
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


def user_with_memory(srv: Server, memory: str) -> tuple[str, str]:
    """A new user of ``srv`` and a full token bound to ``memory`` (its owner's token for main)."""
    ident = loopback.post(srv.url + "/init", json={}, timeout=30).json()
    owner = ident["token"]
    if memory == "main":
        return ident["user_id"], owner
    auth = {"Authorization": f"Bearer {owner}"}
    made = loopback.post(srv.url + "/memories", json={"name": memory}, headers=auth, timeout=30)
    assert made.status_code in (200, 201), made.text
    grant = loopback.post(srv.url + "/grants", json={"scope": "full", "memory": memory}, headers=auth, timeout=30)
    assert grant.status_code in (200, 201), grant.text
    return ident["user_id"], grant.json()["token"]


def assert_elsewhere(resp: httpx.Response, what) -> None:
    assert resp.status_code == 421, (what, resp.status_code, resp.text[:300])
    body = resp.json()
    if "jsonrpc" in body:  # /mcp answers in its protocol, the code in its error's data
        assert body["error"]["data"] == {"error": "fleet.elsewhere"}, (what, body)
    else:
        assert body == {"error": "fleet.elsewhere", "message": ELSEWHERE}, (what, body)


@contextmanager
def hosts_of_two_shards(tmp: Path) -> Iterator[tuple[dict[str, Server], Path, dict]]:
    """Hosts a and b holding shards 0-7 and 8-f, each replicating, and c a standby; stopped at exit."""
    ports = {"a": free_port(), "b": free_port(), "c": free_port()}
    doc = placement_doc(
        ports,
        [("0-7", "a"), ("8-f", "b")],
        replicas={h: str(tmp / "replicas" / h / "e1") for h in "ab"},
        replica_root=str(tmp / "replicas"),
    )
    file = write(tmp / "placement.json", doc)
    servers = {name: host(tmp, name, file, port) for name, port in ports.items()}
    try:
        yield servers, file, doc
    finally:
        for srv in servers.values():
            srv.stop()


@pytest.fixture
def two_hosts(tmp_path: Path):
    """A fleet of its own, for a test that changes its placement."""
    with hosts_of_two_shards(tmp_path) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def standing_hosts(tmp_path_factory: pytest.TempPathFactory):
    """One fleet for the tests that only read its placement (three servers of two workers each, and two
    Litestreams, are seconds of CPU to start); each of them makes users of its own."""
    with hosts_of_two_shards(tmp_path_factory.mktemp("fleet")) as fleet:
        yield fleet


@pytest.mark.slow
@pytest.mark.parametrize("memory", ["main", "notes"])
def test_a_host_serves_and_mints_only_its_shards_and_a_standby_none(standing_hosts, memory: str) -> None:
    servers, _, _ = standing_hosts
    a, b, c = servers["a"], servers["b"], servers["c"]
    for _ in range(6):
        assert loopback.post(a.url + "/init", json={}, timeout=30).json()["user_id"][0] in "01234567"
        assert loopback.post(b.url + "/init", json={}, timeout=30).json()["user_id"][0] in "89abcdef"
    minted = loopback.post(c.url + "/init", json={}, timeout=30)
    assert minted.status_code == 421 and minted.json()["error"] == "fleet.elsewhere", minted.text
    assert not list((c.data / "users").iterdir())
    assert {loopback.get(s.url + "/health", timeout=30).json()["placement_epoch"] for s in servers.values()} == {1}
    _, token = user_with_memory(b, memory)
    assert request(b.url, "POST", f"/m/{memory}/note", token, {"text": "on b"}).status_code == 200
    calls = token_calls(memory)
    assert len(calls) == len(TOKEN_ROUTES) > 30
    for srv in (a, c):
        for method, url, body in calls:
            assert_elsewhere(request(srv.url, method, url, token, body), (srv.data, method, url))
    assert request(b.url, "GET", f"/m/{memory}/wake", token, None).status_code == 200


@pytest.mark.slow
@pytest.mark.parametrize("memory", ["main", "notes"])
def test_a_newer_placement_is_adopted_while_running(two_hosts, memory: str, tmp_path: Path) -> None:
    servers, file, doc = two_hosts
    a, c = servers["a"], servers["c"]
    users = [user_with_memory(a, memory) for _ in range(3)]
    for _, token in users:
        assert request(a.url, "POST", f"/m/{memory}/note", token, {"text": "kept"}).status_code == 200
    # Shard 0-7 goes to the standby c, under a new replica path of epoch 2.
    moved = json.loads(json.dumps(doc))
    moved["epoch"] = 2
    moved["shards"][0] = {"digits": "0-7", "host": "c", "replica": str(tmp_path / "replicas" / "c" / "e2")}
    write(file, moved)
    epoch_everywhere(a, 2)
    epoch_everywhere(c, 2)
    released = a.data / "released" / "e2"
    wait_for(lambda: {p.name for p in released.glob("*")} == {u for u, _ in users}, a.log_text()[-3000:])
    assert not list((a.data / "users").iterdir())
    for _, token in users:
        for _ in range(10):  # new connections: both workers refuse
            assert_elsewhere(request(a.url, "GET", f"/m/{memory}/wake", token, None), "a after the move")
    assert loopback.post(a.url + "/init", json={}, timeout=30).status_code == 421
    # c now holds 0-7: it mints there, and its replication restarted to the new path.
    ident = loopback.post(c.url + "/init", json={}, timeout=30).json()
    assert ident["user_id"][0] in "01234567"
    assert loopback.post(
        c.url + "/note", json={"text": "x"}, headers={"Authorization": f"Bearer {ident['token']}"}
    ).is_success
    shipped = tmp_path / "replicas" / "c" / "e2" / "users" / ident["user_id"]
    wait_for(lambda: shipped.is_dir() and any(shipped.rglob("*")), c.log_text()[-3000:])
    assert not (tmp_path / "replicas" / "c" / "e1").exists()


@pytest.mark.slow
def test_an_older_placement_is_refused_at_start_and_ignored_while_running(tmp_path: Path) -> None:
    port = free_port()
    doc = placement_doc({"a": port}, [("0-f", "a")], epoch=3, replicas={"a": str(tmp_path / "rep")})
    file = write(tmp_path / "placement.json", doc)
    a = host(tmp_path, "a", file, port)
    try:
        write(file, {**doc, "epoch": 2})
        wait_for(lambda: "not adopted" in a.log_text(), a.log_text()[-2000:])
        assert "epoch 2 is older than epoch 3" in a.log_text()
        write(file, {**doc, "shards": "not a list"})  # a broken file while running is reported, not adopted
        wait_for(lambda: a.log_text().count("not adopted") >= 2, a.log_text()[-2000:])
        seen = {loopback.get(a.url + "/health", timeout=10).json()["placement_epoch"] for _ in range(40)}
        assert seen == {3}, seen
    finally:
        a.stop()
    write(file, {**doc, "epoch": 2})
    done = refused_to_start(tmp_path, "a", file)
    assert "epoch 2 is older than epoch 3, which this host has adopted" in done.stderr, done.stderr
    changed = {**doc, "hosts": {"a": f"127.0.0.1:{port + 1}"}}
    done = refused_to_start(tmp_path, "a", write(file, changed))
    assert "epoch 3 is the one this host adopted, but it says something else" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"shards": [{"digits": "0-7", "host": "a", "replica": "/r/a"}]}, "digits 8-f are in no shard"),
        (
            {
                "shards": [
                    {"digits": "0-8", "host": "a", "replica": "/r/a"},
                    {"digits": "8-f", "host": "b", "replica": "/r/b"},
                ]
            },
            "digit 8 is in shards 0-8 and 8-f",
        ),
        (
            {
                "shards": [
                    {"digits": "0-7", "host": "a", "replica": "/r/a"},
                    {"digits": "8-f", "host": "z", "replica": "/r/z"},
                ]
            },
            "shard 8-f names host 'z', which is not in hosts (a, b)",
        ),
        (
            {
                "shards": [
                    {"digits": "0-7", "host": "a", "replica": "/r/a"},
                    {"digits": "8-f", "host": "a", "replica": "/r/a2"},
                ]
            },
            "host a's shards 0-7, 8-f name 2 replicas",
        ),
    ],
)
def test_a_bad_placement_is_refused_at_start_naming_what_is_wrong(tmp_path: Path, change: dict, says: str) -> None:
    doc = {**placement_doc({"a": 1, "b": 2}, [("0-7", "a"), ("8-f", "b")]), **change}
    done = refused_to_start(tmp_path, "a", write(tmp_path / "placement.json", doc))
    assert says in done.stderr, done.stderr
    assert not (tmp_path / "a" / "data" / "placement.json").exists()


def test_a_placement_that_is_not_json_or_misused_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "placement.json"
    file.write_text("{epoch: 1}")
    assert "not JSON (line 1, column 2)" in refused_to_start(tmp_path, "a", file).stderr
    write(file, placement_doc({"a": 1}, [("0-f", "a")]))
    assert "'x' is not in the placement's hosts (a)" in refused_to_start(tmp_path, "x", file).stderr
    both = refused_to_start(tmp_path, "a", file, "--fleet-host", "a", "--user-id-prefix", "0")
    assert "leave out --user-id-prefix and --replicate" in both.stderr
