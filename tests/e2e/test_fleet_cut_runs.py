"""``stash fleet move`` and ``stash fleet failover`` cut by kill -9 at every
step, then run again: the run again finishes what the cut one left
(deploy/README.md, the failover and move sections; docs/DESIGN.md, "A
fleet": a shard changes host in one order).

One fleet of real processes on loopback, the drill's (tests/support/
fleet_drill.py): SeaweedFS (the session's), hosts ``a`` (digits 0-7) and
``b`` (8-f) replicating to it, the standby ``c``, and Caddy configured from
the placement; agents note through the router all along. First shard 8-f
moves from ``b`` to the standby ``c``; then ``a`` dies and its shard fails
over to ``c``, which by then holds 8-f and replicates it, so its Litestream
runs while the shard's users come in.

Each command is run again and again, each run stopped just before a step of
its own and killed there (tests/support/cut_command.py: the instant is the
command's own action, whatever the machine's load). Both commands share the
steps after the drain, so each step is cut once, in one command or the
other: the move during its drain, during its restore (its third Litestream
restore of a user's file), between its restore and its move into ``users/``,
at a seeded random delay (``STASH_CUT_SEED`` picks another), and after its
placement write, before the router switch; the failover while it reads the
shard's roster, between its move-in and its placement write, and after the
placement write. Then one run goes to the end, and every promise is
checked: exit 0; every note acknowledged is served through the router, in
main and a second memory (for the failover, those acknowledged at least 2 s
before ``a`` died: its promise); at every instant no user is served by two
hosts (the other says 421 fleet.elsewhere, or 503 fleet.moving while it
drains); the receiver's own roster is left alone; the receiver ships every
user under its replica path, and a restore from there brings them all back
whole; ``stash verify`` agrees; nothing is left in ``.incoming/``. A second
run changes nothing."""

from __future__ import annotations

import os
import random
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from stash.fleet import placement as places
from tests.support.cut_command import Cut, Step, renaming_into
from tests.support.fleet_drill import Agents, Fleet, enrol, running_fleet, texts
from tests.support.ops.replication import wait_for
from tests.support.seaweedfs import SeaweedFS
from tests.support.server import stash
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow

ACKED_BEFORE_S = 2.0  # the failover's promise: every note acknowledged this long before the death is served
NOTE_PAUSE_S = 0.2  # between an agent's notes: writes all along, without taking the cores from the commands
SEED = int(os.environ.get("STASH_CUT_SEED", "45"))
RANDOM_CUT_S = (0.3, 4.0)  # the random kill lands this long after its run starts
RANDOM = Step("at a random delay", "", "")
SHIP_TIMEOUT_S = 60.0
TXID = re.compile(r"([0-9a-f]{16})-([0-9a-f]{16})\.ltx$")

Look = Callable[[str, bool, bool], None]  # (step, stopped there, an earlier run ended by itself)


@pytest.fixture
def fleet(tmp_path: Path, seaweedfs: SeaweedFS) -> Iterator[Fleet]:
    proxy = TcpProxy(seaweedfs.s3_port)
    try:
        with running_fleet(tmp_path, seaweedfs, proxy) as running:
            yield running
    finally:
        proxy.close()


def steps(data: Path, source_address: str | None = None) -> dict[str, Step]:
    """The instants a run of ``stash fleet failover`` or ``move`` (draining
    the host at ``source_address``) is stopped at, each just before the
    action named, by the receiving host's data folder ``data``."""
    out = {
        "reading the roster": Step("reading the roster", "subprocess.Popen", r"'restore'.*roster\.db"),
        "restoring": Step("restoring", "subprocess.Popen", r"'restore'.*\.incoming.*(keyring|memory)\.db", nth=3),
        "restored": Step("restored, not moved in", "os.rename", renaming_into(data / "users")),
        # The folder is opened to sync the renames into it, after the last one.
        "moved in": Step("moved in, placement not written", "open", re.escape(f"('{data / 'users'}', None,")),
        "placed": Step("placement written, router not switched", "urllib.Request", r"/load'"),
    }
    if source_address is not None:
        out["draining"] = Step("draining", "urllib.Request", re.escape(f"'http://{source_address}/health"))
    return out


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def user_of(token: str) -> str:
    return token.split("_")[1]


def serving(fleet: Fleet, token: str, dead: set[str]) -> list[str]:
    """The live hosts that serve ``token``'s user when asked straight, not
    through the router; every other one says it is elsewhere (421) or, while
    it drains the shard, moving (503)."""
    out = []
    for name, host in fleet.hosts.items():
        if name in dead:
            continue
        resp = httpx.get(f"{host.url}/config", headers=bearer(token), timeout=10.0, trust_env=False)
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


HEAD = re.compile(r"memory file ok \((\d+ notes?, head [^)]*)\)")


def heads(verified: str) -> dict[str, list[str]]:
    """Each user's memories' note counts and heads, as ``stash verify`` (or
    ``stash restore``, which verifies what it restored) says them."""
    out = {}
    for line in verified.splitlines():
        user, _, said = line.partition("  ")
        if re.fullmatch(r"[0-9a-f]{16}", user) and said.startswith("ok"):
            out[user] = HEAD.findall(said)
    return out


def cut_runs(fleet: Fleet, args: list[str], cuts: list[Step], look: Look, tmp: Path, rng: random.Random) -> None:
    """Run ``stash ARGS`` once per step: stopped there (``look`` sees what it
    left, stopped, then killed), or killed at a random delay (:data:`RANDOM`),
    which may come after the run ended."""
    finished = False
    for i, step in enumerate(cuts):
        log = tmp / f"cut-{args[1]}-{i}.log"
        if step is RANDOM:
            delay = rng.uniform(*RANDOM_CUT_S)
            cut = Cut(args, fleet.env, log, None)
            time.sleep(delay)  # the point: wherever a kill at a random moment lands
            ended = cut.kill()
            finished = finished or ended == 0
            print(
                f"{args[1]}: a kill at {delay:.2f} s "
                + ("cut the run" if ended is None else f"came after its end ({ended})")
            )
        else:
            cut = Cut(args, fleet.env, log, step)
            try:
                cut.wait_stopped()
                look(step.name, True, finished)
            finally:
                cut.kill()
        look(step.name, False, finished)


def test_a_move_and_a_failover_cut_by_kill_9_at_any_step_are_finished_by_running_them_again(
    fleet: Fleet, seaweedfs: SeaweedFS, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    file, hosts, env = fleet.file, fleet.hosts, fleet.env
    c_data = hosts["c"].data
    client = httpx.Client(base_url=fleet.url, timeout=10.0, trust_env=False)
    users = enrol(client, 1)
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

    def one_host_each() -> None:
        for token in tokens:
            assert len(serving(fleet, token, dead)) <= 1, f"{user_of(token)} is served by two hosts"

    def look_at(shard: str, source: str) -> Look:
        """What a cut run of the command giving ``shard`` from ``source`` to c left."""
        toks = users[shard]

        def look(name: str, stopped: bool, finished: bool) -> None:
            one_host_each()
            if own:  # the receiver's own roster is left alone
                assert roster_of(c_data) >= own
            if not stopped:
                return
            now = places.load(file).shard(shard)
            moved = [user_of(t) for t in toks if (c_data / "users" / user_of(t)).is_dir()]
            if name.startswith("placement written"):
                assert now.host == "c" and not now.draining, now
                assert serving(fleet, toks[0], dead) == ["c"]
                if not finished:  # the router still sends the shard to the source, which does not serve it
                    assert client.get("/config", headers=bearer(toks[0])).status_code != 200
                return
            assert now.host == source and now.draining == (source == "b"), now
            assert len(moved) == (len(toks) if name.startswith("moved in") else 0), (name, moved)
            if name.startswith("restored"):
                here = [p for p in (c_data / ".incoming").iterdir() if p.is_dir()]
                assert len(here) == 1 and {user_of(t) for t in toks} <= {p.name for p in (here[0] / "users").iterdir()}

        return look

    # --- Shard 8-f moves from b to the standby c.
    own: set[str] = set()
    move = ["fleet", "move", "--placement", str(file), "--shard", "8-f", "--from", "b", "--to", "c",
            "--data", str(c_data)]  # fmt: skip
    at = steps(c_data, places.load(file).hosts["b"])
    cuts = [at["draining"], at["restoring"], at["restored"], RANDOM, at["placed"]]
    cut_runs(fleet, move, cuts, look_at("8-f", "b"), tmp_path, rng)
    done = stash(*move, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    moved_epoch = places.load(file).epoch
    assert moved_epoch == 3, places.load(file)  # one epoch to drain, one to place: no run made one of its own
    movers.wait(max(len(a) for a in movers.acked.values()) + 1)  # through the router, to c
    stayers.halt()  # the failover's promise counts from their last note
    settled = (file.read_bytes(), sorted(p.name for p in (c_data / "users").iterdir()))
    again = stash(*move, env=env)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout + again.stderr
    assert (file.read_bytes(), sorted(p.name for p in (c_data / "users").iterdir())) == settled

    # --- a dies; its shard 0-7 fails over to c, which holds 8-f now and replicates it.
    # c replicates from a moment after it serves the shard (its Litestream starts after the users are in).
    wait_for(lambda: (c_data / "roster.db").is_file() and roster_of(c_data) >= {user_of(t) for t in users["8-f"]})
    own = roster_of(c_data)
    last_ack = max(at for acked in stayers.acked.values() for at, _ in acked)
    time.sleep(max(0.0, last_ack + ACKED_BEFORE_S - time.monotonic()))  # the promise's age, not a guess
    hosts["a"].kill9()
    dead.add("a")
    failover = ["fleet", "failover", "--placement", str(file), "--shard", "0-7", "--standby", "c",
                "--data", str(c_data)]  # fmt: skip
    at = steps(c_data)
    cut_runs(fleet, failover, [at["reading the roster"], at["moved in"]], look_at("0-7", "a"), tmp_path, rng)
    done = stash(*failover, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    after = places.load(file)
    assert after.epoch == moved_epoch + 1, after
    assert after.held_by("c") == frozenset(places.HEX) and not after.draining_on("c")
    for token in users["0-7"]:  # a note on c, through the router, that c must ship
        text = f"after the failover, {user_of(token)}"
        assert client.post("/note", json={"text": text}, headers=bearer(token)).status_code == 200
        stayers.acked[token].append((time.monotonic(), text))
    movers.halt()
    settled = (file.read_bytes(), sorted(p.name for p in (c_data / "users").iterdir()))
    again = stash(*failover, env=env)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout + again.stderr
    assert (file.read_bytes(), sorted(p.name for p in (c_data / "users").iterdir())) == settled

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
        elsewhere = httpx.get(f"{hosts['b'].url}/config", headers=bearer(token), timeout=10.0, trust_env=False)
        assert elsewhere.status_code == 421, elsewhere.text
    assert not list((c_data / ".incoming").iterdir())

    # c ships every user under its replica path: all its Litestream took is there, and a restore brings them whole.
    held = {p.name for p in (c_data / "users").iterdir()}
    replica = after.replica_of("c") or ""
    prefix = replica.split("?")[0].split("/", 3)[3]
    deadline = time.monotonic() + SHIP_TIMEOUT_S
    while left := unshipped(c_data, seaweedfs.keys(fleet.bucket, prefix), prefix):
        assert time.monotonic() < deadline, f"c did not ship {left} under {prefix}"
        time.sleep(0.2)
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
