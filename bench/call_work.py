"""The work one agent call does, counted: token parses, lookup tags, key
derivations, key-ring write transactions, and the syncs of the disk.

    python bench/call_work.py -T 4096 --calls 50
    python bench/call_work.py -T 4096 --calls 50 --profile note   # cProfile of the notes

Builds (once, kept under ``bench/results/work-<T>``) a store of ``T``
memories with every block summarised (``build.py``), mints a ``full``
grant at the default argon2id cost, and sends ``--calls`` wakes, notes
and zooms through the app in process (httpx's ASGI transport, the files
kept open between requests as ``stash serve`` keeps them). The counts are
taken by wrapping the functions named (this script only; the server is
never patched): ``tokens.parse``, ``tokens.lookup_tag``,
``keys.derive_kek`` (argon2id) and ``transactions.write_transaction`` on a key
ring's connection. The syncs are counted by running the same calls again
under ``strace -f -c -e trace=fsync,fdatasync`` when strace is installed
(``--syncs``), per call kind: the difference between ``2 * calls`` and
``calls`` calls, so the start, the build and the warm-up cancel out. The
notes' counts include any nap a note asked for (one per 128 notes at most).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _repo  # noqa: F401  (the repository root on sys.path)
from build import build

from stash.crypto import keys, tokens
from stash.service import operation
from stash.service.access import Vault
from stash.storage.sqlite import transactions
from stash.web.app import create_app
from tests.support.api import Api, make_settings

HERE = Path(__file__).resolve().parent
COUNTS: collections.Counter[str] = collections.Counter()
PAUSED = [False]  # while naps are settled between the timed notes: neither counted nor profiled


def _counting(module: object, name: str, label: str) -> None:
    real = getattr(module, name)

    def wrapped(*a, **kw):  # type: ignore[no-untyped-def]
        if not PAUSED[0]:
            COUNTS[label] += 1
        return real(*a, **kw)

    setattr(module, name, wrapped)


def _count_ring_writes() -> None:
    real = transactions.write_transaction

    def wrapped(conn):  # type: ignore[no-untyped-def]
        path = conn.execute("PRAGMA database_list").fetchone()[2]
        if Path(path).name.startswith("keyring") and not conn.in_transaction and not PAUSED[0]:
            COUNTS["key-ring write transactions"] += 1
        return real(conn)

    transactions.write_transaction = wrapped  # type: ignore[assignment]
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("stash.") and getattr(mod, "write_transaction", None) is real:
            mod.write_transaction = wrapped  # type: ignore[attr-defined]


_REAL_PERFORM = operation.perform


def _profiling(prof: cProfile.Profile | None) -> None:
    """Profile the service's work of each call (operation.perform, which
    runs on a worker thread, where a profiler of the event loop's thread
    never looks); None: stop."""
    if prof is None:
        operation.perform = _REAL_PERFORM
        return

    def profiled(*a, **kw):  # type: ignore[no-untyped-def]
        if PAUSED[0]:
            return _REAL_PERFORM(*a, **kw)
        prof.enable()
        try:
            return _REAL_PERFORM(*a, **kw)
        finally:
            prof.disable()

    operation.perform = profiled


def store(T: int) -> tuple[Path, str]:
    root = HERE / "results" / f"work-{T}"
    if not (root / "owner-token").exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        built = build(root / "data", T)
        (root / "owner-token").write_text(built.token)
    return root / "data", (root / "owner-token").read_text().strip()


def settle(api: Api, h: dict[str, str]) -> None:
    """Write every nap the memory waits for, uncounted and untimed."""
    PAUSED[0] = True
    os.getuid()  # the mark: syncs not counted (:func:`syncs`)
    try:
        nap = api.send("GET", "/wake", h).json()["nap"]
        while nap is not None:  # every compression due, as an agent following the answers does
            nap = api.send(
                "POST", "/nap", h, json={"block": nap["block"], "text": f"summary of {nap['block']}"}
            ).json()["nap"]
    finally:
        PAUSED[0] = False


def calls(api: Api, token: str, op: str, n: int, k0: int = 0) -> float:
    """Seconds spent in ``n`` calls of ``op`` (the naps settled between notes not counted)."""
    h = {"Authorization": f"Bearer {token}"}
    settle(api, h)
    spent = 0.0
    for k in range(n):
        os.getppid()  # the mark: syncs counted from here (:func:`syncs`)
        t0 = time.perf_counter()
        if op == "wake":
            r = api.send("GET", "/wake", h)
        elif op == "zoom":
            r = api.send("GET", "/zoom?block=0-127", h)
        else:
            r = api.send("POST", "/note", h, json={"text": f"call work note {k0 + k}: the deploy went green"})
        spent += time.perf_counter() - t0
        assert r.status_code in (200, 201), r.text
        if op == "note" and r.json().get("nap") is not None:
            settle(api, h)
    os.getuid()
    return spent


def run(data: Path, token: str, ops: list[str], n: int, profile: str | None) -> dict[str, dict[str, float]]:
    for mod, name, label in (
        (tokens, "parse", "tokens.parse"),
        (tokens, "lookup_tag", "tokens.lookup_tag"),
        (keys, "derive_kek", "argon2id (derive_kek)"),
    ):
        _counting(mod, name, label)
    _count_ring_writes()
    api = Api(create_app(make_settings(data, keep_open=5.0)))
    out: dict[str, dict[str, float]] = {}
    try:
        calls(api, token, "wake", 3)  # warm: the tag index, the kept files
        for op in ops:
            COUNTS.clear()
            prof = cProfile.Profile() if profile == op else None
            _profiling(prof)
            wall = calls(api, token, op, n, k0=int(time.time()))
            _profiling(None)
            out[op] = {label: c / n for label, c in COUNTS.items()}
            out[op]["ms per call (in process)"] = 1000 * wall / n
            if prof:
                s = io.StringIO()
                pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(45)
                print(s.getvalue())
    finally:
        api.close()
    return out


def syncs(T: int, ops: list[str], n: int) -> dict[str, dict[str, float]]:
    """Each call kind again, in a child under strace: fsync and fdatasync per
    call, counted only between the child's marks: a ``getppid`` call before
    each timed call, a ``getuid`` before the naps settled after it (and at the end)."""
    out = {}
    for op in ops:
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "strace.txt"
            cmd = [
                "strace",
                "-f",
                "-o",
                str(trace),
                "-e",
                "trace=fsync,fdatasync,getppid,getuid",
                sys.executable,
                __file__,
                "-T",
                str(T),
                "--calls",
                str(n),
                "--ops",
                op,
                "--quiet",
            ]
            subprocess.run(cmd, check=True, capture_output=True)
            counts = collections.Counter[str]()
            on = False
            for line in trace.read_text().splitlines():
                call = line.split(None, 1)[-1] if line[:1].isdigit() else line
                if call.startswith(("getppid(", "getuid(")):
                    on = call.startswith("getppid(")
                elif on and not call.startswith("<..."):
                    counts[call.split("(", 1)[0]] += 1
            out[op] = {name: counts[name] / n for name in ("fsync", "fdatasync")}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-T", type=int, default=4096)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--ops", default="wake,note,zoom")
    p.add_argument("--profile", choices=("wake", "note", "zoom"))
    p.add_argument("--syncs", action="store_true", help="count fsync/fdatasync per call under strace")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    ops = args.ops.split(",")
    data, owner = store(args.T)
    with Vault(data).session(owner, "owner") as s:
        _, token = Vault(data).mint_grant(s, "full")
    if args.calls == 0:
        return 0
    res = run(data, token, ops, args.calls, args.profile)
    if args.quiet:
        return 0
    if args.syncs and shutil.which("strace"):
        for op, c in syncs(args.T, ops, args.calls).items():
            res[op].update({f"{k} (strace)": v for k, v in c.items()})
    labels = sorted({label for r in res.values() for label in r})
    print(
        f"T = {args.T:,}, {args.calls} calls of each, per call (cpu count {os.cpu_count()}, "
        f"load {os.getloadavg()[0]:.1f})"
    )
    print("| per call | " + " | ".join(ops) + " |")
    print("|---|" + "---:|" * len(ops))
    for label in labels:
        print(f"| {label} | " + " | ".join(f"{res[op].get(label, 0):.2f}" for op in ops) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
