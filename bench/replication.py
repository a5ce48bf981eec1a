"""Replication with Litestream: lag, restore time, and what Litestream costs
the host. A real ``stash serve --replicate`` on loopback with a folder replica.

1. Lag: background writers note steadily to ``--users`` users; a probe user
   notes once every ``--spacing`` seconds, and each probe's lag is the time
   from its acknowledgement to the first new LTX file of its memory.db in the
   replica (the replica's listing polled every 5 ms).
2. Cost: CPU seconds of the Litestream process and of the server over the run,
   and the replica's bytes against the data folder's.
3. Restore: the server is stopped and ``stash restore`` brings every user back
   into a fresh folder, timed whole and per user.

With ``--idle``, instead: Litestream's CPU and replica growth over 10 s on
``--users`` idle users of 5 memories, under its default checkpoints, under
the passive checkpoint each interval that ``stash replicate`` configures, and
under a truncate after every sync (``truncate-page-n: 1``).

    python bench/replication.py --users 100 --memories 100 --probes 100 --spacing 0.3
    python bench/replication.py --idle --users 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _repo  # noqa: F401  (puts the checkout on sys.path)
import httpx

from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.server import REPO, Http, Server


def cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def litestream_pid(server_pid: int) -> int | None:
    for stat in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            cmd = stat.read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"litestream") and b"replicate" in cmd:
            return int(stat.parent.name)
    return None


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def ltx_count(folder: Path) -> int:
    try:
        return len(os.listdir(folder))
    except OSError:
        return 0


CHECKPOINTS = {
    "Litestream's defaults": {},
    "stash replicate's earlier (passive, any WAL with a frame)": {
        "min-checkpoint-page-count": 1,
        "checkpoint-interval": "1s",
    },
    "stash replicate's (passive, each interval after a write)": {"checkpoint-interval": "1s"},
    "truncate after every sync": {"truncate-page-n": 1, "min-checkpoint-page-count": 1, "checkpoint-interval": "1s"},
}


def idle(users: int) -> None:
    import json

    from stash.service.ops import replica

    tmp = Path(tempfile.mkdtemp(prefix="stash-repl-idle-"))
    server = Server(
        data=tmp / "data", log=tmp / "server.log", extra=["--file-cipher", "none", *CHEAP_KDF_FLAGS]
    ).start()
    http = Http(server.url)
    for _ in range(users):
        token = http.init()["token"]
        for k in range(5):
            http.ok("POST", "/note", token, json={"text": f"note {k}"})
    server.stop()
    for name, settings in CHECKPOINTS.items():
        rep = tmp / f"replica-{len(name)}"
        cfg = replica.config(tmp / "data", replica.Target.parse(str(rep)), "1s")
        for entry in cfg["dbs"][:-1]:  # every user file; the roster stays as it is
            for key in ("truncate-page-n", "min-checkpoint-page-count", "checkpoint-interval"):
                entry.pop(key, None)
            entry.update(settings)
        (tmp / "litestream.yml").write_text(json.dumps(cfg))
        proc = subprocess.Popen(
            [replica.litestream_binary(), "replicate", "-config", str(tmp / "litestream.yml")],
            stderr=subprocess.DEVNULL,
        )
        time.sleep(4)
        c0, d0 = cpu_of(proc.pid), du(rep)
        time.sleep(10)
        c1, d1 = cpu_of(proc.pid), du(rep)
        proc.terminate()
        proc.wait(timeout=30)
        print(
            f"{users} idle users, {name}: litestream {c1 - c0:.2f} CPU-s in 10 s, replica grew "
            f"{(d1 - d0) / 1e6:.2f} MB",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=20)
    p.add_argument("--memories", type=int, default=200, help="memories noted to each user before the restore")
    p.add_argument("--probes", type=int, default=60)
    p.add_argument("--spacing", type=float, default=0.5)
    p.add_argument("--interval", default="1s", help="Litestream's sync interval (stash replicate --interval)")
    p.add_argument("--idle", action="store_true", help="only Litestream's cost on idle users, three checkpoint modes")
    args = p.parse_args(argv)
    if args.idle:
        idle(args.users)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="stash-repl-bench-"))
    replica = tmp / "replica"
    server = Server(
        data=tmp / "data",
        log=tmp / "server.log",
        extra=["--replicate", str(replica), *CHEAP_KDF_FLAGS],
        env={"STASH_REPLICATE_INTERVAL": args.interval},
    ).start()
    http = Http(server.url)
    users = [http.init() for _ in range(args.users)]
    probe = http.init()
    time.sleep(3)
    ls = litestream_pid(server.proc.pid)
    cpu0 = (cpu_of(ls) if ls else 0.0, server.cpu_seconds())
    stop = threading.Event()
    noted = [0]

    def writer(tokens: list[str]) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            while not stop.is_set():
                for t in tokens:
                    if noted[0] >= args.users * args.memories:
                        return
                    c.post("/note", json={"text": f"load {noted[0]}"}, headers={"Authorization": f"Bearer {t}"})
                    noted[0] += 1

    toks = [u["token"] for u in users]
    threads = [threading.Thread(target=writer, args=(toks[k::2],), daemon=True) for k in range(2)]
    for t in threads:
        t.start()
    l0 = replica / "users" / probe["user_id"] / "memory.db" / "ltx" / "0"
    lags = []
    t_run = time.monotonic()
    for _ in range(args.probes):
        before = ltx_count(l0)
        http.ok("POST", "/note", probe["token"], json={"text": "probe"})
        acked = time.monotonic()
        while ltx_count(l0) <= before and time.monotonic() - acked < 30:
            time.sleep(0.005)
        lags.append(time.monotonic() - acked)
        time.sleep(args.spacing)
    for t in threads:
        t.join()
    run_s = time.monotonic() - t_run
    cpu1 = (cpu_of(ls) if ls else 0.0, server.cpu_seconds())
    time.sleep(2)
    server.stop()
    lags.sort()
    print(
        f"lag over {len(lags)} probes (interval {args.interval}, {noted[0]} notes to {args.users} users meanwhile): "
        f"p50 {statistics.median(lags) * 1000:.0f} ms, p99 {lags[int(len(lags) * 0.99) - 1] * 1000:.0f} ms, "
        f"max {lags[-1] * 1000:.0f} ms"
    )
    print(
        f"CPU over {run_s:.1f} s: litestream {cpu1[0] - cpu0[0]:.2f} s, server main process {cpu1[1] - cpu0[1]:.2f} s"
    )
    print(f"disk: data folder {du(tmp / 'data') / 1e6:.1f} MB, replica {du(replica) / 1e6:.1f} MB")
    fresh = tmp / "restored"
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "stash", "restore", str(replica), "--data", str(fresh)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    took = time.monotonic() - t0
    n = args.users + 1
    print(
        f"restore: {n} users of ~{args.memories} memories in {took:.1f} s ({took / n * 1000:.0f} ms per user); "
        f"exit {done.returncode}; {done.stdout.strip().splitlines()[-1]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
