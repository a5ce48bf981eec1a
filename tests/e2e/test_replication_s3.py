"""``stash serve --replicate s3://BUCKET/PATH?endpoint=URL`` against a real
S3-compatible server (SeaweedFS, tests/support/seaweedfs.py) with the real
``litestream``, and the same run against a folder replica: every user's
files (main and a second memory) and the roster shipped, the host killed -9,
``stash restore`` into a new folder brings every user back and ``stash
verify`` agrees. Then what an S3 replica can do wrong: the bucket cut off
mid-writes (reported, not ready, nothing lost once it is back), keys it
refuses (reported as such), no keys at all (refused at start, naming both
variables); and ``AWS_CA_BUNDLE`` set throughout, as on these machines."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import certifi
import pytest

from tests.support import loopback
from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.installed import child_env
from tests.support.ops.backup import log_of
from tests.support.ops.replication import metric, ready, wait_for
from tests.support.seaweedfs import SeaweedFS, credentials
from tests.support.server import CLI_TIMEOUT, Http, Server, stash
from tests.support.tcp_proxy import TcpProxy

INTERVAL = "100ms"
SHIP_TIMEOUT_S = 30.0
# Its mere presence once kept Litestream's S3 client from starting; set to a real bundle.
CA_BUNDLE = {"AWS_CA_BUNDLE": certifi.where()}
TXID = re.compile(r"([0-9a-f]{16})-([0-9a-f]{16})\.ltx$")


@dataclass
class Replica:
    """Where a test host replicates to, and how to look into it."""

    url: str
    env: dict[str, str] = field(default_factory=dict)
    seaweedfs: SeaweedFS | None = None
    bucket: str = ""
    folder: Path | None = None

    def shipped(self, rel: str) -> int:
        """The newest transaction of ``rel`` (a replicated file, relative to the
        data folder) the replica holds, at any level; 0 for none."""
        if self.seaweedfs is not None:
            prefix = f"host-a/e1/{rel}/"
            names = [k for k in self.seaweedfs.keys(self.bucket) if k.startswith(prefix)]
        else:
            assert self.folder is not None
            names = [str(p) for p in (self.folder / rel).rglob("*.ltx")]
        return max((int(m.group(2), 16) for n in names if (m := TXID.search(n))), default=0)


def written(data: Path, rel: str) -> int:
    """The newest transaction Litestream has taken from ``rel``'s write-ahead log."""
    path = data / rel
    meta = path.parent / f".{path.name}-litestream" / "ltx"
    return max((int(m.group(2), 16) for p in meta.rglob("*.ltx") if (m := TXID.search(p.name))), default=0)


def replicated_files(data: Path) -> list[str]:
    rels = ["roster.db"]
    for name in ("keyring.db", "memory.db"):
        rels += [str(p.relative_to(data)) for p in (data / "users").rglob(name)]
    return rels


def wait_shipped(data: Path, replica: Replica) -> None:
    """Until every replicated file's last transaction is in the replica."""
    wait_for(
        lambda: all(0 < written(data, rel) <= replica.shipped(rel) for rel in replicated_files(data)),
        timeout=SHIP_TIMEOUT_S,
        pause=0.1,
    )


def host(tmp: Path, replica: Replica, env: dict[str, str] | None = None) -> Server:
    tmp.mkdir(parents=True, exist_ok=True)
    return Server(
        data=tmp / "data",
        log=tmp / "server.log",
        extra=["--replicate", replica.url, *CHEAP_KDF_FLAGS],
        env={"STASH_REPLICATE_INTERVAL": INTERVAL, **replica.env, **(env or {})},
    ).start()


@pytest.fixture(params=["folder", "s3"])
def replica(request: pytest.FixtureRequest, tmp_path: Path) -> Replica:
    if request.param == "folder":
        return Replica(str(tmp_path / "replica"), folder=tmp_path / "replica")
    return s3_replica(request.getfixturevalue("seaweedfs"))


def s3_replica(seaweedfs: SeaweedFS, endpoint: str | None = None) -> Replica:
    bucket = seaweedfs.bucket()
    url = seaweedfs.url(bucket, "host-a/e1", endpoint)
    return Replica(url, {**credentials(), **CA_BUNDLE}, seaweedfs, bucket)


def restored_texts(tmp: Path, replica: Replica, url: str, owners: dict[str, str]) -> dict[str, str]:
    """``stash restore`` of ``url`` into a new folder, checked by ``stash
    verify``, then served: each ``owners`` label's memory's text, read
    back with its token (``label`` is ``<token label>`` or ``<label>/<memory>``)."""
    fresh = tmp / "data"
    done = stash("restore", url, "--data", str(fresh), env=replica.env)
    assert done.returncode == 0, (done.stdout, done.stderr)
    users = len({token for label, token in owners.items() if "/" not in label})
    users_word = f"{users} user{'s' if users != 1 else ''}"
    assert f"{users_word} restored, 0 failed" in done.stdout, done.stdout
    checked = stash("verify", str(fresh), env={})
    assert checked.returncode == 0 and f"{users_word} checked, 0 failed" in checked.stdout, checked.stdout
    server = Server(data=fresh, log=tmp / "server.log", extra=["--file-cipher", "none", *CHEAP_KDF_FLAGS]).start()
    http = Http(server.url)
    try:
        out = {}
        for label, token in owners.items():
            if "/" in label:  # a second memory: what it wakes with
                resp = http.get(f"/m/{label.split('/')[1]}/wake", token)
                assert resp.status_code == 200, resp.text
                out[label] = resp.text
            else:
                out[label] = "\n".join(log_of(http, token))
        return out
    finally:
        server.stop()
        http.close()


@pytest.mark.slow
def test_every_user_and_memory_is_replicated_and_restored_whole(tmp_path: Path, replica: Replica):
    live = host(tmp_path / "host", replica)
    http = Http(live.url)
    try:
        a = http.init()
        http.ok("POST", "/note", a["token"], json={"text": "a note in main"})
        assert http.post("/memories", a["token"], json={"name": "proj"}).status_code == 201
        http.ok("POST", "/m/proj/note", a["token"], json={"text": "a note in proj"})
        b = http.init()  # a user made while replication runs
        http.ok("POST", "/note", b["token"], json={"text": "b's note"})
        wait_shipped(live.data, replica)
        assert ready(live.url).status_code == 200
        assert metric(live.url, "stash_replication_ready") == 1.0
    finally:
        live.kill9()
        http.close()
    if replica.seaweedfs is not None:  # own files only, each under the URL's path
        keys = replica.seaweedfs.keys(replica.bucket)
        assert keys and all(k.startswith("host-a/e1/") for k in keys), keys[:5]
        named = {k.split("/", 4)[3] for k in keys if k.startswith("host-a/e1/users/")}
        assert named == {a["user_id"], b["user_id"]}, named
        rels = {re.sub(r"/[0-9a-f]{4}/[^/]+$", "", k) for k in keys}
        assert {r.rsplit("/", 1)[1] for r in rels} == {"keyring.db", "memory.db", "roster.db"}, rels
    texts = restored_texts(
        tmp_path / "standby", replica, replica.url, {"a": a["token"], "a/proj": a["token"], "b": b["token"]}
    )
    assert "a note in main" in texts["a"] and "a note in proj" in texts["a/proj"] and "b's note" in texts["b"]


@pytest.fixture
def proxied(seaweedfs: SeaweedFS) -> Iterator[tuple[Replica, TcpProxy]]:
    proxy = TcpProxy(seaweedfs.s3_port)
    try:
        yield s3_replica(seaweedfs, proxy.endpoint), proxy
    finally:
        proxy.close()


@pytest.mark.slow
def test_an_unreachable_bucket_is_reported_and_nothing_is_lost_once_it_is_back(
    tmp_path: Path, proxied: tuple[Replica, TcpProxy], seaweedfs: SeaweedFS
):
    replica, proxy = proxied
    live = host(tmp_path / "host", replica)
    http = Http(live.url)
    try:
        owner = http.init()
        http.ok("POST", "/note", owner["token"], json={"text": "before the outage"})
        wait_shipped(live.data, replica)
        proxy.cut()
        for k in range(5):
            http.ok("POST", "/note", owner["token"], json={"text": f"during the outage {k}"})
        refused = wait_for(lambda: "cannot be reached" in (r := ready(live.url)).text and r)
        assert refused.status_code == 503 and refused.json()["error"] == "ready.replication", refused.text
        assert metric(live.url, 'stash_replication_errors{kind="unreachable"}') >= 1.0
        assert metric(live.url, "stash_replication_ready") == 0.0
        assert "127.0.0.1" not in refused.text and replica.bucket not in refused.text  # the kind, not the line
        proxy.restore()
        wait_shipped(live.data, replica)  # Litestream's retry reaches the bucket again, and ships the rest
    finally:
        live.kill9()
        http.close()
    texts = restored_texts(
        tmp_path / "standby", replica, seaweedfs.url(replica.bucket, "host-a/e1"), {"o": owner["token"]}
    )
    for text in ["before the outage", *(f"during the outage {k}" for k in range(5))]:
        assert text in texts["o"], text


@pytest.mark.slow
def test_keys_the_bucket_refuses_are_reported_as_such(tmp_path: Path, seaweedfs: SeaweedFS):
    replica = s3_replica(seaweedfs)
    live = host(tmp_path / "host", replica, env={"AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    http = Http(live.url)
    try:
        owner = http.init()
        http.ok("POST", "/note", owner["token"], json={"text": "never shipped"})
        refused = wait_for(lambda: "refuses its credentials" in (r := ready(live.url)).text and r)
        assert refused.status_code == 503 and refused.json()["error"] == "ready.replication", refused.text
        assert metric(live.url, 'stash_replication_errors{kind="credentials"}') >= 1.0
        assert "not-the-secret" not in refused.text + loopback.get(f"{live.url}/metrics", timeout=5).text
    finally:
        live.stop()
        http.close()
    assert not seaweedfs.keys(replica.bucket)


@pytest.mark.parametrize("missing", [("AWS_ACCESS_KEY_ID",), ("AWS_SECRET_ACCESS_KEY",), ()])
def test_an_s3_replica_without_keys_is_refused_at_once_naming_both(tmp_path: Path, missing: tuple[str, ...]):
    url = "s3://stash-fleet/host-a/e1?endpoint=http://127.0.0.1:9"
    keys = credentials()
    env = {k: v for k, v in child_env().items() if k not in keys}
    env |= {k: v for k, v in keys.items() if missing and k not in missing}
    for argv in (
        ["serve", "--replicate", url, "--data", str(tmp_path / "data")],
        ["replicate", url, "--data", str(tmp_path / "data")],
        ["restore", url, "--data", str(tmp_path / "fresh")],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "stash", *argv],
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
            env=env,
            check=False,
        )
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert "AWS_ACCESS_KEY_ID" in done.stderr and "AWS_SECRET_ACCESS_KEY" in done.stderr, done.stderr
    assert not (tmp_path / "fresh").exists()
