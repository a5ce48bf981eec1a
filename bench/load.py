"""Sustained load on a real ``stash serve`` over loopback.

Starts the server as an operator would, mints USERS identities through
``POST /init``, then runs PROCS load-generator processes, each holding CONNS
keep-alive connections on one asyncio event loop (raw HTTP/1.1, so the
generator costs the shared cores little: see :class:`Conn`). Every connection
picks a random user and a random operation from the mix (wake, note, nap,
recall) as fast as the server answers; a note whose answer carries a due nap is followed by the nap
that settles it, as an agent would. Meanwhile the parent samples the server's
resident memory (every process of it, from /proc) once a second.

The report gives, per window of WINDOW seconds: requests per second, p50 /
p95 / p99 latency, errors, and the server's RSS; then each operation over the
whole run; then the first window against the last, which is where growth in
memory or latency would show.

    python bench/load.py --quick           # about 30 s: 4 connections, 8 users, 10 s windows
    python bench/load.py                   # 10 minutes, 1-minute windows, 50 users
    python bench/load.py --duration 1800 --workers 2

Numbers, never assertions: nothing here passes or fails. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import math
import multiprocessing
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from collections import defaultdict
from pathlib import Path

import _repo  # noqa: F401  (the repository root on sys.path)
import httpx
import orjson

from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.server import Server, live_group_members

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DEFAULT_ROOT = Path("/tmp/stash-load")
MIX = {"wake": 40, "note": 30, "nap": 10, "recall": 20}
RECALL_PATTERNS = ("deploy", "green|red", "note [0-9]+7", "zebra")
WORDS = ("deploy", "green", "red", "cache", "schema", "release", "rollback", "index", "user", "build")
REQUEST_TIMEOUT = 60.0
CONNECT_GAP_S = 0.02  # between the openings of two connections of one generator
LIMIT = "1000000000"  # per-address limits: every generator is 127.0.0.1


def percentile(sorted_xs: list[float], q: float) -> float:
    """Nearest rank."""
    if not sorted_xs:
        return float("nan")
    k = max(0, min(len(sorted_xs) - 1, math.ceil(q * len(sorted_xs)) - 1))
    return sorted_xs[k]


# ---------------------------------------------------------------- server


def start_server(data: Path, log: Path, workers: int, cheap_kdf: bool, tree: Path | None = None) -> Server:
    """``stash serve`` through the tests' launcher, from this checkout, or with
    ``tree`` from another checkout of the repository (run there, its
    ``stash`` package first on the path)."""
    extra = ["--workers", str(workers), *(CHEAP_KDF_FLAGS if cheap_kdf else ())]
    server = Server(data, log, extra=extra, limits=["--init-per-minute", LIMIT, "--auth-failures-per-minute", LIMIT])
    if tree is not None:
        server.cwd, server.env = tree, {"PYTHONPATH": str(tree)}
    return server.start()


def server_cpu(pgid: int) -> float:
    """User plus system CPU seconds of every live process of the server's group."""
    total = 0
    for pid in live_group_members(pgid):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def server_rss(pgid: int) -> int:
    """Resident bytes of every process in the server's group (its workers too)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            for line in (stat.parent / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            continue
    return total


# ---------------------------------------------------------------- generators


class Conn:
    """One keep-alive HTTP/1.1 connection on raw asyncio streams.

    The generator must cost the two cores next to nothing, or it measures
    itself: httpx in threads spent more CPU per request than the server
    (bench/HISTORY.md, goal 4). This sends prebuilt bytes and reads only the
    status, Content-Length and Connection headers; it reconnects when the
    server closes (a refusal before a body is read closes the connection)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, target: str, token: str, body: bytes | None = None) -> tuple[int, dict, float]:
        """(status, JSON body, Retry-After seconds) of one request."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = f"{method} {target} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {token}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + (body or b""))
        assert self.reader is not None
        try:
            status = int((await self.reader.readline()).split()[1])
            length, close, retry = 0, False, 0.0
            while (line := await self.reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"connection":
                    close = value.strip().lower() == b"close"
                elif name == b"retry-after":
                    retry = float(value)
            data = orjson.loads(await self.reader.readexactly(length)) if length else {}
        except (IndexError, ValueError, asyncio.IncompleteReadError, ConnectionError):
            self.close()
            raise ConnectionError("the connection broke mid-answer") from None
        if close:
            self.close()
        return status, data if isinstance(data, dict) else {}, retry

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def generator(
    url: str, tokens: list[str], conns: int, start: float, end: float, window: float, seed: int, results
) -> None:
    """One load process: CONNS connections on one event loop until ``end``;
    latencies by (window, op). A ``429`` is counted apart (``busy``) and its
    ``Retry-After`` waited out on that connection, as the stash client does."""
    lat: dict[tuple[int, str], list[float]] = defaultdict(list)
    errors: dict[tuple[int, str], int] = defaultdict(int)
    busy: dict[tuple[int, str], int] = defaultdict(int)
    conflicts: dict[int, int] = defaultdict(int)
    ops, weights = zip(*MIX.items())
    parsed = urllib.parse.urlsplit(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80

    def window_of(t: float) -> int:
        return int((t - start) // window)

    async def timed(conn: Conn, op: str, method: str, target: str, tok: str, body: bytes | None = None):
        t0 = time.monotonic()
        try:
            status, data, retry = await asyncio.wait_for(conn.request(method, target, tok, body), REQUEST_TIMEOUT)
        except (TimeoutError, OSError):
            conn.close()
            errors[(window_of(time.monotonic()), op)] += 1
            return None, {}
        t1 = time.monotonic()
        w = window_of(t1)
        if status == 429:
            busy[(w, op)] += 1
            await asyncio.sleep(min(retry or 1.0, max(0.0, end - time.monotonic())))
            return status, data
        # a wake that finds a summary missing is a correct answer (409); the nap it names follows;
        # another connection may have settled a nap first or made a smaller block due
        ok = status == 200 or (status == 409 and data.get("error") in ("wake.needs_nap", "nap.wrong_block"))
        if ok:
            lat[(w, op)].append(t1 - t0)
        else:
            errors[(w, op)] += 1
        if status == 409 and data.get("error") == "wake.needs_nap":
            conflicts[w] += 1
        return status, data

    async def run(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        conn = Conn(host, port)
        # Connections arrive one at a time, as clients do over a day. All at
        # once, the first --workers process to wake accepts every pending one
        # in a single pass (uvicorn accepts up to its backlog per wake-up) and
        # keeps them: with two workers, 90 % and 11 % of a core.
        await asyncio.sleep(max(0.0, start - time.monotonic()) + k * CONNECT_GAP_S)
        n = 0
        while time.monotonic() < end:
            tok = rng.choice(tokens)
            op = rng.choices(ops, weights)[0]
            if op == "wake":
                status, data = await timed(conn, op, "GET", "/wake", tok)
            elif op == "note":
                words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
                status, data = await timed(
                    conn, op, "POST", "/note", tok, orjson.dumps({"text": f"g{seed} note {n} {words}"})
                )
            elif op == "nap":
                status, data = await timed(conn, op, "POST", "/nap", tok, b"{}")
            else:
                q = urllib.parse.quote(rng.choice(RECALL_PATTERNS))
                status, data = await timed(conn, op, "GET", f"/recall?q={q}", tok)
            n += 1
            nap = data.get("nap") if status in (200, 409) else None
            for _ in range(8):  # settle what is due, as an agent would
                if not isinstance(nap, dict) or time.monotonic() >= end:
                    break
                body = orjson.dumps({"block": nap["block"], "text": f"summary of {nap['block']}: {rng.choice(WORDS)}"})
                status, data = await timed(conn, "nap", "POST", "/nap", tok, body)
                nap = data.get("nap") if status == 200 else None
        conn.close()

    async def main() -> None:
        await asyncio.gather(*(run(k) for k in range(conns)))

    asyncio.run(main())
    results.put((dict(lat), dict(errors), dict(busy), dict(conflicts)))


# ---------------------------------------------------------------- report


def report(args, lat, errors, busy, conflicts, rss: list[tuple[float, int]], windows: int, started: str) -> str:
    out = [f"# Stash load test, {started}", ""]
    out.append(
        f"{platform.node() or 'host'}: {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"server `--workers {args.workers}`{', cheap KDF (t=1, 8 KiB)' if args.cheap_kdf else ''}; "
        f"{args.users} users; {args.procs} generator process(es) x {args.conns} keep-alive connections "
        f"(raw asyncio HTTP/1.1); mix {', '.join(f'{k} {v}%' for k, v in MIX.items())} (plus the naps "
        f"notes bring due); {args.duration:g} s in windows of {args.window:g} s. Requests/s counts "
        f"answered requests (200, and the 409s of a wake or nap race); 429s are counted apart and "
        f"their Retry-After waited out."
    )
    out += [
        "",
        "| window | requests/s | p50 ms | p95 ms | p99 ms | errors | 429 busy | 409 needs_nap | server RSS MiB (max) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    per_window = []
    for w in range(windows):
        xs = sorted(x for (ww, _), v in lat.items() if ww == w for x in v)
        errs = sum(n for (ww, _), n in errors.items() if ww == w)
        refused = sum(n for (ww, _), n in busy.items() if ww == w)
        mem = [b for t, b in rss if w * args.window <= t < (w + 1) * args.window]
        row = len(xs) / args.window, percentile(xs, 0.5), percentile(xs, 0.95), percentile(xs, 0.99), errs
        per_window.append((*row, max(mem) if mem else 0))
        lo, hi = w * args.window, (w + 1) * args.window
        out.append(
            f"| {lo:g}-{hi:g} s | {row[0]:.1f} | {row[1] * 1e3:.1f} | {row[2] * 1e3:.1f} | "
            f"{row[3] * 1e3:.1f} | {errs} | {refused} | {conflicts.get(w, 0)} | "
            f"{(max(mem) if mem else 0) / 2**20:.1f} |"
        )
    out += [
        "",
        "| operation | requests | p50 ms | p95 ms | p99 ms | errors | 429 busy |",
        "|---|---|---|---|---|---|---|",
    ]
    for op in (*MIX, "all"):
        xs = sorted(x for (_, o), v in lat.items() if op in (o, "all") for x in v)
        errs = sum(n for (_, o), n in errors.items() if op in (o, "all"))
        refused = sum(n for (_, o), n in busy.items() if op in (o, "all"))
        out.append(
            f"| {op} | {len(xs)} | {percentile(xs, 0.5) * 1e3:.1f} | {percentile(xs, 0.95) * 1e3:.1f} | "
            f"{percentile(xs, 0.99) * 1e3:.1f} | {errs} | {refused} |"
        )
    total = sum(len(v) for v in lat.values())
    out += [
        "",
        f"Sustained: {total / args.duration:.1f} requests/s answered over {args.duration:g} s, "
        f"{sum(errors.values())} errors, {sum(busy.values())} answered 429 busy.",
    ]
    if len(per_window) >= 2:
        first, last = per_window[0], per_window[-1]
        out.append(
            f"First window against last: {first[0]:.1f} -> {last[0]:.1f} requests/s, "
            f"p50 {first[1] * 1e3:.1f} -> {last[1] * 1e3:.1f} ms, "
            f"p99 {first[3] * 1e3:.1f} -> {last[3] * 1e3:.1f} ms, "
            f"RSS {first[5] / 2**20:.1f} -> {last[5] / 2**20:.1f} MiB."
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Sustained mixed load on a real stash serve (see bench/README.md).")
    p.add_argument("--quick", action="store_true", help="30 s, 10 s windows, 8 users, 2 generators x 2")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    p.add_argument("--window", type=float, default=60.0, help="seconds per report row (default 60)")
    p.add_argument("--users", type=int, default=50)
    p.add_argument("--procs", type=int, default=1, help="load-generator processes")
    p.add_argument("--conns", type=int, default=16, help="keep-alive connections per generator process")
    p.add_argument("--workers", type=int, default=1, help="stash serve --workers")
    p.add_argument(
        "--cheap-kdf",
        action="store_true",
        help="the tests' cheapest argon2id (tests/support/api.py CHEAP_KDF) for the users' grants",
    )
    p.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="data folder parent (deleted unless --keep)")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument(
        "--compare",
        type=Path,
        default=None,
        metavar="TREE",
        help="first run the same load against the server of another checkout (e.g. a `git worktree` "
        "of an older commit), then against this one, and report both and the ratio",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.window, args.users, args.procs, args.conns = 30.0, 10.0, 8, 1, 4
    windows = max(1, round(args.duration / args.window))
    args.duration = windows * args.window
    out = args.out or RESULTS / f"{dt.date.today().isoformat()}-load{'-quick' if args.quick else ''}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.compare is None:
        text, _ = run_once(args, windows, None)
    else:
        old, old_rate = run_once(args, windows, args.compare.resolve())
        new, new_rate = run_once(args, windows, None)
        rev = subprocess.run(
            ["git", "-C", str(args.compare), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip() or str(args.compare)
        text = (
            f"# Load: the server at {rev} against this checkout, same load, one run\n\n"
            f"Sustained requests/s: {old_rate:.1f} (at {rev}) -> {new_rate:.1f} (this checkout), "
            f"{new_rate / old_rate:.2f}x.\n\n## At {rev}\n\n"
            + old.split("\n", 2)[2]
            + "\n## This checkout\n\n"
            + new.split("\n", 2)[2]
        )
    print(text)
    out.write_text(text)
    print(f"written to {out}")
    return 0


def run_once(args, windows: int, tree: Path | None) -> tuple[str, float]:
    root = args.root / f"run-{os.getpid()}-{'old' if tree else 'new'}"
    root.mkdir(parents=True, exist_ok=False)
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    server = start_server(root / "data", root / "server.log", args.workers, args.cheap_kdf, tree)
    proc, url = server.proc, server.url
    try:
        tokens = []
        with httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT, trust_env=False) as http:
            for _ in range(args.users):
                resp = http.post("/init", json={})
                resp.raise_for_status()
                tokens.append(resp.json()["token"])
        print(f"{args.users} users on {url}; {args.duration:g} s of load", flush=True)

        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        start = time.monotonic() + 2.0  # every generator is up before the clock starts
        end = start + args.duration
        # tokens travel over the pipe to each generator, never on a command line
        gens = [
            ctx.Process(target=generator, args=(url, tokens, args.conns, start, end, args.window, k, results))
            for k in range(args.procs)
        ]
        for g in gens:
            g.start()
        rss: list[tuple[float, int]] = []
        while time.monotonic() < start:
            time.sleep(0.05)
        cpu_start = server_cpu(proc.pid)
        while (now := time.monotonic()) < end:
            rss.append((now - start, server_rss(proc.pid)))
            time.sleep(1.0)
        cpu_used = server_cpu(proc.pid) - cpu_start
        lat: dict[tuple[int, str], list[float]] = defaultdict(list)
        errors: dict[tuple[int, str], int] = defaultdict(int)
        busy: dict[tuple[int, str], int] = defaultdict(int)
        conflicts: dict[int, int] = defaultdict(int)
        for _ in gens:
            got_lat, got_err, got_busy, got_conf = results.get(timeout=REQUEST_TIMEOUT + 30)
            for k, v in got_busy.items():
                if k[0] < windows:
                    busy[k] += v
            for k, v in got_lat.items():
                if k[0] < windows:  # a request that ended after the clock is not counted
                    lat[k] += v
            for k, v in got_err.items():
                if k[0] < windows:
                    errors[k] += v
            for k, v in got_conf.items():
                conflicts[k] += v
        for g in gens:
            g.join(timeout=30)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    total = sum(len(v) for v in lat.values())
    text = report(args, lat, errors, busy, conflicts, rss, windows, started)
    # CPU per answer does not depend on what else the host runs, as requests/s does.
    text += (
        f"Server CPU: {cpu_used:.1f} s over the run, {cpu_used / max(1, total) * 1e3:.2f} ms per answered "
        f"request ({cpu_used / args.duration:.2f} cores busy).\n"
    )
    return text, total / args.duration


if __name__ == "__main__":
    sys.exit(main())
