"""A running fleet for the drill and the fleet bench (tests/e2e/test_fleet_drill.py,
and the bench's fleet script): three hosts on loopback (``stash serve --placement …
--fleet-host …``: two primaries, ``a`` holding digits 0-7 and ``b`` 8-f, and
the standby ``c``), each replicating to its own path of one SeaweedFS bucket
reached through a cuttable proxy, and a real Caddy configured through its
admin API from the placement; agents that note through the router; and
what the drill reads back."""

from __future__ import annotations

import io
import itertools
import shutil
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from stash.fleet import placement as places
from stash.fleet import router
from tests.support import loopback
from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.fleet import caddy_with_admin
from tests.support.seaweedfs import SeaweedFS, credentials
from tests.support.server import Server, free_port, stash
from tests.support.tcp_proxy import TcpProxy

INTERVAL_MS = 100
SHARDS = ("0-7", "8-f")


@dataclass
class Fleet:
    file: Path
    hosts: dict[str, Server]
    url: str  # the router's
    env: dict[str, str]  # the S3 keys and the replication interval
    bucket: str  # where every host's replica is, in the session's SeaweedFS

    def stash(self, *args: str) -> subprocess.CompletedProcess[str]:
        return stash(*args, env=self.env)


@contextmanager
def running_fleet(
    tmp_path: Path, seaweedfs: SeaweedFS, proxy: TcpProxy, *, workers: int = 1, interval: str = f"{INTERVAL_MS}ms"
) -> Iterator[Fleet]:
    bucket = seaweedfs.bucket("fleet")
    root = seaweedfs.url(bucket, "fleet", endpoint=proxy.endpoint)
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
        env = {**credentials(), "STASH_REPLICATE_INTERVAL": interval}
        hosts = {
            name: Server(
                data=tmp_path / name / "data",
                log=tmp_path / f"{name}.log",
                extra=["--placement", str(file), "--fleet-host", name, "--workers", str(workers), *CHEAP_KDF_FLAGS],
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
            yield Fleet(file, hosts, f"http://127.0.0.1:{router_port}", env, bucket)
        finally:
            for server in hosts.values():
                server.stop()


def shard_of(token: str) -> str:
    return "0-7" if token.split("_")[1][0] in "01234567" else "8-f"


def enrol(client: httpx.Client, per_shard: int) -> dict[str, list[str]]:
    """Users made through the router until each shard has ``per_shard``:
    each ``/init`` lands on a host that mints an id of its own shards, so a
    shard may get more. Every token made, by shard."""
    users: dict[str, list[str]] = {shard: [] for shard in SHARDS}
    deadline = time.monotonic() + 30
    while any(len(v) < per_shard for v in users.values()):
        assert time.monotonic() < deadline, users
        resp = client.post("/init", json={})
        assert resp.status_code == 201, resp.text
        token = resp.json()["token"]
        users[shard_of(token)].append(token)
    return users


class Agents:
    """One thread per user noting through the router, each acknowledged note
    kept with the moment its answer came; a refused or unanswered note is sent
    again (the router answers 502 while a host is dead, a draining host 503).
    ``pause``: how long each waits after a note is acknowledged (0: none)."""

    def __init__(self, url: str, tokens: dict[str, str], pause: float = 0.0) -> None:
        self.pause = pause
        self.acked: dict[str, list[tuple[float, str]]] = {u: [] for u in tokens}
        self.answers: dict[str, list[float]] = {u: [] for u in tokens}
        self.refused: dict[str, dict[int, int]] = {u: {} for u in tokens}
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(url, u, t), daemon=True) for u, t in tokens.items()]
        for t in self.threads:
            t.start()

    def _run(self, url: str, user: str, token: str) -> None:
        with loopback.client(base_url=url, timeout=5.0) as client:
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
                    self.stop.wait(self.pause)
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
    return max(b - a for a, b in itertools.pairwise(moments))


def wait_restorable(replica_url: str, folder: Path, toks: list[str], env: dict[str, str]) -> bool:
    """Whether ``stash restore`` from ``replica_url`` brings back every user of
    ``toks`` (tried until Litestream shipped them, bounded)."""
    wanted = {t.split("_")[1] for t in toks}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        shutil.rmtree(folder, ignore_errors=True)
        done = stash("restore", replica_url, "--data", str(folder), env=env)
        if done.returncode == 0 and wanted <= {p.name for p in (folder / "users").iterdir()}:
            return True
        time.sleep(0.5)
    return False


def litestreams_of(data: Path) -> list[int]:
    """The Litestream processes streaming ``data`` (their configuration is in it)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"litestream") and any(str(data).encode() in a for a in argv):
            found.append(int(proc.name))
    return found
