"""A hostile tenant against a real ``stash serve`` on loopback (issue 11):
what it costs the server and the other tenants, in numbers.

    python bench/hostile.py                 # every section, about two minutes
    python bench/hostile.py --only refusals # one section: refusals, flood, recalls, disk

- refusals: the two pre-auth refusals, a well-formed token of an unknown
  user and a wrong secret for a real user: mean server time (from /metrics)
  and median round trip, each over N requests.
- flood: sixteen concurrent 15 MiB POST /import with forged tokens for a real
  user id: the server's RSS growth, and a victim's wake median, idle and
  during the flood.
- recalls: a tenant with many memories floods slow recalls; the victim's wake
  median idle and during it, and what the flooder is answered.
- disk: the bytes an empty identity costs on disk.

Numbers, never assertions. See bench/README.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from run import Server, bogus_tokens, scrape

from tests.e2e.test_preauth_flood import FLOOD, FLOOD_BODY, forged_import, rss_bytes

MIB = 1 << 20


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def wake_median(client: httpx.Client, token: str, n: int) -> tuple[float, float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.get("/wake", headers=bearer(token))
        times.append(time.perf_counter() - t0)
        if r.status_code != 200:
            raise RuntimeError(f"the victim's wake answered {r.status_code}")
    return statistics.median(times) * 1000, max(times) * 1000


def refusals(server: Server, client: httpx.Client, owner: str, n: int) -> list[str]:
    user_id = owner[7:23]
    out = []
    for kind in ("bad checksum", "unknown user", "wrong secret"):
        tokens = [bogus_tokens(user_id)[kind] for _ in range(n)]
        before = scrape(client)
        times = []
        for tok in tokens:
            t0 = time.perf_counter()
            r = client.get("/wake", headers=bearer(tok))
            times.append(time.perf_counter() - t0)
            assert r.status_code == 401, r.text
        after = scrape(client)
        key_n, key_s = ("GET", "/wake", "count"), ("GET", "/wake", "sum")
        mean = (after[key_s] - before.get(key_s, 0)) / (after[key_n] - before.get(key_n, 0))
        out.append(f"| {kind} | {mean * 1000:.3f} ms | {statistics.median(times) * 1000:.2f} ms | {n} |")
    return ["| refusal (GET /wake) | mean server time | median round trip | requests |", "|---|---:|---:|---:|",
            *out]


def flood(server: Server, client: httpx.Client, victim: str, rounds: int) -> list[str]:
    idle, idle_max = wake_median(client, victim, rounds)
    before = rss_bytes(server.proc.pid)
    peak = [before]
    stop = threading.Event()
    during: list[float] = []

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_bytes(server.proc.pid))
            time.sleep(0.01)

    def victim_wakes() -> None:
        with httpx.Client(base_url=server.url, timeout=30, trust_env=False) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                c.get("/wake", headers=bearer(victim))
                during.append(time.perf_counter() - t0)

    results: list = []
    deadline = time.monotonic() + 60
    t0 = time.perf_counter()
    threads = [threading.Thread(target=forged_import, args=(server.port, victim, results, deadline))
               for _ in range(FLOOD)]
    watchers = [threading.Thread(target=sample), threading.Thread(target=victim_wakes)]
    for t in watchers + threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    stop.set()
    for t in watchers:
        t.join()
    return [
        f"- {FLOOD} forged imports of {FLOOD_BODY // MIB} MiB: answers {sorted(set(results))}, all in {took:.2f} s",
        f"- server RSS {before / MIB:.1f} MiB before, {peak[0] / MIB:.1f} MiB at peak: "
        f"growth {(peak[0] - before) / MIB:.1f} MiB (limit 64 MiB)",
        f"- victim wake median idle {idle:.2f} ms (max {idle_max:.1f}); during the flood "
        f"{statistics.median(during) * 1000:.2f} ms over {len(during)} wakes (max {max(during) * 1000:.1f})",
    ]


def disk(data: Path, client: httpx.Client, n: int = 20) -> list[str]:
    users = data / "users"

    def size() -> int:
        return sum(p.stat().st_size for p in users.rglob("*") if p.is_file())

    before = size()
    for _ in range(n):
        client.post("/init", json={})
    per = (size() - before) / n
    return [f"- an empty identity: {per / 1024:.1f} KiB on disk (mean of {n} fresh identities, files at rest)"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=("refusals", "flood", "disk"), default=None)
    p.add_argument("--n", type=int, default=2000, help="refusals per kind")
    p.add_argument("--rounds", type=int, default=200, help="idle wakes for the median")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stash-hostile-") as root:
        server = Server(Path(root) / "data", Path(root) / "server.log")
        out = [f"Command: python bench/hostile.py{' --only ' + args.only if args.only else ''}; server: "
               f"{server.command}", ""]
        try:
            with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as client:
                owner = client.post("/init", json={}).json()["token"]
                for k in range(5):
                    client.post("/note", headers=bearer(owner), json={"text": f"victim memory {k}"})
                client.get("/wake", headers=bearer(owner))
                if args.only in (None, "refusals"):
                    out += refusals(server, client, owner, args.n) + [""]
                if args.only in (None, "flood"):
                    out += flood(server, client, owner, args.rounds) + [""]
                if args.only in (None, "disk"):
                    out += disk(Path(root) / "data", client) + [""]
        finally:
            server.stop()
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
