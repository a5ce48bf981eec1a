"""The fleet with a realistic shard: replication lag, a failover's recovery
and a move, measured on the drill's fleet (tests/support/fleet_drill.py):
SeaweedFS started here, three hosts (``a`` holding digits 0-7, ``b`` 8-f,
the standby ``c``) replicating to it with Litestream, and Caddy routing by
the placement.

Shard 0-7 gets ``--users`` users, shard 8-f a quarter as many, each made
straight on its host with ``/init`` (the hosts run with the cheap KDF) and
given ``--notes`` notes by a few threads; every tenth has a second memory
with a note. Agents then note through the router in both shards, and:

1. Replication lag: probe users of shard 0-7 (written by no one else) note
   one at a time; a probe's lag runs from its answer until the bucket holds
   its memory.db's transaction (the highest transaction id in SeaweedFS's
   filer listing of that file reaches the first local one Litestream took
   after the note: an upper bound, as a checkpoint taken right after counts).
2. kill -9 of host ``a`` with its Litestream, ``stash fleet failover`` of 0-7
   to ``c`` (when it served the shard, and its own "restored and checked"
   time), recovery from the kill to the first 200 through the router for a
   user of the shard and for ``--sample`` others asking from the kill on
   (each is restored ahead of its turn once it asks), the first word
   search (``POST /recall``, the word index rebuilt there) for one user and
   for a few more, the longest pause shard 8-f's agents saw, and every note
   acknowledged 2 s before the kill checked served.
3. ``stash fleet move`` of 8-f from ``b`` to ``c`` under writes: its time, the
   longest pause shard 0-7's agents saw meanwhile, no acknowledged note lost.

    python bench/fleet.py --users 1000 --notes 10 --runs 1
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _repo  # noqa: F401  (puts the checkout on sys.path)
import httpx

from stash.fleet import placement as places
from tests.support.fleet_drill import Agents, Fleet, longest_pause, running_fleet, texts
from tests.support.installed import child_env
from tests.support.seaweedfs import SeaweedFS
from tests.support.server import OUTSIDE
from tests.support.tcp_proxy import TcpProxy

TXID = re.compile(r"([0-9a-f]{16})-([0-9a-f]{16})\.ltx$")
WORDS = ("harbour", "lantern", "meadow", "orchard", "glacier")
ACKED_BEFORE_S = 2.0  # the fleet's promise: a note acknowledged this long before the death is served after
SEED_THREADS = 4
SECOND_MEMORY_EVERY = 10
POLL_S = 0.05
FLEET_TIMEOUT_S = 1800.0  # a command over a shard this size outlasts the tests' CLI bound
SHIP_TIMEOUT_S = 30.0
RECOVERY_TIMEOUT_S = 300.0
CHECKED_SEEDED = 20
# What stash fleet failover and move say when done.
RESTORED = r"(\d+) user\(s\) restored"
CHECKED = r"restored and checked in ([0-9.]+) s"
DONE = r"done in ([0-9.]+) s"
SERVED = r"served after ([0-9.]+) s"  # seeded users whose every note is checked after each switch


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def seed(url: str, users: int, notes: int) -> list[dict[str, str]]:
    """``users`` users made on the host at ``url``, each with ``notes`` notes
    (every tenth with a second memory and a note in it)."""
    counter = itertools.count()

    def one(_: int) -> dict[str, str]:
        k = next(counter)
        with httpx.Client(base_url=url, timeout=60.0, trust_env=False) as c:
            made = c.post("/init", json={})
            assert made.status_code == 201, made.text
            user = made.json()
            auth = {"Authorization": f"Bearer {user['token']}"}
            for n in range(notes):
                text = f"seeded note {n} of user {k} about the {WORDS[n % len(WORDS)]}"
                resp = c.post("/note", json={"text": text}, headers=auth)
                assert resp.status_code == 200, resp.text
            if k % SECOND_MEMORY_EVERY == 0:
                assert c.post("/memories", json={"name": "bravo"}, headers=auth).status_code == 201
                resp = c.post("/m/bravo/note", json={"text": f"bravo of user {k}"}, headers=auth)
                assert resp.status_code == 200, resp.text
            return {"token": user["token"], "user_id": user["user_id"], "k": str(k)}

    with ThreadPoolExecutor(SEED_THREADS) as pool:
        return list(pool.map(one, range(users)))


def local_txid(data: Path, user_id: str) -> int:
    """The newest transaction Litestream has taken from the user's memory.db WAL."""
    meta = data / "users" / user_id / ".memory.db-litestream" / "ltx"
    return max((int(m.group(2), 16) for p in meta.rglob("*.ltx") if (m := TXID.search(p.name))), default=0)


def bucket_txid(seaweedfs: SeaweedFS, bucket: str, prefix: str) -> int:
    """The newest transaction of the file at ``prefix`` the bucket holds, at any level."""
    try:
        keys = seaweedfs.keys(bucket, prefix)
    except httpx.HTTPError:
        return 0
    return max((int(m.group(2), 16) for k in keys if (m := TXID.search(k))), default=0)


def replication_lag(
    fleet: Fleet, seaweedfs: SeaweedFS, probes: list[dict[str, str]], count: int
) -> tuple[list[float], int]:
    """Each probe note's lag (s) from its answer to its transaction in the bucket, and how many timed out."""
    url = urllib.parse.urlsplit(places.load(fleet.file).replica_of("a") or "")
    bucket, root = url.netloc, url.path.strip("/")
    data = fleet.hosts["a"].data
    lags, missed = [], 0
    with httpx.Client(base_url=fleet.url, timeout=30.0, trust_env=False) as c:
        for i in range(count):
            user = probes[i % len(probes)]
            before = local_txid(data, user["user_id"])
            resp = c.post("/note", json={"text": f"probe {i}"}, headers={"Authorization": f"Bearer {user['token']}"})
            assert resp.status_code == 200, resp.text
            acked = time.monotonic()
            deadline = acked + SHIP_TIMEOUT_S
            while (taken := local_txid(data, user["user_id"])) <= before and time.monotonic() < deadline:
                time.sleep(POLL_S)
            prefix = f"{root}/users/{user['user_id']}/memory.db"
            while bucket_txid(seaweedfs, bucket, prefix) < taken and time.monotonic() < deadline:
                time.sleep(POLL_S)
            if time.monotonic() >= deadline:
                missed += 1
            else:
                lags.append(time.monotonic() - acked)
    return lags, missed


def wait_more(agents: Agents, n: int) -> None:
    """Until every agent has ``n`` more notes acknowledged than now (its shard is served)."""
    wanted = {u: len(a) + n for u, a in agents.acked.items()}
    deadline = time.monotonic() + SHIP_TIMEOUT_S
    while any(len(agents.acked[u]) < k for u, k in wanted.items()):
        assert time.monotonic() < deadline, {u: len(a) for u, a in agents.acked.items()}
        time.sleep(POLL_S)


def lost_notes(client: httpx.Client, agents: Agents, tokens: dict[str, str], before: float | None) -> int:
    """Notes the agents had acknowledged (before ``before``, if given) that are not served."""
    lost = 0
    for label, token in tokens.items():
        acked = agents.acked[label]
        served = texts(client, token)
        lost += sum(1 for at, t in acked if (before is None or at <= before) and t not in served)
    return lost


def lost_seeded(client: httpx.Client, seeded: list[dict[str, str]], notes: int) -> int:
    """Seeded notes (of the first :data:`CHECKED_SEEDED` users) not served."""
    lost = 0
    for user in seeded[:CHECKED_SEEDED]:
        served = texts(client, user["token"])
        k = user["k"]
        lost += sum(1 for n in range(notes) if f"seeded note {n} of user {k} " not in served)
        if int(k) % SECOND_MEMORY_EVERY == 0 and f"bravo of user {k}" not in texts(client, user["token"], "/m/bravo"):
            lost += 1
    return lost


def first_answer(url: str, token: str, since: float, out: list[float]) -> None:
    """The moment the router first answers 200 for ``token``'s user."""
    with httpx.Client(base_url=url, timeout=5.0, trust_env=False) as c:
        while time.monotonic() - since < RECOVERY_TIMEOUT_S:
            try:
                if c.get("/config", headers={"Authorization": f"Bearer {token}"}).status_code == 200:
                    out.append(time.monotonic())
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)


def fleet_command(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stash", "fleet", *args, "--placement", str(fleet.file)],
        capture_output=True,
        text=True,
        timeout=FLEET_TIMEOUT_S,
        cwd=OUTSIDE,
        env=child_env(fleet.env),
    )


def said(stdout: str, pattern: str) -> str:
    m = re.search(pattern, stdout)
    return m.group(1) if m else "?"


def one_run(args: argparse.Namespace, tmp: Path, seaweedfs: SeaweedFS) -> dict[str, object]:
    proxy = TcpProxy(seaweedfs.s3_port)
    out: dict[str, object] = {}
    tmp.mkdir(parents=True)
    try:
        with running_fleet(tmp, seaweedfs, proxy, workers=args.workers, interval=args.interval) as fleet:
            a, b, c = (fleet.hosts[h] for h in "abc")
            t0 = time.monotonic()
            seeded_a = seed(a.url, args.users, args.notes)
            seeded_b = seed(b.url, max(1, args.users // 4), args.notes)
            out["seed"] = f"{len(seeded_a)} + {len(seeded_b)} users in {time.monotonic() - t0:.0f} s"
            print(f"  seeded {out['seed']} ({load()})", flush=True)
            agent_a = {f"0-7#{i}": u["token"] for i, u in enumerate(seeded_a[-args.agents :])}
            agent_b = {f"8-f#{i}": u["token"] for i, u in enumerate(seeded_b[-args.agents :])}
            probes = seeded_a[-args.agents - 3 : -args.agents]
            tokens = {**agent_a, **agent_b}
            client = httpx.Client(base_url=fleet.url, timeout=60.0, trust_env=False)

            agents = Agents(fleet.url, tokens)
            agents.wait(5)
            lags, missed = replication_lag(fleet, seaweedfs, probes, args.probes)
            lags.sort()
            out["lag"] = (
                f"p50 {statistics.median(lags) * 1000:.0f} ms, p95 {lags[int(len(lags) * 0.95) - 1] * 1000:.0f} ms, "
                f"max {lags[-1] * 1000:.0f} ms over {len(lags)} probes ({missed} not shipped in "
                f"{SHIP_TIMEOUT_S:.0f} s; interval {args.interval}, {len(tokens)} agents noting)"
            )
            print(f"  replication lag: {out['lag']} ({load()})", flush=True)

            time.sleep(ACKED_BEFORE_S + 0.5)
            out["load_kill"] = load()
            killed = time.monotonic()
            a.kill9()
            first: list[float] = []
            watcher = threading.Thread(target=first_answer, args=(fleet.url, probes[0]["token"], killed, first))
            watcher.start()
            # Users asking at random moments after the kill: each one's wait for its first answer.
            rng = random.Random(args.users)
            sample = rng.sample(seeded_a[: -args.agents - 3], min(args.sample, max(0, len(seeded_a) - args.agents - 3)))
            sampled: dict[int, list[float]] = {i: [] for i in range(len(sample))}
            asking = [
                threading.Thread(target=first_answer, args=(fleet.url, u["token"], killed, sampled[i]))
                for i, u in enumerate(sample)
            ]
            for t in asking:
                t.start()
            done = fleet_command(fleet, "failover", "--shard", "0-7", "--standby", "c", "--data", str(c.data))
            failover_s = time.monotonic() - killed
            assert done.returncode == 0, done.stdout + done.stderr
            watcher.join()
            for t in asking:
                t.join()
            assert first, "no answer through the router for the shard"
            print("  " + done.stdout.strip().replace("\n", "\n  "), flush=True)
            out["failover"] = (
                f"shard served {said(done.stdout, SERVED)} s after the command began; "
                f"{said(done.stdout, RESTORED)} users restored and checked in {said(done.stdout, CHECKED)} s, "
                f"command done in {said(done.stdout, DONE)} s ({failover_s:.1f} s from the kill)"
            )
            waits = sorted(v[0] - killed for v in sampled.values() if v)
            out["recovery"] = f"{first[0] - killed:.1f} s" + (
                f"; {len(waits)} users asking from the kill on: median {statistics.median(waits):.1f} s, "
                f"max {waits[-1]:.1f} s ({len(sample) - len(waits)} never answered)"
                if waits
                else ""
            )
            wait_more(agents, 3)
            agents.halt()
            out["pause_failover"] = f"{max(longest_pause(agents.answers[u], killed, first[0]) for u in agent_b):.2f} s"

            word = WORDS[0]
            searches = []
            for user in [probes[0], *seeded_a[: args.searches]]:
                t = time.monotonic()
                found = client.post("/recall", json={"q": word}, headers={"Authorization": f"Bearer {user['token']}"})
                searches.append(time.monotonic() - t)
                assert found.status_code == 200, found.text
            rest = sorted(searches[1:])
            out["search"] = (
                f"{searches[0] * 1000:.0f} ms for the first user; {len(rest)} more: median "
                f"{statistics.median(rest) * 1000:.0f} ms, max {rest[-1] * 1000:.0f} ms"
                if rest
                else f"{searches[0] * 1000:.0f} ms"
            )
            lost = lost_notes(client, agents, tokens, killed - ACKED_BEFORE_S)
            late = lost_notes(client, agents, agent_a, None) - lost_notes(
                client, agents, agent_a, killed - ACKED_BEFORE_S
            )
            out["failover_lost"] = (
                f"{lost} of the notes acknowledged {ACKED_BEFORE_S:.0f} s before the kill lost, {late} of the last "
                f"{ACKED_BEFORE_S:.0f} s; {lost_seeded(client, seeded_a, args.notes)} seeded notes lost "
                f"of {CHECKED_SEEDED} users checked"
            )
            print(
                f"  recovery {out['recovery']}; first word search {out['search']}; shard 8-f's longest pause "
                f"{out['pause_failover']}; {out['failover_lost']}",
                flush=True,
            )

            agents = Agents(fleet.url, tokens)
            agents.wait(3)
            out["load_move"] = load()
            t0 = time.monotonic()
            moved = fleet_command(fleet, "move", "--shard", "8-f", "--from", "b", "--to", "c", "--data", str(c.data))
            move_s = time.monotonic() - t0
            assert moved.returncode == 0, moved.stdout + moved.stderr
            print("  " + moved.stdout.strip().replace("\n", "\n  "), flush=True)
            wait_more(agents, 3)
            agents.halt()
            out["move"] = (
                f"{move_s:.1f} s for {said(moved.stdout, RESTORED)} users (shard served again after "
                f"{said(moved.stdout, SERVED)} s; restored and checked in {said(moved.stdout, CHECKED)} s)"
            )
            pauses = {u: longest_pause(agents.answers[u], t0, t0 + move_s) for u in tokens}
            out["pause_move"] = (
                f"{max(pauses[u] for u in agent_a):.2f} s (the moving shard's own agents: "
                f"{max(pauses[u] for u in agent_b):.1f} s)"
            )
            out["move_lost"] = (
                f"{lost_notes(client, agents, tokens, None)} acknowledged notes lost; "
                f"{lost_seeded(client, seeded_b, args.notes)} seeded notes lost of {CHECKED_SEEDED} users checked"
            )
            print(
                f"  move {out['move']}; shard 0-7's longest pause {out['pause_move']}; {out['move_lost']}", flush=True
            )
            client.close()
    finally:
        proxy.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=1000, help="users of shard 0-7 (shard 8-f gets a quarter as many)")
    p.add_argument("--notes", type=int, default=10, help="notes made to each user before the measures")
    p.add_argument("--runs", type=int, default=1, help="whole runs, each on a new fleet")
    p.add_argument("--agents", type=int, default=4, help="agents noting through the router in each shard")
    p.add_argument("--probes", type=int, default=40, help="probe notes timed into the bucket")
    p.add_argument("--sample", type=int, default=20, help="users of shard 0-7 asking from the kill on, each timed")
    p.add_argument("--searches", type=int, default=5, help="users' first word searches after the failover")
    p.add_argument("--interval", default="1s", help="Litestream's sync interval (STASH_REPLICATE_INTERVAL)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--keep", action="store_true", help="keep the run's folders (hosts' data, SeaweedFS, logs)")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="stash-fleet-bench-"))
    seaweedfs = SeaweedFS(root / "seaweedfs").start()
    try:
        for run in range(1, args.runs + 1):
            print(f"run {run} of {args.runs} ({load()}):", flush=True)
            out = one_run(args, root / f"run{run}", seaweedfs)
            print(f"run {run}: " + "; ".join(f"{k} {v}" for k, v in out.items()), flush=True)
    finally:
        seaweedfs.stop()
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
