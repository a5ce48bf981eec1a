"""What one request costs the server, per kind, in CPU and in instructions.

    python bench/request_cost.py --calls 300                 # CPU ms per request kind
    python bench/request_cost.py --calls 300 --profile wake  # cProfile of the wakes, both threads
    python bench/request_cost.py --calls 40 --callgrind      # instructions per request (valgrind)

The app runs in this process as one ``stash serve --workers 2`` worker runs
it (its lifespan, files kept open ``--keep-open`` 5 s, the access log at
INFO into /dev/null, prometheus_client's multiprocess counters in a temporary
folder), and is called straight through ASGI: no HTTP client, no socket, so
what is counted is the app's work (uvicorn's parsing of the bytes is the same
for every kind, and the same before and after a change of the app).

The stores (built once, kept under ``bench/results/cost-<users>x<T>``, copied
to a temporary folder for every run so that every run starts from the same
files) are ``--users`` identities made as ``POST /init`` makes them, at the
server's default argon2id cost, each holding ``-T`` memories imported with
every nap they bring due written: the shape of bench/load.py's users after a
few minutes. Calls go round the users in turn with their owner tokens, as
load.py's do. Kinds: ``health`` (the floor: routing, middleware, a JSON
answer), ``wake``, ``zoom`` (block 0-127), ``note`` (the naps it brings due
are written between the timed calls, not counted), ``nap`` (``POST /nap {}``
when none is due, as load.py sends it) and ``recall`` (``q=deploy``).

``--callgrind`` runs each kind under ``valgrind --tool=callgrind`` twice,
with ``--calls`` and with twice as many, and prints the difference divided by
``--calls``: the instructions of one request, whatever the machine's load
(start-up, imports and the store's copy cancel out; files are kept open an hour, so that no idle file is
closed under valgrind's slowness and opened again). For ``note`` the
difference includes the naps the extra notes brought due (one nap per 128
notes of a user at most).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import logging
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import _repo  # noqa: F401  (the repository root on sys.path)
import orjson

HERE = Path(__file__).resolve().parent
KINDS = ("health", "wake", "zoom", "note", "nap", "recall")
WORDS = ("deploy", "green", "red", "cache", "schema", "release", "rollback", "index", "user", "build")


class Driver:
    """The app, called through ASGI as uvicorn calls it, one request at a time,
    on one event loop whose main task lives as long as the driver (as
    uvicorn's does: anyio keeps its worker threads for the life of that task,
    where a loop run once per call would start a thread per request)."""

    def __init__(self, app) -> None:
        self.app = app

    async def start(self) -> None:
        from tests.support.api import Lifespan

        self.lifespan = Lifespan(self.app)
        await self.lifespan.start()

    async def _call(self, method: str, target: str, token: str | None, body: bytes | None) -> tuple[int, bytes]:
        path, _, query = target.partition("?")
        headers = [(b"host", b"stash.test"), (b"user-agent", b"curl/8.5.0"), (b"accept", b"*/*")]
        if token:
            headers.append((b"authorization", f"Bearer {token}".encode()))
        if body is not None:
            headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": urllib.parse.unquote(path),
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8000),
            "state": {},
        }
        done = asyncio.Event()
        sent = [False]
        status = [0]
        out: list[bytes] = []

        async def receive() -> dict:
            if not sent[0]:
                sent[0] = True
                return {"type": "http.request", "body": body or b"", "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body":
                out.append(message.get("body", b""))
                if not message.get("more_body"):
                    done.set()

        await self.app(scope, receive, send)
        return status[0], b"".join(out)

    async def call(self, method: str, target: str, token: str | None = None, body: object = None) -> tuple[int, dict]:
        raw = None if body is None else orjson.dumps(body)
        status, answer = await self._call(method, target, token, raw)
        try:
            return status, orjson.loads(answer) if answer else {}
        except orjson.JSONDecodeError:
            return status, {}

    async def close(self) -> None:
        await self.lifespan.stop()


KEEP_OPEN = [5.0]


def settings_for(data: Path):
    from tests.support.api import make_settings

    return make_settings(data, keep_open=KEEP_OPEN[0], workers=2)


async def settle(d: Driver, token: str, nap: object = None) -> int:
    """Write every nap due, as an agent following the answers does; how many."""
    written = 0
    if nap is None:
        nap = (await d.call("GET", "/wake", token))[1].get("nap")
    while isinstance(nap, dict):
        body = {"block": nap["block"], "text": f"summary of {nap['block']}"}
        status, answer = await d.call("POST", "/nap", token, body)
        assert status == 200, answer
        nap = answer.get("nap")
        written += 1
    return written


async def build_stores(root: Path, users: int, T: int) -> None:
    """``users`` identities of ``T`` memories each, every nap written (once; kept)."""
    from stash.web.app import create_app

    data = root / "data"
    d = Driver(create_app(settings_for(data)))
    await d.start()
    try:
        tokens = []
        for _ in range(users):
            status, answer = await d.call("POST", "/init", None, {})
            assert status == 201, answer
            tok = answer["token"]
            for base in range(0, T, 500):
                entries = [
                    {
                        "date": "2026-11-01",
                        "text": f"memory {i}: the {WORDS[i % len(WORDS)]} went "
                        f"{WORDS[(i * 7) % len(WORDS)]} in build {i}",
                    }
                    for i in range(base, min(T, base + 500))
                ]
                status, answer = await d.call("POST", "/import", tok, {"entries": entries})
                assert status == 200, answer
            await settle(d, tok)
            tokens.append(tok)
    finally:
        await d.close()
    (root / "tokens").write_text("\n".join(tokens) + "\n")
    os.chmod(root / "tokens", 0o600)


def stores(users: int, T: int) -> Path:
    root = HERE / "results" / f"cost-{users}x{T}"
    if not (root / "tokens").exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        asyncio.run(build_stores(root, users, T))
    return root


async def one(d: Driver, kind: str, token: str, k: int) -> object:
    """One call of ``kind``; the nap it brought due, if any."""
    if kind == "health":
        status, answer = await d.call("GET", "/health")
    elif kind == "wake":
        status, answer = await d.call("GET", "/wake", token)
    elif kind == "zoom":
        status, answer = await d.call("GET", "/zoom?block=0-127", token)
    elif kind == "note":
        words = " ".join(WORDS[(k * j) % len(WORDS)] for j in range(3, 3 + k % 9))
        status, answer = await d.call("POST", "/note", token, {"text": f"note {k} {words}"})
    elif kind == "nap":
        status, answer = await d.call("POST", "/nap", token, {})
    else:
        status, answer = await d.call("GET", "/recall?q=deploy", token)
    assert status in (200, 201), (kind, status, answer)
    return answer.get("nap") if isinstance(answer, dict) else None


class Sampler:
    """A sampling profiler in this process: every ``interval`` seconds, the
    stack of every thread but its own, counted per frame (inclusive and own).
    Unlike cProfile it does not slow the small functions it counts."""

    def __init__(self, interval: float = 0.0005) -> None:
        import collections

        self.interval = interval
        self.inclusive: collections.Counter[str] = collections.Counter()
        self.own: collections.Counter[str] = collections.Counter()
        self.total = 0
        self.on = False
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop:
            time.sleep(self.interval)
            if not self.on:
                continue
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                names = []
                f = frame
                while f is not None:
                    code = f.f_code
                    names.append(f"{code.co_name} {Path(code.co_filename).name}:{code.co_firstlineno}")
                    f = f.f_back
                if not names or names[0].split(" ")[0] in ("wait", "select", "get", "_worker", "sleep"):
                    continue  # a thread waiting for work
                self.total += 1
                self.own[names[0]] += 1
                for n in set(names):
                    self.inclusive[n] += 1

    def report(self, top: int = 70) -> str:
        self._stop = True
        out = [f"{self.total} busy samples", "inclusive % | own % | frame"]
        for name, n in self.inclusive.most_common(top):
            out.append(f"{100 * n / self.total:6.1f} | {100 * self.own[name] / self.total:5.1f} | {name}")
        out += ["", "own % | frame"]
        for name, n in self.own.most_common(top // 2):
            out.append(f"{100 * n / self.total:5.1f} | {name}")
        return "\n".join(out)


def _thread_profiling(prof: cProfile.Profile) -> None:
    """Profile the work each request does in its worker thread (operation.perform), where a profiler of the
    event loop's thread never looks."""
    from stash.service import operation
    from stash.web import dispatch

    real = operation.perform

    def profiled(*a, **kw):  # type: ignore[no-untyped-def]
        prof.enable()
        try:
            return real(*a, **kw)
        finally:
            prof.disable()

    operation.perform = profiled  # type: ignore[assignment]
    dispatch.operation.perform = profiled  # type: ignore[attr-defined]


async def run(
    kinds: list[str], n: int, users: int, T: int, profile: str | None, warm: int = 2, sample: str | None = None
) -> dict[str, float]:
    """CPU ms per call of each kind (process time: every thread)."""
    root = stores(users, T)
    tokens = (root / "tokens").read_text().split()
    # The access log as a served worker writes it (web/app.py, app_from_env), into /dev/null.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=open(os.devnull, "w"))
    from stash.web.app import create_app

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="stash-cost-") as tmp:
        shutil.copytree(root / "data", Path(tmp) / "data")
        d = Driver(create_app(settings_for(Path(tmp) / "data")))
        await d.start()
        try:
            for kind in kinds:
                for k in range(warm * len(tokens)):  # the files opened, the tag index and the day's writes done
                    nap = await one(d, kind, tokens[k % len(tokens)], k)
                    if kind in ("note", "nap"):
                        await settle(d, tokens[k % len(tokens)], nap)
                sampler = Sampler() if sample == kind else None
                if sampler:
                    sampler.on = True
                prof = cProfile.Profile(time.thread_time) if profile == kind else None
                main_prof = cProfile.Profile(time.thread_time) if prof else None
                if prof:
                    _thread_profiling(prof)
                spent = settling = 0.0
                naps = 0
                for k in range(n):
                    tok = tokens[k % len(tokens)]
                    t0 = time.process_time()
                    if main_prof:
                        main_prof.enable()
                    nap = await one(d, kind, tok, 1000 + k)
                    if main_prof:
                        main_prof.disable()
                    spent += time.process_time() - t0
                    if kind in ("note", "nap") and nap is not None:
                        t0 = time.process_time()
                        naps += await settle(d, tok, nap)
                        settling += time.process_time() - t0
                out[kind] = 1000 * spent / n
                if naps:
                    out[f"nap writing a summary (after the {kind}s, {naps} of them)"] = 1000 * settling / naps
                if sampler:
                    print(sampler.report())
                if prof and main_prof:
                    s = io.StringIO()
                    stats = pstats.Stats(main_prof, stream=s)
                    stats.add(prof)
                    stats.sort_stats("cumulative").print_stats(60)
                    stats.sort_stats("tottime").print_stats(40)
                    if os.environ.get("CALLERS"):
                        stats.print_callers(os.environ["CALLERS"])
                    print(s.getvalue())
        finally:
            await d.close()
    return out


async def served(kinds: list[str], n: int, users: int, T: int) -> dict[str, float]:
    """CPU ms of a real ``stash serve`` (one worker: the process that answers) per call of each kind, over one
    keep-alive connection (bench/load.py's raw client): what uvicorn, its parser and the socket add to the app."""
    from load import Conn

    def server_cpu(pid: int) -> float:
        """CPU seconds of every thread of the process, in nanoseconds (schedstat), not clock ticks."""
        total = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
        return total / 1e9

    from tests.support.server import Server

    root = stores(users, T)
    tokens = (root / "tokens").read_text().split()
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="stash-served-") as tmp:
        shutil.copytree(root / "data", Path(tmp) / "data")
        server = Server(Path(tmp) / "data", Path(tmp) / "server.log").start()
        conn = Conn("127.0.0.1", server.port)
        try:

            async def call(kind: str, tok: str, k: int) -> object:
                words = " ".join(WORDS[(k * j) % len(WORDS)] for j in range(3, 3 + k % 9))
                method, target, body = {
                    "health": ("GET", "/health", None),
                    "wake": ("GET", "/wake", None),
                    "zoom": ("GET", "/zoom?block=0-127", None),
                    "recall": ("GET", "/recall?q=deploy", None),
                    "note": ("POST", "/note", orjson.dumps({"text": f"note {k} {words}"})),
                    "nap": ("POST", "/nap", b"{}"),
                }[kind]
                status, answer, _ = await conn.request(method, target, tok, body)
                assert status in (200, 201), (kind, status, answer)
                return answer.get("nap")

            async def settle_served(tok: str, nap: object) -> None:
                while isinstance(nap, dict):
                    body = orjson.dumps({"block": nap["block"], "text": f"summary of {nap['block']}"})
                    status, answer, _ = await conn.request("POST", "/nap", tok, body)
                    assert status == 200, answer
                    nap = answer.get("nap")

            for kind in kinds:
                for k in range(2 * len(tokens)):
                    await settle_served(tokens[k % len(tokens)], await call(kind, tokens[k % len(tokens)], k))
                spent = 0.0
                for k in range(n):
                    tok = tokens[k % len(tokens)]
                    c0 = server_cpu(server.proc.pid)
                    nap = await call(kind, tok, 1000 + k)
                    spent += server_cpu(server.proc.pid) - c0
                    await settle_served(tok, nap)
                out[kind] = 1000 * spent / n
        finally:
            conn.close()
            server.stop()
    return out


def callgrind(kinds: list[str], n: int, users: int, T: int) -> dict[str, float]:
    """Instructions per call of each kind: the difference between ``2n`` and ``n`` calls under callgrind."""
    stores(users, T)
    out: dict[str, float] = {}
    for kind in kinds:
        totals = []
        for calls in (n, 2 * n):
            with tempfile.TemporaryDirectory(prefix="stash-cg-") as tmp:
                cg = Path(tmp) / "callgrind.out"
                cmd = [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={cg}",
                    sys.executable,
                    __file__,
                    "--ops",
                    kind,
                    "--calls",
                    str(calls),
                    "--users",
                    str(users),
                    "-T",
                    str(T),
                    "--quiet",
                    "--warm",
                    "1",
                    "--keep-open",
                    "3600",
                ]
                subprocess.run(cmd, check=True, capture_output=True)
                text = cg.read_text(errors="replace")
                found = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
                assert found, "no totals in the callgrind output"
                totals.append(int(found.group(1)))
        out[kind] = (totals[1] - totals[0]) / n
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ops", default=",".join(KINDS))
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--users", type=int, default=8)
    p.add_argument("-T", type=int, default=300, help="memories per user")
    p.add_argument("--profile", choices=KINDS)
    p.add_argument("--sample", choices=KINDS, help="a sampling profile of this kind (every thread)")
    p.add_argument("--served", action="store_true", help="a real stash serve's CPU per call, over HTTP")
    p.add_argument("--callgrind", action="store_true")
    p.add_argument("--warm", type=int, default=2, help="untimed calls per user before each kind")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--keep-open", type=float, default=5.0, help="seconds files stay open after a request")
    args = p.parse_args()
    kinds = args.ops.split(",")
    KEEP_OPEN[0] = args.keep_open
    # Before prometheus_client is imported: its values are multiprocess files, as under --workers 2.
    prom = tempfile.TemporaryDirectory(prefix="stash-cost-prom-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = prom.name
    stores(args.users, args.T)  # built here, outside the event loop the runs below start
    if args.callgrind:
        res = callgrind(kinds, args.calls, args.users, args.T)
        print(
            f"instructions per call (callgrind, {args.calls} and {2 * args.calls} calls; "
            f"{args.users} users of {args.T} memories)"
        )
        for kind in kinds:
            print(f"| {kind} | {res[kind] / 1e6:.2f} M |")
        return 0
    if args.served:
        res = asyncio.run(served(kinds, args.calls, args.users, args.T))
        print(
            f"server CPU ms per call, a real stash serve over one keep-alive connection ({args.calls} calls of "
            f"each; {args.users} users of {args.T} memories; load {os.getloadavg()[0]:.1f})"
        )
        for kind, ms in res.items():
            print(f"| {kind} | {ms:.3f} |")
        return 0
    res = asyncio.run(run(kinds, args.calls, args.users, args.T, args.profile, args.warm, args.sample))
    if args.quiet:
        return 0
    print(
        f"CPU ms per call, in process through ASGI ({args.calls} calls of each; {args.users} users of "
        f"{args.T} memories; load {os.getloadavg()[0]:.1f})"
    )
    for kind, ms in res.items():
        print(f"| {kind} | {ms:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
