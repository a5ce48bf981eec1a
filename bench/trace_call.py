"""How much of the package one warm request runs through: modules, calls, depth and layer switches.

    python bench/trace_call.py                 # one POST /note and one GET /wake
    python bench/trace_call.py --users 2 -T 300

The app runs in this process and is called through ASGI as bench/request_cost.py
calls it (its stores, its driver). A profile function (sys.setprofile, and
threading.setprofile for the worker threads the handlers run in) is set before
the app starts and counts only while the traced request is in flight, after
warm calls of its kind. Per request it prints: the package's modules that run
code; Python calls into the package (a function entered: a coroutine's or a
generator's resume after a yield or an await is no new call); the deepest
stack of package frames in one thread; and the switches between layers: calls
whose nearest calling package frame in the same thread is in another layer
(stash.web, stash.service, stash.storage, stash.core, stash.crypto; stash.tools
and stash.cli count as layers of their own).
"""

from __future__ import annotations

import argparse
import asyncio
import dis
import logging
import os
import shutil
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import _repo  # noqa: F401  (the repository root on sys.path)
from request_cost import Driver, settings_for, settle, stores

import stash

PACKAGE = str(Path(stash.__file__).resolve().parent) + os.sep
RESUME = dis.opmap["RESUME"]  # oparg 0: a function entered; 1-3: resumed after a yield or an await


def module_of(filename: str) -> str | None:
    """The dotted name of a file of the package, or None for any other file."""
    if not filename.startswith(PACKAGE):
        return None
    parts = Path(filename[len(PACKAGE) :]).with_suffix("").parts
    return ".".join(("stash", *parts)).removesuffix(".__init__")


def layer_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else "stash"


class Tracer:
    """Counts package calls while ``on``; set on every thread before any starts."""

    def __init__(self) -> None:
        self.on = False
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.modules: Counter[str] = Counter()
        self.calls = 0
        self.depth = 0
        self.switches: Counter[tuple[str, str]] = Counter()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or event != "call":
            return
        module = module_of(frame.f_code.co_filename)
        if module is None:
            return
        caller: str | None = None
        depth = 1
        f = frame.f_back
        while f is not None:
            above = module_of(f.f_code.co_filename)
            if above is not None:
                caller = caller or above
                depth += 1
            f = f.f_back
        code, at = frame.f_code.co_code, frame.f_lasti
        entered = code[at] == RESUME and code[at + 1] == 0
        with self.lock:
            self.modules[module] += 1
            self.depth = max(self.depth, depth)
            if not entered:
                return
            self.calls += 1
            if caller is not None and layer_of(caller) != layer_of(module):
                self.switches[(layer_of(caller), layer_of(module))] += 1

    def report(self, what: str) -> str:
        pairs = ", ".join(f"{a.split('.')[-1]}→{b.split('.')[-1]} {n}" for (a, b), n in self.switches.most_common())
        return (
            f"{what}: {len(self.modules)} modules, {self.calls} calls, {self.depth} frames deep, "
            f"{sum(self.switches.values())} layer switches ({pairs})"
        )


async def trace(tracer: Tracer, users: int, T: int, warm: int) -> list[str]:
    root = stores(users, T)
    tokens = (root / "tokens").read_text().split()
    logging.basicConfig(level=logging.INFO, stream=open(os.devnull, "w"))  # the access log, as served
    from stash.web.app import create_app

    out = []
    with tempfile.TemporaryDirectory(prefix="stash-trace-") as tmp:
        shutil.copytree(root / "data", Path(tmp) / "data")
        d = Driver(create_app(settings_for(Path(tmp) / "data")))
        await d.start()
        try:
            token = tokens[0]
            for method, target, body in (
                ("POST", "/note", {"text": "traced: the deploy went green"}),
                ("GET", "/wake", None),
            ):
                for _ in range(warm):  # files open, the tag index loaded, the day's writes done
                    await settle(d, token, (await d.call(method, target, token, body))[1].get("nap"))
                tracer.reset()
                tracer.on = True
                status, answer = await d.call(method, target, token, body)
                tracer.on = False
                assert status in (200, 201), (status, answer)
                out.append(tracer.report(f"{method} {target}"))
                await settle(d, token, answer.get("nap"))
        finally:
            await d.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--users", type=int, default=2)
    p.add_argument("-T", type=int, default=300, help="memories per user")
    p.add_argument("--warm", type=int, default=3, help="untraced calls of each kind first")
    args = p.parse_args()
    prom = tempfile.TemporaryDirectory(prefix="stash-trace-prom-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = prom.name  # before prometheus_client is imported, as under --workers 2
    stores(args.users, args.T)  # built outside the traced event loop
    tracer = Tracer()
    threading.setprofile(tracer)
    sys.setprofile(tracer)
    try:
        lines = asyncio.run(trace(tracer, args.users, args.T, args.warm))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
