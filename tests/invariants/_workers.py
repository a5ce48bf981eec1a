"""Child processes for the invariant tests, run as a script:

    python _workers.py writer DATA NAME COUNT NAPS   # concurrent writer
    python _workers.py crasher DATA ROUND            # writes until killed

The capability token comes in the environment (STASH_TEST_TOKEN), never on
the command line where other processes could read it. Every acknowledged
write is printed and flushed at once, so that the parent knows exactly what
the store promised before the child died:

    n ID K       note number K of this child was stored as memory #ID
    s BLOCK      the summary of BLOCK was stored

The parent side (:class:`Child`) starts one and reads those lines with a
bounded wait, so a stuck child fails a test instead of hanging it.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

from stash.core.errors import Conflict
from stash.service.access import Vault

TOKEN_ENV = "STASH_TEST_TOKEN"
# a child never outlives a parent that forgot it
LIFETIME_S = 60


def digest(source: list[str]) -> str:
    """tests/support/oracle.py's ``digest``, again: this file runs as a script, without
    the repository on its path (the tests that read its summaries check them with that one)."""
    return f"{zlib.crc32(chr(10).join(source).encode()):08x}"


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def answer_naps(mem, nap: dict | None, label: str, limit: int = 64) -> None:
    """Answer what is due, whatever other writers do meanwhile. The summary
    names its block and the digest of the source it was given, so a reader can
    check that each summary was written from its own block's lines."""
    for _ in range(limit):
        if nap is None:
            return
        text = f"{nap['block']} {digest(nap['source'])} {label}"
        try:
            answer = mem.nap(nap["block"], text)
        except Conflict as e:
            # another writer's note made a smaller block due first
            if e.code != "nap.wrong_block":
                raise
            nap = e.extra["nap"]
            continue
        if answer["saved"] is not None:
            say(f"s {answer['saved']}")
        nap = answer["nap"]


def writer(data: str, name: str, count: int, naps: bool) -> None:
    vault = Vault(Path(data))
    with vault.session(os.environ[TOKEN_ENV], "full") as s:
        mem = s.open_memory()
        say("ready")
        # start together with the other writers
        if sys.stdin.readline().strip() != "go":
            return
        for k in range(count):
            answer = mem.note(f"{name} note {k}")
            say(f"n {answer['id']} {k}")
            if naps:
                answer_naps(mem, answer["nap"], name)
    say("done")


def crasher(data: str, rnd: str) -> None:
    vault = Vault(Path(data))
    stop = time.monotonic() + LIFETIME_S
    rng = random.Random(rnd)
    with vault.session(os.environ[TOKEN_ENV], "full") as s:
        mem = s.open_memory()
        k = 0
        while time.monotonic() < stop:
            answer = mem.note(f"round {rnd} note {k}")
            say(f"n {answer['id']} {k}")
            k += 1
            # Sometimes idle between writes, as a client does: a kill then
            # lands after an acknowledgement and before the next write, where
            # an acknowledged-but-uncommitted write would be lost.
            if rng.random() < 0.3:
                time.sleep(rng.uniform(0, 0.002))
            answer_naps(mem, answer["nap"], f"r{rnd}")


class Child:
    """One worker process, seen from the test."""

    def __init__(self, args: list[str], token: str, log: Path) -> None:
        self.log = log
        self._err = open(log, "wb")  # closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            env={**os.environ, TOKEN_ENV: token},
            text=True,
            encoding="utf-8",
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None  # piped
        for line in self.proc.stdout:
            # a line cut short by SIGKILL was never acknowledged
            if line.endswith("\n"):
                self._lines.put(line[:-1])
        self._lines.put(None)

    def stderr(self) -> str:
        self._err.flush()
        return self.log.read_text(errors="replace")[-4000:]

    def next(self, timeout: float) -> str:
        """The next line, or fail: the child stopped or stalled."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"worker silent for {timeout} s; stderr:\n{self.stderr()}") from None
        if line is None:
            self.proc.wait(timeout=10)
            raise AssertionError(f"worker exited ({self.proc.returncode}); stderr:\n{self.stderr()}")
        return line

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None  # piped
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def rest(self, timeout: float) -> list[str]:
        """Every remaining line until the child's output ends."""
        out: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"worker output did not end in {timeout} s; stderr:\n{self.stderr()}") from None
            if line is None:
                return out
            out.append(line)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)

    def stop(self) -> None:
        """Make sure the process is gone (idempotent; used in finally)."""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        finally:
            for f in (self.proc.stdin, self.proc.stdout):
                try:
                    if f is not None:
                        f.close()
                except OSError:
                    pass
            self._err.close()


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role == "writer":
        writer(args[0], args[1], int(args[2]), args[3] == "1")
    elif role == "crasher":
        crasher(args[0], args[1])
    else:
        raise SystemExit(f"unknown role {role}")
