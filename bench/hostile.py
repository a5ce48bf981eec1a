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

import _repo  # noqa: F401  (the repository root on sys.path)
import httpx
from run import asgi_inprocess, bogus_tokens, scrape, serve

from tests.support.forgery import FLOOD, FLOOD_BODY, forged_import, rss_bytes
from tests.support.server import Server

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
        out.append((kind, mean, statistics.median(times)))
    # The same refusals with the app called straight from one event loop: the
    # code's own cost, without the socket, the HTTP parser and the host's noise.
    in_app = asgi_inprocess(server.data, user_id, n)
    return [
        "| refusal (GET /wake) | mean server time | median round trip | inside the app, no HTTP: server time "
        "(mean) / whole call (best of 3 means) | requests |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {kind} | {mean * 1000:.3f} ms | {rt * 1000:.2f} ms | "
            f"{in_app[f'GET /wake, bogus token: {kind} (server time)'] * 1000:.3f} / "
            f"{in_app[f'GET /wake, bogus token: {kind}'] * 1000:.3f} ms | {n} |"
            for kind, mean, rt in out
        ),
    ]


def flood(server: Server, client: httpx.Client, victim: str, rounds: int, seconds: float, pause: float) -> list[str]:
    """Waves of FLOOD concurrent forged 15 MiB imports for ``seconds``, each
    wave ``pause`` seconds after the last ended (0: at once), while the victim
    wakes and the server's RSS is sampled."""
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
    watchers = [threading.Thread(target=sample), threading.Thread(target=victim_wakes)]
    for t in watchers:
        t.start()
    t0 = time.perf_counter()
    waves = 0
    while time.perf_counter() - t0 < seconds:
        deadline = time.monotonic() + 60
        threads = [
            threading.Thread(target=forged_import, args=(server.port, victim, results, deadline)) for _ in range(FLOOD)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        waves += 1
        time.sleep(pause)
    took = time.perf_counter() - t0
    stop.set()
    for t in watchers:
        t.join()
    return [
        f"- {waves} waves of {FLOOD} concurrent forged imports of {FLOOD_BODY // MIB} MiB "
        f"({len(results)} in all, over {took:.1f} s, {pause:g} s between waves): answers {sorted(set(results))}",
        f"- server RSS {before / MIB:.1f} MiB before, {peak[0] / MIB:.1f} MiB at peak: "
        f"growth {(peak[0] - before) / MIB:.1f} MiB (limit 64 MiB)",
        f"- victim wake median idle {idle:.2f} ms (max {idle_max:.1f}); during the flood "
        f"{statistics.median(during) * 1000:.2f} ms over {len(during)} wakes (max {max(during) * 1000:.1f}): "
        f"{statistics.median(during) * 1000 / idle:.2f}x idle",
    ]


def recalls(
    server: Server,
    client: httpx.Client,
    victim: str,
    rounds: int,
    memories: int,
    seconds: float,
    at_once: bool,
    flooders: int = 8,
) -> list[str]:
    """A tenant with ``memories`` long memories keeps ``flooders`` recalls of
    a DFA-defeating pattern going for ``seconds``: each resent when answered,
    after Retry-After on a 429 (or at once with ``at_once``: a client that
    ignores it)."""
    flooder = client.post("/init", json={}).json()["token"]
    filler = "e" * 240
    for start in range(0, memories, 25_000):
        entries = [
            {"date": "2024-01-01", "text": f"memory {k} {filler}"} for k in range(start, min(memories, start + 25_000))
        ]
        r = client.post("/import", headers=bearer(flooder), json={"entries": entries}, timeout=600)
        if r.status_code != 200:
            raise RuntimeError(f"import answered {r.status_code}: {r.text[:200]}")
    idle, idle_max = wake_median(client, victim, rounds)
    stop = threading.Event()
    statuses: dict[str, int] = {}
    recall_s: list[float] = []
    lock = threading.Lock()

    def flood() -> None:
        with httpx.Client(base_url=server.url, timeout=120, trust_env=False) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                r = c.post("/recall", headers=bearer(flooder), json={"q": "e.{200}"})
                key = str(r.status_code) if r.status_code == 200 else f"{r.status_code} {r.json()['error']}"
                with lock:
                    statuses[key] = statuses.get(key, 0) + 1
                    if r.status_code == 200:
                        recall_s.append(time.perf_counter() - t0)
                if r.status_code == 429 and not at_once:
                    stop.wait(int(r.headers["retry-after"]))

    threads = [threading.Thread(target=flood) for _ in range(flooders)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    during = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        r = client.get("/wake", headers=bearer(victim))
        during.append(time.perf_counter() - t0)
        if r.status_code != 200:
            raise RuntimeError(f"the victim's wake answered {r.status_code}")
    stop.set()
    for t in threads:
        t.join()
    med = statistics.median(during) * 1000
    return [
        f'- flooder: {memories:,} memories, {flooders} concurrent POST /recall {{"q": "e.{{200}}"}} for '
        f"{seconds:.0f} s, resent {'at once' if at_once else 'after Retry-After'}: "
        f"answers {dict(sorted(statuses.items()))}; a recall that ran took "
        f"{statistics.median(recall_s):.2f} s (median)"
        if recall_s
        else "- no recall ran",
        f"- victim wake median idle {idle:.2f} ms (max {idle_max:.1f}); during the flood {med:.2f} ms over "
        f"{len(during)} wakes (p95 {sorted(during)[int(len(during) * 0.95)] * 1000:.1f}, max "
        f"{max(during) * 1000:.1f}): {med / idle:.2f}x idle",
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
    p.add_argument("--only", choices=("refusals", "flood", "recalls", "disk"), default=None)
    p.add_argument("--memories", type=int, default=100_000, help="the recall flooder's memories")
    p.add_argument("--seconds", type=float, default=20.0, help="how long the recall flood lasts")
    p.add_argument("--flood-seconds", type=float, default=10.0, help="how long the forged-import flood lasts")
    p.add_argument("--flood-pause", type=float, default=0.0, help="seconds between waves of forged imports")
    p.add_argument("--at-once", action="store_true", help="the recall flooder ignores Retry-After")
    p.add_argument("--n", type=int, default=2000, help="refusals per kind")
    p.add_argument("--rounds", type=int, default=200, help="idle wakes for the median")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stash-hostile-") as root:
        server = serve(Path(root) / "data", Path(root) / "server.log")
        out = [
            f"Command: python bench/hostile.py {' '.join(sys.argv[1:] if argv is None else argv)}; server: "
            f"{server.command}",
            "",
        ]
        try:
            with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as client:
                owner = client.post("/init", json={}).json()["token"]
                for k in range(5):
                    client.post("/note", headers=bearer(owner), json={"text": f"victim memory {k}"})
                client.get("/wake", headers=bearer(owner))
                if args.only in (None, "refusals"):
                    out += refusals(server, client, owner, args.n) + [""]
                if args.only in (None, "flood"):
                    out += flood(server, client, owner, args.rounds, args.flood_seconds, args.flood_pause) + [""]
                if args.only in (None, "recalls"):
                    out += recalls(server, client, owner, args.rounds, args.memories, args.seconds, args.at_once) + [""]
                if args.only in (None, "disk"):
                    out += disk(Path(root) / "data", client) + [""]
        finally:
            server.stop()
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
