"""A ``stash`` command cut short by kill -9 at an instant of its own
progress (tests/e2e/test_fleet_cut_runs.py).

The installed ``stash`` runs, from outside the checkout as every command a
test starts, under a Python audit hook (``sys.addaudithook``) that watches
the command's own actions: the processes it starts, the files it renames
and opens, the requests it sends. At the n-th action matching
a :class:`Step`, the hook stops the whole process (SIGSTOP, before the
action takes effect); the test sees it stopped, looks at what it left, and
kills it with SIGKILL, as an operator's ``kill -9`` or a power cut would.
So a kill lands between two steps as surely as during one, however the
machine is loaded, and no sleep decides where."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.installed import OUTSIDE, child_env

CUT_TIMEOUT_S = 90.0  # generous: other tests share the machine's cores
POLL_S = 0.02
STOP_AT_ENV = "STASH_TEST_STOP_AT"

# Run as ``python -c HOOK ARGS``: the hook, then ``python -m stash ARGS``.
# The stop is sent to the thread that meets the step (a signal to the process may be taken by another
# thread, and the one at the step would go on until the stop reached it); the others stop with it.
HOOK = f"""
import itertools, json, os, re, runpy, signal, sys, threading
spec = json.loads(os.environ.pop({STOP_AT_ENV!r}))
pattern, count = re.compile(spec["match"]), itertools.count(1)
def stop_at(event, args):
    if event == spec["event"] and pattern.search(repr(args)) and next(count) == spec["nth"]:
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
sys.addaudithook(stop_at)
runpy.run_module("stash", run_name="__main__", alter_sys=True)
"""


@dataclass(frozen=True)
class Step:
    """An instant of a command: just before its ``nth`` audit event named
    ``event`` whose arguments' repr matches ``match`` (a regular expression)."""

    name: str
    event: str
    match: str
    nth: int = 1


def renaming_into(folder: Path) -> str:
    """An ``os.rename`` event's arguments (source, destination, …) that move
    a user's folder into ``folder``: matched on the destination only."""
    return re.escape(f", '{folder}/") + r"[0-9a-f]{16}',"


def stopped(pid: int) -> bool:
    """Whether every thread of the process is stopped ("T" in /proc)."""
    try:
        states = [t.read_text().rsplit(")", 1)[1].split()[0] for t in Path(f"/proc/{pid}/task").glob("*/stat")]
    except (OSError, IndexError):
        return False
    return bool(states) and all(s == "T" for s in states)


def children(pid: int, words: tuple[str, ...]) -> list[int]:
    """The processes whose parent is ``pid`` and whose command line holds every one of ``words``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (proc / "cmdline").read_bytes().decode("utf-8", "replace")
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid and all(w in argv for w in words):
            found.append(int(proc.name))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it holds no file and writes nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class Cut:
    """One run of ``stash ARGS`` stopped at ``step`` (None: not stopped; the
    caller kills it when it likes), then killed with :meth:`kill`."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path, step: Step | None) -> None:
        self.step = step
        self.log = log
        full = {**child_env(), **env}
        if step is None:
            argv = [sys.executable, "-m", "stash", *args]
        else:
            argv = [sys.executable, "-c", HOOK, *args]
            full[STOP_AT_ENV] = json.dumps({"event": step.event, "match": step.match, "nth": step.nth})
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=OUTSIDE, env=full
            )

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def wait_stopped(self) -> None:
        """Until the command stopped itself at its step; a command that ends
        first never reached it, and fails the test with what it said."""
        deadline = time.monotonic() + CUT_TIMEOUT_S
        while not stopped(self.proc.pid):
            if self.proc.poll() is not None:
                raise AssertionError(f"the command ended (exit {self.proc.returncode}) before {self.step}:\n"
                                     + self.output())  # fmt: skip
            if time.monotonic() > deadline:
                raise AssertionError(f"the command did not reach {self.step} in {CUT_TIMEOUT_S:.0f} s:\n"
                                     + self.output())  # fmt: skip
            time.sleep(POLL_S)

    def resume_until_child(self, *words: str) -> int:
        """Let the stopped command go on until a process it started runs
        with every one of ``words`` in its command line; that process's id."""
        os.kill(self.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + CUT_TIMEOUT_S
        while (found := children(self.proc.pid, words)) == []:
            assert self.proc.poll() is None, f"the command ended before it started {words}:\n{self.output()}"
            assert time.monotonic() < deadline, f"the command did not start {words}:\n{self.output()}"
            time.sleep(POLL_S)
        return found[0]

    def kill(self) -> int | None:
        """kill -9 (its own children, Litestream restores among them, live
        on, as they would); the exit code when it had ended already."""
        ended = self.proc.poll()
        if ended is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=CUT_TIMEOUT_S)
        return ended
