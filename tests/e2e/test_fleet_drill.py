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

import os
import signal
import subprocess
import sys
import time

import pytest

from stash.fleet import placement as places
from tests.support import loopback
from tests.support.fleet_drill import (
    Agents,
    enrol,
    litestreams_of,
    longest_pause,
    stash,
    texts,
    wait_restorable,
)
from tests.support.installed import child_env
from tests.support.mcp.oauth import approved_code, exchange
from tests.support.ops.replication import wait_for
from tests.support.server import CLI_TIMEOUT, OUTSIDE, Server

pytestmark = pytest.mark.slow

ACKED_BEFORE_S = 2.0  # the promise: every note acknowledged this long before the death is served after
RECOVERY_S = 60.0
MOVE_S = 60.0
PAUSE_S = 2.0
USERS_PER_SHARD = 2
AGENT_PAUSE_S = 0.05


def test_a_dead_hosts_shard_comes_back_on_the_standby_and_a_shard_moves_under_writes(fleet) -> None:
    file, hosts, url, env = fleet.file, fleet.hosts, fleet.url, fleet.env
    client = loopback.client(base_url=url, timeout=10.0)
    users = {shard: toks[:USERS_PER_SHARD] for shard, toks in enrol(client, USERS_PER_SHARD).items()}
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
    # Agents note every 50 ms, not flat out: an agent notes when something happens, and four flat out on the
    # same cores as everything else once held Litestream over 2 s behind (the promise is about what was acknowledged).
    agents = Agents(url, tokens, pause=AGENT_PAUSE_S)
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
    agents = Agents(url, movers, pause=AGENT_PAUSE_S)
    agents.wait(3)
    # c replicates shard 0-7: its own roster, which its Litestream holds open and ships, is no place for b's.
    roster = hosts["c"].data / "roster.db"
    held = os.stat(roster).st_ino
    t0 = time.monotonic()
    moved = stash("fleet", "move", "--placement", str(file), "--shard", "8-f", "--from", "b", "--to", "c",
                  "--data", str(hosts["c"].data), env=env)  # fmt: skip
    move_s = time.monotonic() - t0
    assert moved.returncode == 0, moved.stdout + moved.stderr
    # The drained shard's roster is read at the first attempt, and c's own roster is the file it was.
    assert "could not read the replica's roster" not in moved.stdout + moved.stderr, moved.stdout + moved.stderr
    assert os.stat(roster).st_ino == held
    assert "db=roster.db" not in hosts["c"].log_text()  # its Litestream never lost the file it ships
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


def metrics_of(server: Server) -> str:
    return loopback.get(f"{server.url}/metrics", timeout=5.0).text


RESTORING_USERS = 8  # more than --restore-first 1, so most come back while the shard serves, and some are left when cut


def _wait_line(child: subprocess.Popen[str], said: list[str], text: str) -> str:
    """Read the command's output up to the first line holding ``text``."""
    assert child.stdout is not None
    for line in child.stdout:
        said.append(line)
        if text in line:
            return line
    raise AssertionError(f"the command ended without saying {text!r}:\n{''.join(said)}")


def test_a_failover_outlasts_a_bucket_cut_and_serves_the_shard_while_its_users_come_back(fleet, proxy) -> None:
    """With the bucket cut, a failover retries, then refuses having changed
    nothing; cut only briefly, its retries outlast the cut. It switches the
    shard once its first user is back: a user not
    back yet is answered 503 ``fleet.moving`` (and restored next), one the
    roster does not name is refused as ever. The command is cut mid-way:
    the users left stay answered 503, never served empty; run again, it goes
    on with those (and is cut again). Then the new host
    dies too, and a failover to a third host reads each user from the newest
    replica that holds it."""
    file, hosts, url, env = fleet.file, fleet.hosts, fleet.url, fleet.env
    client = loopback.client(base_url=url, timeout=10.0)
    tokens: list[str] = []
    while len(tokens) < RESTORING_USERS:
        token = client.post("/init", json={}).json()["token"]
        if token.split("_")[1][0] in "01234567":
            tokens.append(token)
    auth = {t: {"Authorization": f"Bearer {t}"} for t in tokens}
    for i, token in enumerate(tokens):
        assert client.post("/note", json={"text": f"before the death {i}"}, headers=auth[token]).status_code == 200
    assert client.post("/memories", json={"name": "bravo"}, headers=auth[tokens[0]]).status_code == 201
    assert client.post("/m/bravo/note", json={"text": "bravo before"}, headers=auth[tokens[0]]).status_code == 200
    assert wait_restorable(places.load(file).replica_of("a") or "", hosts["c"].data.parent / "check", tokens, env)
    hosts["a"].kill9()
    argv = ["fleet", "failover", "--placement", str(file), "--shard", "0-7", "--standby", "c"]
    proxy.cut()
    refused = stash(*argv, "--data", str(hosts["c"].data), "--attempts", "2", env=env)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "after 2 attempts" in refused.stderr and "nothing the fleet serves was changed" in refused.stderr
    assert "trying again" in refused.stdout
    assert places.load(file).epoch == 1
    assert not [t for t in tokens if (hosts["c"].data / "users" / t.split("_")[1]).exists()]

    by_id = {t.split("_")[1]: t for t in tokens}
    last = by_id[max(by_id)]  # the roster's order is the ids': this user would come back last
    child = subprocess.Popen(
        [sys.executable, "-m", "stash", *argv, "--data", str(hosts["c"].data), "--restore-first", "1", "--jobs", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=OUTSIDE, env={**child_env(), **env},
    )  # fmt: skip
    said: list[str] = []
    _wait_line(child, said, "trying again")  # cut only briefly: the retries outlast it
    proxy.restore()
    _wait_line(child, said, "while it serves")
    # The shard is served: its last user is not back, so it is asked to retry, and put first.
    waiting = client.get("/config", headers=auth[last])
    assert waiting.status_code == 503 and waiting.json()["error"] == "fleet.moving", waiting.text
    assert waiting.headers["Retry-After"] == "1"
    # A user id the roster does not name is refused as it would be anywhere, never told to wait.
    stranger = last.replace(last.split("_")[1], "0" + last.split("_")[1][1:])
    assert client.get("/config", headers={"Authorization": f"Bearer {stranger}"}).status_code == 401
    ahead = _wait_line(child, said, f"user {last.split('_')[1]} restored ahead of its turn")
    child.send_signal(signal.SIGSTOP)  # held where it is, so users are left for what follows
    assert int(ahead.split("(")[1].split(" of ")[0]) <= 3, ahead  # next or nearly, not in its turn (7 of 7)
    resp = client.get("/config", headers=auth[last])
    assert resp.status_code == 200, resp.text
    assert client.post("/note", json={"text": "written on c"}, headers=auth[last]).status_code == 200
    # The command is cut (kill -9): the users not back stay answered 503, never served empty.
    child.kill()
    child.wait(timeout=CLI_TIMEOUT)
    left = [t for t in tokens if not (hosts["c"].data / "users" / t.split("_")[1]).exists()]
    assert left, "every user came back before the cut: nothing was tested"
    for token in left:
        assert client.get("/config", headers=auth[token]).status_code == 503
    cut = places.load(file)
    assert cut.shard("0-7").host == "c" and cut.shard("0-7").restoring, "it must still name where the rest come from"
    # Run again on c, it goes on with the users not back (and is cut again once one more is).
    child = subprocess.Popen(
        [sys.executable, "-m", "stash", *argv, "--data", str(hosts["c"].data), "--jobs", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=OUTSIDE, env={**child_env(), **env},
    )  # fmt: skip
    said = []
    assert f"restoring the {len(left)} user(s) not back yet" in _wait_line(child, said, "not back yet"), said
    _wait_line(child, said, f"1 of {len(left)}")  # one more user back, asked for or in its turn
    child.kill()
    assert len(left) > 1, "one user was left, so the run above finished the shard: nothing more to test"
    child.wait(timeout=CLI_TIMEOUT)
    assert places.load(file) == cut

    # The new host dies too, once its own note shipped; the old one, back with the new placement, takes the shard.
    assert wait_restorable(cut.replica_of("c") or "", hosts["c"].data.parent / "check2", [last], env)
    hosts["c"].kill9()
    hosts["a"].start(same_port=True)
    done = stash(*argv[:-1], "a", "--data", str(hosts["a"].data), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    final = places.load(file)
    assert final.shard("0-7").host == "a" and not final.shard("0-7").restoring
    assert final.replica_of("a") not in (cut.replica_of("c"), *cut.shard("0-7").restoring)  # a path of its own
    for i, token in enumerate(tokens):
        assert f"before the death {i}" in texts(client, token)
    assert "written on c" in texts(client, last)  # from c's replica, newer than a's old one
    assert "bravo before" in texts(client, tokens[0], "/m/bravo")
    assert not (hosts["a"].data / ".incoming" / "0-7").exists()
