"""Replication costs what the writes cost, and is watched (service/ops/replica.py,
service/ops/replication_status.py, cli/supervise.py): a real ``stash serve
--replicate`` with the real ``litestream``.

- An idle user ships (nearly) nothing over a window: the configuration
  before this one shipped a transaction, and a whole file, every interval.
  Files dropped beside a user's own (``kitten.db``, ``memory.db.evil.db``)
  are not streamed.
- kill -9 of the ``stash replicate`` supervisor: the server is not ready
  until it is back, starts it again, and notes reach the replica again.
  kill -9 of Litestream alone: started again, counted in /metrics.
- A full replica (a small tmpfs): /health?ready=1 answers 503
  ``ready.replication`` and /metrics counts the error; SIGTERM then ends the
  server within Litestream's bounded shutdown sync (exit 0, not killed).
- ``stash replicate`` stopped and started again over the same users (as a
  fleet host does at each drain and each shard it gains) ships nothing of
  the roster, which lists every user already."""

from __future__ import annotations

import datetime as dt
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stash.service.access import Vault
from stash.service.ops import replica as replicas
from tests.support.api import CHEAP_KDF, CHEAP_KDF_FLAGS
from tests.support.installed import OUTSIDE, child_env
from tests.support.ops.replication import metric, ready, wait_for
from tests.support.server import Http, Server

pytestmark = pytest.mark.slow

INTERVAL = "100ms"
IDLE_WINDOW_S = 2.0
# What an idle window may ship: a stray transaction of Litestream's own.
IDLE_SHIPS_AT_MOST = 2048


def replicated(tmp: Path, replica: Path) -> Server:
    tmp.mkdir(parents=True, exist_ok=True)
    return Server(
        data=tmp / "data",
        log=tmp / "server.log",
        extra=["--replicate", str(replica), *CHEAP_KDF_FLAGS],
        env={"STASH_REPLICATE_INTERVAL": INTERVAL},
    ).start()


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def children(pid: int, word: bytes) -> list[int]:
    """The live processes whose parent is ``pid`` and whose command line holds ``word``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmd = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and word in cmd and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def opened(pid: int, path: Path) -> bool:
    """Whether process ``pid`` holds ``path`` open."""
    try:
        return any(os.readlink(fd) == str(path) for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


def l0(replica: Path, user_id: str) -> int:
    try:
        return len(os.listdir(replica / "users" / user_id / "memory.db" / "ltx" / "0"))
    except OSError:
        return 0


def test_idle_ships_nothing_a_killed_supervisor_or_litestream_comes_back_and_a_full_replica_shows(
    tmp_path: Path, small_tmpfs: Path
):
    replica = small_tmpfs / "replica"
    live = replicated(tmp_path / "host", replica)
    http = Http(live.url)
    try:
        owner = http.init()
        # Files that are not Stash's, as someone with write access to the folder drops them: never streamed.
        for name in ("kitten.db", "memory.db.evil.db"):
            dropped = sqlite3.connect(live.data / "users" / owner["user_id"] / name)
            dropped.execute("PRAGMA journal_mode = WAL")
            dropped.execute("CREATE TABLE t (x)")
            dropped.execute("INSERT INTO t VALUES ('not ours')")
            dropped.commit()
            dropped.close()
        for k in range(3):
            http.ok("POST", "/note", owner["token"], json={"text": f"before the idle window {k}"})
        wait_for(lambda: l0(replica, owner["user_id"]) and ready(live.url).status_code == 200)
        time.sleep(1.0)  # the notes' checkpoint and its own transaction shipped
        before = du(replica)
        time.sleep(IDLE_WINDOW_S)
        assert du(replica) - before <= IDLE_SHIPS_AT_MOST
        assert metric(live.url, "stash_replication_ready") == 1.0
        assert sorted(os.listdir(replica / "users" / owner["user_id"])) == ["keyring.db", "memory.db"]

        (supervisor,) = children(live.proc.pid, b"replicate")
        (litestream,) = children(supervisor, b"litestream")
        os.kill(supervisor, signal.SIGKILL)
        # Not ready while it is gone; its Litestream goes with it; then it is back.
        refused = wait_for(lambda: (r := ready(live.url)).status_code == 503 and r, timeout=10, pause=0.02)
        assert refused.json()["error"] == "ready.replication"
        wait_for(lambda: not Path(f"/proc/{litestream}").exists() or b"Z" in _state(litestream))
        again = wait_for(lambda: [p for p in children(live.proc.pid, b"replicate") if p != supervisor])
        assert "starting it again" in live.log_text()
        wait_for(lambda: ready(live.url).status_code == 200)
        shipped = l0(replica, owner["user_id"])
        http.ok("POST", "/note", owner["token"], json={"text": "after the supervisor came back"})
        wait_for(lambda: l0(replica, owner["user_id"]) > shipped)

        (litestream,) = wait_for(lambda: children(again[0], b"litestream"))
        os.kill(litestream, signal.SIGKILL)
        wait_for(lambda: metric(live.url, "stash_replication_restarts") >= 1.0)
        wait_for(lambda: [p for p in children(again[0], b"litestream") if p != litestream])
        wait_for(lambda: ready(live.url).status_code == 200)

        # The replica fills up: not ready, and counted.
        today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
        http.ok(
            "POST",
            "/import",
            owner["token"],
            json={
                "entries": [
                    {"date": today, "text": f"a line that will not fit in the replica {k} {os.urandom(8).hex()}"}
                    for k in range(4000)
                ]
            },
        )
        refused = wait_for(lambda: (r := ready(live.url)).status_code == 503 and r)
        assert refused.json()["error"] == "ready.replication" and "full" in refused.json()["message"]
        assert metric(live.url, 'stash_replication_errors{kind="disk_full"}') >= 1.0
        assert metric(live.url, "stash_replication_ready") == 0.0
    finally:
        http.close()
        live.proc.send_signal(signal.SIGTERM)
        # Within Litestream's shutdown sync (5 s) and the margins, never killed.
        assert live.proc.wait(timeout=30) == 0


def test_a_restart_ships_nothing_of_a_roster_that_lists_every_user(tmp_path: Path) -> None:
    """The roster is opened for writing only to list a user it lacks: a connection of ``stash replicate``'s
    start, closed as the file's last, folded its WAL in and removed it, and Litestream, started next, found
    the WAL gone and shipped the whole roster again as a new transaction, at every restart (bench/HISTORY.md,
    "Issue 45: an idle fleet host and its roster"). A user made after the restart is listed, and shipped, as
    before: one transaction more at most (Litestream ships what a sync finds in one)."""
    data, replica = tmp_path / "data", tmp_path / "replica"
    vault = Vault(data, CHEAP_KDF, file_cipher="none")
    users = [vault.create_identity().user_id for _ in range(2)]
    roster = replica / "roster.db" / "ltx" / "0"
    argv = [sys.executable, "-m", "stash", "replicate", "--data", str(data), str(replica)]
    env = {**child_env(), "STASH_REPLICATE_INTERVAL": INTERVAL}

    def listed() -> set[str]:
        try:
            return {u for u, _ in replicas.replica_users(replicas.Target.parse(str(replica)), tmp_path)}
        except replicas.ReplicaError:
            return set()

    def run() -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, cwd=OUTSIDE, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    first = run()
    try:
        wait_for(lambda: listed() == set(users))
    finally:
        first.terminate()
        assert first.wait(timeout=30) == 0  # its final sync shipped everything
    shipped = sorted(os.listdir(roster))
    wal = data / f"{replicas.ROSTER}-wal"  # where Litestream left off: kept, it has nothing new to ship
    kept = os.stat(wal).st_ino
    again = run()
    try:
        # Once the restarted Litestream holds the roster open, a user is made: shipped by it, the event waited
        # for. (Made before, it is listed by a connection that is the roster's last again.)
        wait_for(lambda: any(opened(pid, data / replicas.ROSTER) for pid in children(again.pid, b"litestream")))
        made = vault.create_identity().user_id
        wait_for(lambda: listed() == {*users, made} and (replica / "users" / made / "keyring.db").is_dir())
        assert os.stat(wal).st_ino == kept  # never removed, so never shipped whole again
        assert len(os.listdir(roster)) <= len(shipped) + 1, (shipped, sorted(os.listdir(roster)))
    finally:
        again.terminate()
        again.wait(timeout=30)


def _state(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return b"Z"


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip("this machine cannot mount a tmpfs (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
