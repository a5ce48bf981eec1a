"""The fleet drill: a host dies and its shard comes back on a standby, then
a shard moves between live hosts, all through the router, as an operator
would run them (deploy/README.md, the fleet section).

Real processes on loopback: SeaweedFS (the session's S3 server), two
primaries and a standby (``stash serve --placement … --fleet-host …``, each
replicating with Litestream to its own path of one bucket), and Caddy
configured only through its admin API from the placement. Agents note
through the router in both shards; an owner of the shard that will fail
mints, revokes and erases. Then kill -9 of a primary with its Litestream,
``stash fleet failover``, and every promise checked: each note acknowledged
2 s before the kill is served, the revocation and the erasure hold, recovery
from the kill to the first answer through the router within 60 s, the other
shard never paused more than 2 s, the new host ships every user of the shard;
the old host, started again on its old folder with the new placement, serves
none of it; a second failover changes nothing. Then ``stash fleet move``
under writes: no acknowledged write lost, within 60 s."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stash.fleet import placement as places
from tests.support import loopback
from tests.support.fleet_drill import (
    Agents,
    Fleet,
    litestreams_of,
    longest_pause,
    running_fleet,
    stash,
    texts,
    wait_restorable,
)
from tests.support.installed import child_env
from tests.support.mcp.oauth import approved_code, exchange
from tests.support.ops.replication import wait_for
from tests.support.seaweedfs import SeaweedFS
from tests.support.server import CLI_TIMEOUT, OUTSIDE, Server
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow

ACKED_BEFORE_S = 2.0  # the promise: every note acknowledged this long before the death is served after
RECOVERY_S = 60.0
MOVE_S = 60.0
PAUSE_S = 2.0
USERS_PER_SHARD = 2


@pytest.fixture
def proxy(seaweedfs: SeaweedFS) -> Iterator[TcpProxy]:
    """The bucket's way in, which a test may cut."""
    way = TcpProxy(seaweedfs.s3_port)
    yield way
    way.close()


@pytest.fixture
def fleet(tmp_path: Path, seaweedfs: SeaweedFS, proxy: TcpProxy) -> Iterator[Fleet]:
    with running_fleet(tmp_path, seaweedfs, proxy) as running:
        yield running


def test_a_dead_hosts_shard_comes_back_on_the_standby_and_a_shard_moves_under_writes(fleet) -> None:
    file, hosts, url, env = fleet.file, fleet.hosts, fleet.url, fleet.env
    client = loopback.client(base_url=url, timeout=10.0)
    # Users through the router: each /init lands on a host that mints an id of its own shards.
    users: dict[str, list[str]] = {"0-7": [], "8-f": []}
    deadline = time.monotonic() + 30
    while any(len(v) < USERS_PER_SHARD for v in users.values()):
        assert time.monotonic() < deadline, users
        resp = client.post("/init", json={})
        assert resp.status_code == 201, resp.text
        token = resp.json()["token"]
        shard = "0-7" if token.split("_")[1][0] in "01234567" else "8-f"
        if len(users[shard]) < USERS_PER_SHARD:
            users[shard].append(token)
    owner = users["0-7"][0]
    auth = {"Authorization": f"Bearer {owner}"}
    # A second memory of the failing shard, written to as well.
    assert client.post("/memories", json={"name": "bravo"}, headers=auth).status_code == 201
    assert client.post("/m/bravo/note", json={"text": "bravo's first note"}, headers=auth).status_code == 200

    # An MCP host connects by OAuth through the router: every step without a token, on any host.
    code, verifier, registered = approved_code(client, owner, url)
    exchanged = exchange(client, code, verifier, registered["client_id"])
    assert exchanged.status_code == 200, exchanged.text
    mcp_host = {"Authorization": f"Bearer {exchanged.json()['access_token']}"}
    assert client.get("/config", headers=mcp_host).status_code == 200

    tokens = {f"{shard}#{i}": tok for shard, toks in users.items() for i, tok in enumerate(toks)}
    agents = Agents(url, tokens)
    agents.wait(5)
    # The owner mints a capability and revokes it, and erases a note: acknowledged only once replicated.
    minted = client.post("/grants", json={"scope": "append"}, headers=auth)
    assert minted.status_code == 201, minted.text
    grant = minted.json()
    revoked = client.delete(f"/grants/{grant['id']}", headers=auth)
    assert revoked.status_code == 200 and revoked.json()["flushed"] is True, revoked.text
    secret = client.post("/note", json={"text": "a secret to erase"}, headers=auth).json()["id"]
    erased = client.post("/erase", json={"ids": [secret]}, headers=auth)
    assert erased.status_code == 200 and erased.json()["flushed"] is True, erased.text
    time.sleep(ACKED_BEFORE_S + 0.5)

    # A primary dies with its Litestream.
    killed = time.monotonic()
    hosts["a"].kill9()
    failover = ("fleet", "failover", "--placement", str(file), "--shard", "0-7", "--standby", "c")
    done = stash(*failover, "--data", str(hosts["c"].data), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    print(done.stdout)
    first = None
    while first is None:
        resp = client.get("/config", headers=auth)
        if resp.status_code == 200:
            first = time.monotonic()
        assert time.monotonic() - killed < RECOVERY_S, resp.text
    agents.wait(len(agents.acked["0-7#0"]) + 3)
    agents.halt()

    # Every note acknowledged 2 s before the death is served by the standby, in every memory.
    for label, acked in agents.acked.items():
        served = texts(client, tokens[label])
        lost = [t for at, t in acked if at <= killed - ACKED_BEFORE_S and t not in served]
        assert not lost, f"{label} lost {len(lost)} acknowledged notes: {lost[:3]}"
    assert "bravo's first note" in texts(client, owner, "/m/bravo")
    # The revocation and the erasure hold on the new host.
    assert client.get("/config", headers={"Authorization": f"Bearer {grant['token']}"}).status_code == 401
    assert "a secret to erase" not in texts(client, owner)
    # The MCP host's token, minted by OAuth on the dead host, opens the memory on the new one.
    assert client.get("/config", headers=mcp_host).status_code == 200
    # The other shard never paused more than 2 s.
    for label in tokens:
        if label.startswith("8-f"):
            assert longest_pause(agents.answers[label], killed, first) <= PAUSE_S, label
    after = places.load(file)
    assert after.epoch == 2 and after.shard("0-7").host == "c"
    assert after.replica_of("c") == places.join(after.replica_root or "", "c/e2")
    # The word index is rebuilt on the new host: the first word search there.
    t0 = time.monotonic()
    found = client.post("/recall", json={"q": "drill"}, headers=auth)
    first_search = time.monotonic() - t0
    assert found.status_code == 200 and found.json()["matches"], found.text

    # The standby, holding a shard now, reports its replication like any replicated host.
    assert wait_for(lambda: "stash_replication_litestream_up 1.0" in metrics_of(hosts["c"]), timeout=20)
    assert wait_for(lambda: loopback.get(f"{hosts['c'].url}/health?ready=1").status_code == 200)
    # The new host ships every user of the shard under its new path: a restore from there brings them all.
    check = hosts["c"].data.parent / "check"
    shipped = wait_restorable(
        after.replica_of("c") or "", check, [tokens[u] for u in tokens if u.startswith("0-7")], env
    )
    assert shipped, "the standby did not ship every user of the shard under its new path"

    # The old host, started again on its old folder with the new placement, serves none of the shard.
    hosts["a"].start(same_port=True)
    direct = loopback.get(f"{hosts['a'].url}/config", headers=auth, timeout=10.0)
    assert direct.status_code == 421 and direct.json()["error"] == "fleet.elsewhere", direct.text
    assert not (hosts["a"].data / "users" / owner.split("_")[1]).exists()
    # A second failover changes nothing.
    again = stash(*failover, "--data", str(hosts["c"].data), env=env)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout + again.stderr
    assert places.load(file).epoch == 2
    # The old host replicates nothing (no Litestream reads its folder), so never under the standby's path.
    assert not litestreams_of(hosts["a"].data)
    assert litestreams_of(hosts["c"].data)

    # A shard moves between live hosts under writes: no acknowledged write lost, within 60 s.
    movers = {label: tok for label, tok in tokens.items() if label.startswith("8-f")}
    agents = Agents(url, movers)
    agents.wait(3)
    t0 = time.monotonic()
    moved = stash("fleet", "move", "--placement", str(file), "--shard", "8-f", "--from", "b", "--to", "c",
                  "--data", str(hosts["c"].data), env=env)  # fmt: skip
    move_s = time.monotonic() - t0
    assert moved.returncode == 0, moved.stdout + moved.stderr
    agents.wait(max(len(a) for a in agents.acked.values()) + 3)
    agents.halt()
    assert move_s <= MOVE_S
    for label, acked in agents.acked.items():
        served = texts(client, movers[label])
        lost = [t for _, t in acked if t not in served]
        assert not lost, f"{label} lost {len(lost)} acknowledged notes in the move: {lost[:3]}"
    final = places.load(file)
    assert final.shard("8-f").host == "c" and not final.shard("8-f").draining
    direct = loopback.get(f"{hosts['b'].url}/config", headers={"Authorization": f"Bearer {movers['8-f#0']}"},
                       timeout=10.0)  # fmt: skip
    assert direct.status_code == 421, direct.text
    print(
        f"\nfleet drill: failover {first - killed:.1f} s from the kill to the first answer; first word search "
        f"on the new host {first_search * 1000:.0f} ms; move {move_s:.1f} s"
    )


def test_a_failover_retries_while_the_bucket_is_cut_then_refuses_and_changes_nothing(fleet, proxy) -> None:
    file, hosts, url, env = fleet.file, fleet.hosts, fleet.url, fleet.env
    client = loopback.client(base_url=url, timeout=10.0)
    while True:  # a user of the shard that will fail
        token = client.post("/init", json={}).json()["token"]
        if token.split("_")[1][0] in "01234567":
            break
    auth = {"Authorization": f"Bearer {token}"}
    assert client.post("/note", json={"text": "kept through the outage"}, headers=auth).status_code == 200
    check = hosts["c"].data.parent / "check"
    assert wait_restorable(places.load(file).replica_of("a") or "", check, [token], env)
    hosts["a"].kill9()
    proxy.cut()
    failover = ("fleet", "failover", "--placement", str(file), "--shard", "0-7", "--standby", "c")
    refused = stash(*failover, "--data", str(hosts["c"].data), "--attempts", "2", env=env)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "after 2 attempts" in refused.stderr and "nothing the fleet serves was changed" in refused.stderr
    assert "trying again" in refused.stdout
    assert places.load(file).epoch == 1
    assert not any((hosts["c"].data / "users").glob(token.split("_")[1]))
    # Cut only briefly: the failover's retries outlast it.
    child = subprocess.Popen(
        [sys.executable, "-m", "stash", *failover, "--data", str(hosts["c"].data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=OUTSIDE,
        env={**child_env(), **env},
    )
    assert child.stdout is not None
    said = []
    for line in child.stdout:
        said.append(line)
        if "trying again" in line:
            proxy.restore()
    assert child.wait(timeout=CLI_TIMEOUT) == 0, "".join(said)
    assert "kept through the outage" in texts(client, token)


def metrics_of(server: Server) -> str:
    return loopback.get(f"{server.url}/metrics", timeout=5.0).text
