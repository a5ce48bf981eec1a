"""``stash fleet move`` and ``stash fleet failover`` cut by kill -9 at every
step, then run again: the run again finishes what the cut one left
(deploy/README.md, the failover and move sections; docs/DESIGN.md,
"A fleet": a shard changes host in one order).

One fleet of real processes on loopback, the drill's (tests/support/
fleet_drill.py): SeaweedFS (the session's), hosts ``a`` (digits 0-7) and
``b`` (8-f) replicating to it, the standby ``c``, and Caddy configured from
the placement; agents note through the router. First shard 8-f moves from
``b`` to the standby ``c`` under writes; then ``a`` dies and its shard fails
over to ``c``, which by then holds 8-f and replicates it, so its Litestream
runs while the shard's users come in. Both run with ``--restore-first 1``:
one user comes back before the switch, the others while the shard serves.

Each command is run again and again, each run stopped just before a step of
its own and killed there (tests/support/cut_command.py: the instant is the
command's own action, whatever the machine's load). The steps after the
drain are the same code in both commands, so each is cut once, in one or
the other, each run taking up what the one before left. The move: during
its drain; between its restore and its move into ``users/``; after its
placement write, before the router switch; at a seeded random delay
(``STASH_CUT_SEED`` picks another). The failover: while it reads the shard's
roster; during its restore, with a ``litestream restore`` held mid-transfer
(the bucket cut), which must end with the command; between its move-in and
its placement write; once the shard is served, before the next user moves
in; after the placement that ends the restore, before the router is given
it. Then one run goes to the
end, and every promise is checked: exit 0; every note acknowledged is served
through the router, in main and a second memory (``a`` dies once its replica
holds all it acknowledged: what a failover loses beyond is Litestream's lag,
which the drill measures); at every instant no user is served by two hosts
(the others say 421 fleet.elsewhere, or 503 fleet.moving while the shard
drains or the user is not back); the receiver's own roster is left alone;
the receiver ships every user under its replica path, and a restore from
there brings each back whole at the head ``stash verify`` finds on the
receiver; nothing is left in ``.incoming/``. A second run changes nothing."""

from __future__ import annotations

import os
import random
import re
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from stash.fleet import placement as places
from tests.support import loopback
from tests.support.cut_command import Cut, Step, alive, renaming_into
from tests.support.fleet_drill import Agents, Fleet, texts
from tests.support.ops.replication import wait_for
from tests.support.seaweedfs import SeaweedFS
from tests.support.server import stash
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow

USERS_PER_SHARD = 2  # with --restore-first 1: one back before the switch, one after
HOLDERS = {"0-7": "a", "8-f": "b"}  # the fleet's placement at the start (tests/support/fleet_drill.py)
NOTE_PAUSE_S = 0.2  # between an agent's notes: writes all along, without taking the cores from the commands
SEED = int(os.environ.get("STASH_CUT_SEED", "45"))
RANDOM_CUT_S = (0.3, 4.0)  # the random kill lands this long after its run starts
RANDOM = Step("at a random delay", "", "")
# The first user's key ring is back; its memory file is about to be fetched (then held mid-transfer).
MID_TRANSFER = Step("restoring", "subprocess.Popen", r"'restore'.*\.incoming.*(keyring|memory)\.db", nth=2)
ORPHAN_S = 10.0  # how long the killed command's Litestream restore may take to end (its own retries take a minute)
SHIP_TIMEOUT_S = 60.0
TXID = re.compile(r"([0-9a-f]{16})-([0-9a-f]{16})\.ltx$")
HEAD = re.compile(r"memory file ok \((\d+ notes?, head [^)]*)\)")
USER = re.compile(r"[0-9a-f]{16}")

# The steps after the placement write that gives c the shard.
AFTER_THE_SWITCH = (
    "placement written, router not switched",
    "serving, a user not back",
    "restore ended, router not told",
)

Look = Callable[[str, bool], None]  # (the step, whether the run is stopped there or killed)


def mint(url: str) -> str:
    resp = loopback.post(f"{url}/init", json={}, timeout=10.0)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["token"])


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def user_of(token: str) -> str:
    return token.split("_")[1]


def users_in(data: Path, digits: str | None = None) -> set[str]:
    """The users whose folders are in ``data/users/`` (of shard ``digits``)."""
    home = data / "users"
    first = places.digits_of(digits) if digits else frozenset(places.HEX)
    return {p.name for p in home.iterdir() if USER.fullmatch(p.name) and p.name[0] in first} if home.is_dir() else set()


def serving(fleet: Fleet, token: str, dead: set[str]) -> list[str]:
    """The live hosts that serve ``token``'s user when asked straight, not
    through the router; every other one says it is elsewhere (421) or asks
    to retry (503: its shard drains, or the user is not restored yet)."""
    out = []
    for name, host in fleet.hosts.items():
        if name in dead:
            continue
        resp = loopback.get(f"{host.url}/config", headers=bearer(token), timeout=10.0)
        if resp.status_code == 200:
            out.append(name)
        else:
            said = {421: "fleet.elsewhere", 503: "fleet.moving"}.get(resp.status_code)
            assert said is not None and resp.json()["error"] == said, (name, resp.status_code, resp.text)
    return out


def roster_of(data: Path) -> set[str]:
    """The user ids a host's roster lists: what its replica says it holds."""
    path = data / "roster.db"
    assert path.is_file(), f"{path.name} is gone from the receiving host's data folder"
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {row[0] for row in conn.execute("SELECT id FROM users")}
    finally:
        conn.close()


def unshipped(data: Path, keys: list[str], prefix: str) -> list[str]:
    """The host's replicated files whose newest transaction its Litestream
    took is not in the replica under ``prefix`` (bucket keys ``keys``)."""
    rels = ["roster.db", *(str(p.relative_to(data)) for n in ("keyring.db", "memory.db")
                           for p in (data / "users").rglob(n))]  # fmt: skip
    out = []
    for rel in rels:
        path = data / rel
        local = [TXID.search(p.name) for p in (path.parent / f".{path.name}-litestream").rglob("*.ltx")]
        remote = [TXID.search(k) for k in keys if k.startswith(f"{prefix}/{rel}/")]
        newest = max((int(m[2], 16) for m in local if m), default=0)
        if not newest or newest > max((int(m[2], 16) for m in remote if m), default=0):
            out.append(rel)
    return out


def wait_shipped(data: Path, replica: str, seaweedfs: SeaweedFS, bucket: str) -> None:
    """Until the host whose data folder is ``data`` has every transaction
    its Litestream took in its replica (``s3://BUCKET/PATH?endpoint=…``)."""
    prefix = replica.split("?")[0].split("/", 3)[3]
    deadline = time.monotonic() + SHIP_TIMEOUT_S
    while left := unshipped(data, seaweedfs.keys(bucket, prefix), prefix):
        assert time.monotonic() < deadline, f"{data.parent.name} did not ship {left} under {prefix}"
        time.sleep(0.2)


def heads(verified: str) -> dict[str, list[str]]:
    """Each user's memories' note counts and heads, as ``stash verify`` (or
    ``stash restore``, which verifies what it restored) says them."""
    out = {}
    for line in verified.splitlines():
        user, _, said = line.partition("  ")
        if USER.fullmatch(user) and said.startswith("ok"):
            out[user] = HEAD.findall(said)
    return out


def cut_runs(
    fleet: Fleet, args: list[str], cuts: list[Step], look: Look, tmp: Path, rng: random.Random, proxy: TcpProxy
) -> None:
    """Run ``stash ARGS`` once per step: stopped there (``look`` sees what it
    left, stopped, then killed), or killed at a random delay (:data:`RANDOM`),
    which may come after the run ended. At :data:`MID_TRANSFER` the bucket
    is cut and the run let go until its Litestream restore runs, held
    there, so the kill lands with it mid-transfer: it must not outlive the
    command (it would go on writing into the restore's folder, even after a
    run again cleared it)."""
    for i, step in enumerate(cuts):
        log = tmp / f"cut-{args[1]}-{i}.log"
        if step is RANDOM:
            delay = rng.uniform(*RANDOM_CUT_S)
            cut = Cut(args, fleet.env, log, None)
            time.sleep(delay)  # the point: wherever a kill at a random moment lands
            ended = cut.kill()
            print(
                f"{args[1]}: a kill at {delay:.2f} s "
                + ("cut the run" if ended is None else f"came after its end ({ended})")
            )
        else:
            cut = Cut(args, fleet.env, log, step)
            restore = None
            try:
                cut.wait_stopped()
                look(step.name, True)
                if step is MID_TRANSFER:
                    proxy.cut()
                    restore = cut.resume_until_child("litestream", "restore", ".incoming")
                cut.kill()
                deadline = time.monotonic() + ORPHAN_S
                while restore is not None and alive(restore):
                    assert time.monotonic() < deadline, "a Litestream restore of the killed command lives on"
                    time.sleep(0.05)
            finally:
                cut.kill()
                if restore is not None and alive(restore):
                    os.kill(restore, signal.SIGKILL)
                proxy.restore()
        look(step.name, False)


def test_a_move_and_a_failover_cut_by_kill_9_at_any_step_are_finished_by_running_them_again(
    fleet: Fleet, seaweedfs: SeaweedFS, proxy: TcpProxy, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    file, hosts, env = fleet.file, fleet.hosts, fleet.env
    c_data = hosts["c"].data
    client = loopback.client(base_url=fleet.url, timeout=10.0)
    # Each made on its shard's host (a host mints only ids of its shards), so the shards hold these users only.
    users = {shard: [mint(hosts[host].url) for _ in range(USERS_PER_SHARD)] for shard, host in HOLDERS.items()}
    tokens = [t for toks in users.values() for t in toks]
    # A second memory for a user of each shard, written before the commands run.
    bravo: dict[str, list[str]] = {}
    for shard, toks in users.items():
        assert client.post("/memories", json={"name": "bravo"}, headers=bearer(toks[0])).status_code == 201
        bravo[toks[0]] = [f"bravo of {shard}, note {k}" for k in range(2)]
        for text in bravo[toks[0]]:
            resp = client.post("/m/bravo/note", json={"text": text}, headers=bearer(toks[0]))
            assert resp.status_code == 200, resp.text
    movers = Agents(fleet.url, {t: t for t in users["8-f"]}, NOTE_PAUSE_S)
    stayers = Agents(fleet.url, {t: t for t in users["0-7"]}, NOTE_PAUSE_S)
    movers.wait(2)
    stayers.wait(2)
    dead: set[str] = set()
    own: set[str] = set()  # the receiver's roster before a command: left alone by it

    def look_at(shard: str, source: str, everyone: set[str]) -> Look:
        """What a cut run of the command giving ``shard`` (its users
        ``everyone``) from ``source`` to c left, at each step."""
        assert everyone == {user_of(t) for t in users[shard]}, "a user of the shard no test token opens"
        token_of = {user_of(t): t for t in users[shard]}
        ahead = min(everyone)  # --restore-first 1: the roster's first comes back before the switch

        def look(name: str, stopped: bool) -> None:
            for token in tokens:
                assert len(serving(fleet, token, dead)) <= 1, f"{user_of(token)} is served by two hosts"
            if own:
                assert roster_of(c_data) >= own
            if not stopped:
                return
            now = places.load(file).shard(shard)
            back = users_in(c_data, shard)
            ended = name == "restore ended, router not told"
            on_c = name in AFTER_THE_SWITCH
            assert now.host == ("c" if on_c else source), now
            assert now.draining == (not on_c and source == "b") and bool(now.restoring) == (on_c and not ended), now
            if on_c:  # c serves the users back, and asks for the others to be sent again; the source serves none
                for token in users[shard]:
                    assert serving(fleet, token, dead) == (["c"] if user_of(token) in back else []), name
            expected = {
                "moved in, placement not written": {ahead},
                "placement written, router not switched": {ahead},
                "serving, a user not back": {ahead},
                "restore ended, router not told": everyone,
            }
            assert back == expected.get(name, set()), (name, back)
            if name == "restored, not moved in":
                assert (c_data / ".incoming" / shard / "users" / ahead).is_dir()
            if on_c:
                routed = client.get("/config", headers=bearer(token_of[ahead])).status_code
                if name.startswith("placement written"):
                    assert routed != 200, name  # still sent to the source, which does not serve it
                else:
                    assert routed == 200, name

        return look

    # --- Shard 8-f moves from b to the standby c.
    common = ["--restore-first", "1", "--data", str(c_data)]
    move = ["fleet", "move", "--placement", str(file), "--shard", "8-f", "--from", "b", "--to", "c", *common]
    b_address = places.load(file).hosts["b"]
    cuts = [
        Step("draining", "urllib.Request", re.escape(f"'http://{b_address}/health")),
        Step("restored, not moved in", "os.rename", renaming_into(c_data / "users")),
        Step("placement written, router not switched", "urllib.Request", r"/load'"),
        RANDOM,
    ]
    cut_runs(fleet, move, cuts, look_at("8-f", "b", users_in(hosts["b"].data, "8-f")), tmp_path, rng, proxy)
    done = stash(*move, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    moved = places.load(file)
    assert moved.epoch == 4, moved  # one epoch to drain, one to switch, one once every user is back: none more
    had = {token: len(acked) for token, acked in movers.acked.items()}
    wait_for(lambda: all(len(movers.acked[t]) > n for t, n in had.items()))  # a note more each, through the router
    movers.halt()
    stayers.halt()
    settled = (file.read_bytes(), users_in(c_data))
    again = stash(*move, env=env)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout + again.stderr
    assert (file.read_bytes(), users_in(c_data)) == settled

    # --- a dies; its shard 0-7 fails over to c, which holds 8-f now and replicates it.
    # c replicates from a moment after it serves the shard (its Litestream starts after the users are in).
    wait_for(lambda: (c_data / "roster.db").is_file() and roster_of(c_data) >= users_in(c_data))
    own = roster_of(c_data)
    shard_users = users_in(hosts["a"].data, "0-7")
    # Every note a acknowledged is in its replica (what a failover promises beyond is Litestream's lag, which
    # the drill measures): so every one must be served after.
    wait_shipped(hosts["a"].data, places.load(file).replica_of("a") or "", seaweedfs, fleet.bucket)
    hosts["a"].kill9()
    dead.add("a")
    failover = ["fleet", "failover", "--placement", str(file), "--shard", "0-7", "--standby", "c", *common]
    cuts = [
        Step("reading the roster", "subprocess.Popen", r"'restore'.*roster\.db"),
        MID_TRANSFER,  # no host writes now: cutting the bucket holds up no one's replication
        # The folder is opened to sync the renames into it, after the last one of the batch.
        Step("moved in, placement not written", "open", re.escape(f"('{c_data / 'users'}', None,")),
        # One user moved in before the switch; the next to move in comes after it.
        Step("serving, a user not back", "os.rename", renaming_into(c_data / "users"), nth=2),
        # The run before left the shard switched: this one brings the other user back, writes the placement
        # that ends the restore, and gives the router that placement.
        Step("restore ended, router not told", "urllib.Request", r"/load'"),
    ]
    cut_runs(fleet, failover, cuts, look_at("0-7", "a", shard_users), tmp_path, rng, proxy)
    done = stash(*failover, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    after = places.load(file)
    assert after.epoch == moved.epoch + 2, after
    assert after.held_by("c") == frozenset(places.HEX) and not any(s.restoring or s.draining for s in after.shards)
    for token in users["0-7"]:  # a note on c, through the router, that c must ship
        text = f"after the failover, {user_of(token)}"
        assert client.post("/note", json={"text": text}, headers=bearer(token)).status_code == 200
        stayers.acked[token].append((time.monotonic(), text))
    settled = (file.read_bytes(), users_in(c_data))
    again = stash(*failover, env=env)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout + again.stderr
    assert (file.read_bytes(), users_in(c_data)) == settled

    # Every note acknowledged is served through the router, in main and the second memory.
    for agents in (movers, stayers):
        for token, acked in agents.acked.items():
            served = texts(client, token)
            lost = [t for _, t in acked if t not in served]
            assert not lost, f"{user_of(token)} lost {len(lost)} acknowledged notes: {lost[:3]}"
    for token, notes in bravo.items():
        served = texts(client, token, "/m/bravo")
        assert all(n in served for n in notes), user_of(token)
    # c serves every user; b, alive, says each is elsewhere.
    for token in tokens:
        assert serving(fleet, token, dead) == ["c"], user_of(token)
        elsewhere = loopback.get(f"{hosts['b'].url}/config", headers=bearer(token), timeout=10.0)
        assert elsewhere.status_code == 421, elsewhere.text
    assert not list((c_data / ".incoming").iterdir())

    # c ships every user under its replica path: all its Litestream took is there, and a restore brings them whole.
    held = users_in(c_data)
    replica = after.replica_of("c") or ""
    wait_shipped(c_data, replica, seaweedfs, fleet.bucket)
    restored = stash("restore", replica, "--data", str(tmp_path / "restored"), env=env)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert f"{len(held)} users restored, 0 failed" in restored.stdout, restored.stdout
    # stash verify agrees, on the host's folder once it stopped (no Litestream checkpointing under it), and
    # finds there every memory of every user at the head the restore brought back.
    hosts["c"].stop()
    checked = stash("verify", str(c_data), env={})
    assert checked.returncode == 0 and f"{len(held)} users checked, 0 failed" in checked.stdout, checked.stdout
    assert heads(restored.stdout) == heads(checked.stdout) and set(heads(checked.stdout)) == held, (
        restored.stdout + checked.stdout
    )
    assert roster_of(c_data) == held
