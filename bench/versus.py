"""Stash against a memo stand-in, side by side, one process per agent call.

An agent calls its memory from a shell: for memo that is a fresh ``memo``
process over the plaintext folder, for Stash a fresh ``curl`` process against
a warm ``stash serve``. This script times exactly those two things, on the
same log (the Stash store and its OptMem-layout copy hold the same memories and
summaries), interleaved call by call so that load on the machine falls on both
alike, and checks that both give the same lines.

    python bench/versus.py --sizes 100000,1000000

The stores are built once per size and kept under ``bench/results/`` (git
ignored): ``store-<T>/data`` (the Stash data folder), ``store-<T>/memo`` (the
OptMem folder, written from the store by a read-only session, as ``GET
/export`` writes it) and ``store-<T>/owner-token`` (mode 0600: the owner token
of this synthetic store, kept so later runs can reuse it). Notes and naps
appended by a run go to both copies alike, so the pair stays in step; ``--fresh``
rebuilds. Each run mints a new ``full`` grant at the current default argon2id
cost and uses it for every Stash call, so the KDF measured is the current one.

The curl processes read the Authorization header from a 0600 file in a
private temporary folder (``-H @file``), never from their command line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _repo  # noqa: F401  (the repository root on sys.path)
import httpx
import orjson
from build import RARE_WORD, build, verify
from run import serve

from stash.service.access import Vault
from stash.service.export import LOG_REC, TREE_REC, _record
from tests.support.server import Server

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
STANDIN = HERE / "memo_standin.py"
COMMON = "deploy.*green"
HEALTH = "`curl /health` (a bare round trip)"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the pair of stores


def write_memo_folder(data: Path, token: str, out: Path) -> int:
    """The OptMem folder of the store, record for record as GET /export writes it."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "TREE").mkdir(parents=True)
    with Vault(data).session(token, "read") as s:
        mf = s.open_memory().mf
        T = mf.count()
        with open(tmp / "LOG.txt", "wb") as f:
            for batch in mf.scan(T):
                f.write(b"".join(_record(line, LOG_REC) for line in batch))
        for size in mf.level_sizes():
            (tmp / "TREE" / str(size)).write_bytes(b"".join(_record(t, TREE_REC) for t in mf.level(size)))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return T


def store_pair(T: int, fresh: bool) -> tuple[Path, Path, str, dict[str, float]]:
    """``(data, memo, owner token, build seconds)``, built once and reused."""
    root = RESULTS / f"store-{T}"
    data, memo, tok = root / "data", root / "memo", root / "owner-token"
    if fresh:
        shutil.rmtree(root, ignore_errors=True)
    secs: dict[str, float] = {}
    if not tok.exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        log(f"building a Stash store of {T:,} memories under {root}")
        built = build(data, T, progress=None)
        verify(built)
        secs.update(built.seconds)
        fd = os.open(tok, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(built.token)
    token = tok.read_text().strip()
    memo_T = os.path.getsize(memo / "LOG.txt") // LOG_REC if (memo / "LOG.txt").exists() else -1
    with Vault(data).session(token, "read") as s:
        stash_T = s.open_memory().mf.count()
    if memo_T != stash_T:
        log(f"writing the OptMem folder of {stash_T:,} memories")
        t0 = time.perf_counter()
        write_memo_folder(data, token, memo)
        secs["memo folder"] = time.perf_counter() - t0
    return data, memo, token, secs


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())


# ---------------------------------------------------------------- one call each way


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Calls:
    """One process per call. Wall time, and CPU time: the process's own
    (user + system, from the children's rusage) plus, for Stash, what the
    server spent meanwhile (``/proc/<pid>/stat``, 10 ms ticks), so a loaded
    machine cannot hide the work either side does."""

    def __init__(self, url: str, token: str, memo: Path, tmp: Path, server: Server) -> None:
        self.url = url
        self.server = server
        self.memo = memo
        self.auth = tmp / "auth"
        fd = os.open(self.auth, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"Authorization: Bearer {token}\n")
        self.times: dict[str, dict[str, list[float]]] = {}
        self.cpu: dict[str, dict[str, list[float]]] = {}

    def _timed(self, op: str, side: str, cmd: list[str]) -> bytes:
        s0, c0 = self.server.cpu_seconds(), children_cpu()
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, check=False)
        self.times.setdefault(op, {}).setdefault(side, []).append(time.perf_counter() - t0)
        cpu = children_cpu() - c0 + (self.server.cpu_seconds() - s0 if side == "stash" else 0.0)
        self.cpu.setdefault(op, {}).setdefault(side, []).append(cpu)
        if done.returncode:
            raise RuntimeError(f"{side} {op} failed ({done.returncode}): {done.stderr[:300]!r}")
        return done.stdout

    def stash(self, op: str, method: str, path: str, body: dict | None = None) -> dict:
        cmd = ["curl", "-sS", "-H", f"@{self.auth}", "-X", method]
        if body is not None:
            cmd += ["-H", "Content-Type: application/json", "--data-binary", orjson.dumps(body).decode()]
        cmd.append(self.url + path)
        return orjson.loads(self._timed(op, "stash", cmd))

    def memo_call(self, op: str, verb: str, *args: str) -> str:
        return self._timed(op, "memo", [sys.executable, str(STANDIN), str(self.memo), verb, *args]).decode()


def same(what: str, a: object, b: object, mismatches: list[str]) -> None:
    if a != b:
        mismatches.append(what)


def measure(T: int, data: Path, memo: Path, owner: str, reps: int, recall_reps: int) -> dict:
    with Vault(data).session(owner, "owner") as s:
        _, token = Vault(data).mint_grant(s, "full")
    mismatches: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="stash-versus-"))
    # The default quota is a million memories, which the largest store fills: the notes go past it.
    server = serve(data, tmp / "server.log", extra=("--quota-memories", str(2 * T + 10_000)))
    try:
        c = Calls(server.url, token, memo, tmp, server)
        with httpx.Client(base_url=server.url, trust_env=False, timeout=600) as warm:
            for _ in range(5):
                warm.get("/wake", headers={"Authorization": f"Bearer {token}"}).raise_for_status()
            # The first recall after a build (or an upgrade) renders every
            # piece of the recall cache from the log and writes it: timed
            # apart, once, since every later recall reads the cache.
            t0 = time.perf_counter()
            if recall_reps:
                warm.get(
                    f"/recall?q={RARE_WORD.lower()}", headers={"Authorization": f"Bearer {token}"}
                ).raise_for_status()
            first_recall = time.perf_counter() - t0
        # The floor of each side: starting the process at all.
        for _ in range(reps):
            c._timed("process start alone (`curl --version` / `python -c pass`)", "stash", ["curl", "--version"])
            c._timed(
                "process start alone (`curl --version` / `python -c pass`)", "memo", [sys.executable, "-c", "pass"]
            )
        log(f"T={T:,}: wake and zoom")
        blocks: list[str] = []
        for _ in range(reps):
            # A bare round trip to the same server by the same kind of process, taken in turn with
            # every call: the floor an agent's call is weighed against (the "× /health" column).
            c._timed(HEALTH, "stash", ["curl", "-sS", c.url + "/health"])
            w = c.stash("wake", "GET", "/wake")
            m = c.memo_call("wake", "wake")
            same("wake lines", w["lines"], m.split("\n--- awake ---\n")[0].split("\n"), mismatches)
            blocks = [line.split(" ", 1)[0][1:] for line in w["lines"] if "-" in line.split(" ", 1)[0]]
        for k in range(reps):
            c._timed(HEALTH, "stash", ["curl", "-sS", c.url + "/health"])
            b = blocks[k % len(blocks)]
            z = c.stash("zoom", "GET", f"/zoom?block={b}")
            m = c.memo_call("zoom", "zoom", b)
            same("zoom lines", z["lines"], m.rstrip("\n").split("\n"), mismatches)
        log(f"T={T:,}: note and nap")
        today = dt.datetime.now(dt.UTC).date().isoformat()
        for k in range(reps):
            c._timed(HEALTH, "stash", ["curl", "-sS", c.url + "/health"])
            text = f"versus note {k} on {today}: deploy went green after the cache fix"
            n = c.stash("note", "POST", "/note", {"text": text})
            c.memo_call("note", "note", text)
            nap = n["nap"]
            while nap is not None:
                block = nap["block"]
                summary = f"Summary of {block}: the versus notes, compressed."
                a = c.stash("nap", "POST", "/nap", {"block": block, "text": summary})
                m = c.memo_call("nap", "nap", block, summary)
                same("nap saved", m.startswith(f"saved {block}\n"), a["saved"] == block, mismatches)
                nap = a["nap"]
        log(f"T={T:,}: recall")
        recalls = {}
        for q, op in ((RARE_WORD.lower(), "recall (rare word)"), (COMMON, "recall (common pair)")):
            for _ in range(recall_reps):
                r = c.stash(op, "GET", f"/recall?q={q}")
                m = c.memo_call(op, "recall", q)
                got = [line for line in m.split("\n") if line]
                same(f"{op} total", got[-1], f"{r['total']} matches", mismatches)
                same(f"{op} lines", got[:-1], r["matches"], mismatches)
                recalls[op] = r["total"]
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "times": c.times,
        "cpu": c.cpu,
        "mismatches": sorted(set(mismatches)),
        "recalls": recalls,
        "first_recall": first_recall,
    }


# ---------------------------------------------------------------- report


def report(rows: list[tuple[int, dict, dict]], argv: list[str]) -> str:
    out = [
        f"# Stash vs the memo stand-in, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"Command: `python bench/versus.py {' '.join(argv)}`. Machine: {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.2f} at the end. Each cell: median wall time of one whole process "
        "(a `curl` against a warm `stash serve`, or a `memo_standin.py` process), interleaved call by call.",
        "",
    ]
    for T, res, info in rows:
        out += [
            f"## T = {T:,}",
            "",
            f"Disk: Stash store {info['stash_bytes'] / T:.0f} bytes per memory "
            f"({info['stash_bytes'] / 2**20:.0f} MiB), OptMem folder {info['memo_bytes'] / T:.0f} bytes per "
            f"memory ({info['memo_bytes'] / 2**20:.0f} MiB). "
            + (
                f"First recall after the build (fills the recall cache; httpx, not curl): "
                f"{res['first_recall']:.2f} s. Matches: "
                + ", ".join(f"{op} {n:,}" for op, n in res["recalls"].items())
                + "."
                if res["recalls"]
                else "No recall timed (`--recall-reps 0`)."
            ),
            "",
            "| call | n | Stash (curl) median | × `curl /health` | memo stand-in median | Stash / memo | CPU: "
            "Stash (curl + server) / memo, mean | CPU ratio |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        health = statistics.median(res["times"][HEALTH]["stash"])
        out.append(f"| {HEALTH} | {len(res['times'][HEALTH]['stash'])} | {health * 1000:.1f} ms | 1.00× | | | | |")
        for op, sides in res["times"].items():
            if op == HEALTH:
                continue
            s, m = statistics.median(sides["stash"]), statistics.median(sides["memo"])
            unit, k = ("s", 1) if max(s, m) >= 1 else ("ms", 1000)
            cs, cm = (statistics.mean(res["cpu"][op][side]) for side in ("stash", "memo"))
            out.append(
                f"| {op} | {len(sides['stash'])} | {s * k:.1f} {unit} | {s / health:.2f}× | "
                f"{m * k:.1f} {unit} | {s / m:.2f}× | "
                f"{cs * 1e3:.0f} / {cm * 1e3:.0f} ms | {cs / cm:.2f}× |"
            )
        out += [
            "",
            "Same answers from both: " + ("yes" if not res["mismatches"] else "NO — " + ", ".join(res["mismatches"])),
            "",
        ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description="Stash (curl against stash serve) vs a memo stand-in process.")
    p.add_argument("--sizes", default="100000,1000000", help="comma-separated T values")
    p.add_argument("--reps", type=int, default=40, help="calls of each kind (wake, zoom, note)")
    p.add_argument("--recall-reps", type=int, default=5, help="recalls of each pattern")
    p.add_argument("--fresh", action="store_true", help="rebuild the cached stores")
    p.add_argument("--out", type=Path, help="report file (default bench/results/<date>-versus.md)")
    args = p.parse_args(argv)
    if shutil.which("curl") is None:
        raise SystemExit("curl is needed")
    rows = []
    for T in (int(x) for x in args.sizes.split(",")):
        data, memo, owner, secs = store_pair(T, args.fresh)
        res = measure(T, data, memo, owner, args.reps, args.recall_reps)
        rows.append((T, res, {"stash_bytes": disk_bytes(data), "memo_bytes": disk_bytes(memo), "build": secs}))
    text = report(rows, argv)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    out = args.out or RESULTS / f"{dt.date.today().isoformat()}-versus.md"
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
