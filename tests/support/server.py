"""A real ``stash serve`` process on a free loopback port, real HTTP through
httpx, and the ``stash`` client run as a subprocess: the one launcher of the
end-to-end, invariant and deploy tests and of bench/; and a server's worker
processes as /proc shows them.

Every wait is bounded, so a server that hangs fails the test instead of
stalling CI."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support import loopback
from tests.support.api import BearerClient
from tests.support.installed import CHECKOUT, OUTSIDE, child_env

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
HTTP_TIMEOUT = 30.0
CLI_TIMEOUT = 60.0
REPO = CHECKOUT
TOKEN_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def live_group_members(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that still run (a zombie holds no file or
    port, and whoever adopted it may take a while to reap it)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


# Every test client connects from 127.0.0.1: lift the per-address limits.
LIFTED_LIMITS = ("--init-per-minute", "100000", "--auth-failures-per-minute", "100000", "--init-per-day", "100000000")


# Every server this test process started, for STASH_DEBUG's report of a failed test.
STARTED: list[Server] = []


@dataclass
class Server:
    """One ``python -m stash serve`` process and where its output goes.

    Tests take the defaults: the installed ``stash``, run from a working
    directory outside the checkout (tests/support/installed.py). bench/ sets
    ``limits`` to what it measures, leaves out the caller's ``STASH_*``
    variables, and may run another checkout's server (``cwd`` and ``env``
    with its PYTHONPATH)."""

    data: Path
    log: Path
    extra: list[str] = field(default_factory=list)
    prefix: list[str] = field(default_factory=list)  # a command the server runs under, e.g. setpriv
    limits: list[str] = field(default_factory=lambda: list(LIFTED_LIMITS))  # per-address limit flags
    env: dict[str, str] = field(default_factory=dict)  # set over the inherited environment
    inherit_stash_env: bool = True  # False: no STASH_* variable of the caller reaches the server
    cwd: Path = OUTSIDE  # ``-m stash`` imports a package found here first: none, so the installed one
    port: int = 0
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        """The server's process, once started."""
        if self._proc is None:
            raise RuntimeError("the server was never started")
        return self._proc

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, same_port: bool = False) -> Server:
        STARTED.append(self)  # under STASH_DEBUG, a failing test shows this server's log (tests/conftest.py)
        # A port can be taken between probing and binding; retry on a new one.
        for attempt in range(3):
            if not (same_port and attempt == 0 and self.port):
                self.port = free_port()
            with open(self.log, "ab") as out:
                # Its own session, so kill9() can take every worker process with it.
                self._proc = subprocess.Popen(
                    [*self.prefix, *self.argv()],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=self.cwd,
                    env=self.environment(),
                    start_new_session=True,
                )
            if self._wait_healthy():
                return self
            self.stop()
        raise RuntimeError(f"stash serve did not come up; its log:\n{self.log_text()[-4000:]}")

    def environment(self) -> dict[str, str]:
        """The environment the server runs with."""
        env = {k: v for k, v in child_env().items() if self.inherit_stash_env or not k.startswith("STASH_")}
        return {**env, "PYTHONUNBUFFERED": "1", **self.env}

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "stash",
            "serve",
            "--data",
            str(self.data),
            "--port",
            str(self.port),
            "--host",
            "127.0.0.1",
            *self.limits,
            *self.extra,
        ]

    @property
    def command(self) -> str:
        """The command line after the interpreter, as a report names it."""
        return " ".join(self.argv()[1:])

    def cpu_seconds(self) -> float:
        """User plus system CPU the server's main process has used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _wait_healthy(self) -> bool:
        # Until the port takes a connection, a bare connect() asks: building an httpx client per attempt costs
        # the test process tens of milliseconds of CPU each, taken from the server it waits for.
        deadline = time.monotonic() + START_TIMEOUT
        with loopback.client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    return False
                if self._accepts():
                    try:
                        if client.get(self.url + "/health").status_code == 200:
                            return True
                    except httpx.TransportError:
                        pass
                time.sleep(0.01)
        return False

    def _accepts(self) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        if self._proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT)

    def kill9(self) -> None:
        """SIGKILL the server and every process it started (its workers), as
        a power cut would stop them: no handler runs, nothing is flushed."""
        if self._proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=STOP_TIMEOUT)
        deadline = time.monotonic() + STOP_TIMEOUT
        while time.monotonic() < deadline:
            if not live_group_members(self.proc.pid):
                return
            time.sleep(0.05)
        raise RuntimeError("server workers outlived SIGKILL")

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Http(BearerClient):
    """A sync httpx client bound to one real server."""

    def __init__(self, base: str) -> None:
        self.client = loopback.client(base_url=base, timeout=HTTP_TIMEOUT)

    def send(self, method: str, url: str | httpx.URL, headers: dict, **kw) -> httpx.Response:
        return self.client.request(method, url, headers=headers, **kw)

    def init(self) -> dict:
        resp = self.post("/init", json={})
        assert resp.status_code == 201, resp.text
        return resp.json()

    def ok(self, method: str, url: str, token: str | None = None, **kw) -> dict:
        resp = self.request(method, url, token, **kw)
        assert resp.status_code in (200, 201), (method, url, resp.status_code, resp.text)
        return resp.json()

    def close(self) -> None:
        self.client.close()


def settle_all(http: Http, tok: str) -> None:
    """Write every pending summary, one nap at a time, until none is due."""
    nap = http.ok("POST", "/nap", tok, json={})["nap"]
    while nap:
        nap = http.ok("POST", "/nap", tok, json={"block": nap["block"], "text": f"sum {nap['block']}"})["nap"]


def start_server(tmp: Path, *extra: str) -> Server:
    tmp.mkdir(parents=True, exist_ok=True)
    return Server(data=tmp / "data", log=tmp / "server.log", extra=list(extra)).start()


def today_range() -> set[str]:
    """The UTC dates a memory written around now may carry (a test can cross midnight)."""
    now = dt.datetime.now(dt.UTC)
    return {(now + dt.timedelta(minutes=d)).date().isoformat() for d in (-5, 0, 5)}


def due_after(T: int) -> list[str]:
    """Oracle, from docs/DESIGN.md, "Nap": when every earlier block is settled, appending
    memory #T-1 makes due exactly the blocks ending at T, smallest first."""
    out, size = [], 2
    while size <= T:
        if T % size == 0:
            out.append(f"{T - size}-{T - 1}")
        size *= 2
    return out


def secret_parts(tok: str) -> tuple[str, str, bytes]:
    """A token's secret as printed with and without its checksum, and as the
    raw 32 bytes it encodes (base62, docs/DESIGN.md, "Tokens")."""
    tail = tok.split("_")[2]
    digits = tail[:-6]
    n = 0
    for c in digits:
        n = n * 62 + TOKEN_ALPHABET.index(c)
    return tail, digits, n.to_bytes(32, "big")


# ---------------------------------------------------------------- the client as a subprocess


@dataclass
class Cli:
    """Runs the ``stash`` client as a child process, the way a shell would."""

    argv0: list[str]
    env: dict[str, str]

    def run(
        self, *args: str, env: dict[str, str] | None = None, stdin: str | None = None, cwd: Path = OUTSIDE
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.argv0, *args],
            env=env if env is not None else self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
            cwd=cwd,
        )

    def ok(self, *args: str, **kw) -> str:
        res = self.run(*args, **kw)
        assert res.returncode == 0, (args, res.returncode, res.stdout, res.stderr)
        return res.stdout

    def shell(self, line: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run a printed command exactly as an agent would paste it into a shell."""
        return subprocess.run(
            ["/bin/sh", "-c", line],
            env=env if env is not None else self.env,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
            cwd=OUTSIDE,
        )


def interrupted_while_waiting(
    argv: list[str], env_for: Callable[[str], dict[str, str]], **popen: Any
) -> tuple[int, str]:
    """Run ``argv`` against a server that accepts and never answers
    (``env_for`` makes its environment from that server's URL), send it SIGINT
    once its request is sent, as Ctrl-C would; its exit status and stderr."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    silent.settimeout(CLI_TIMEOUT)
    proc = subprocess.Popen(
        argv,
        env=env_for(f"http://127.0.0.1:{silent.getsockname()[1]}"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )
    assert proc.stdout is not None and proc.stderr is not None  # both piped
    try:
        conn, _ = silent.accept()  # the client is now waiting for an answer
        conn.settimeout(CLI_TIMEOUT)
        conn.recv(4096)  # and has sent its request
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=CLI_TIMEOUT)
        conn.close()
        return code, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=CLI_TIMEOUT)
        proc.stdout.close()
        proc.stderr.close()
        silent.close()


def path_with(folder: Path) -> str:
    """A PATH that finds ``folder`` first, then only the system's basic tools,
    so no ``stash`` installed elsewhere can answer for the one under test."""
    return os.pathsep.join([str(folder), "/usr/bin", "/bin"])


def python_bin(folder: Path) -> Path:
    """A folder whose ``python3`` is this interpreter, so the client's
    ``#!/usr/bin/env python3`` line runs under the test's Python."""
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "python3"
    if not link.exists():
        link.symlink_to(sys.executable)
    return folder


def cli_env(base_url: str, tok: str | None, path: str) -> dict[str, str]:
    env = {
        "PATH": path,
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "STASH_URL": base_url,
    }
    if tok is not None:
        env["STASH_TOKEN"] = tok
    return env


def stop_group(srv: Server) -> None:
    """Stop a server run under ``faketime``, which runs it as a child: the
    whole process group, then wait until none of it is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(srv.proc.pid, signal.SIGTERM)
    srv.proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while live_group_members(srv.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not live_group_members(srv.proc.pid)


def worker_pids(pid: int) -> set[int]:
    """The server's worker processes (its children)."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        out.update(int(c) for c in (task / "children").read_text().split())
    return out


def metrics_folder(worker: int) -> Path:
    """Where a worker keeps its metrics files, from its environment."""
    env = Path(f"/proc/{worker}/environ").read_bytes().split(b"\0")
    return Path(next(v for v in env if v.startswith(b"PROMETHEUS_MULTIPROC_DIR=")).split(b"=", 1)[1].decode())


def stash(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """One ``stash`` command of the installed package (run from outside the
    checkout), with ``env`` over the test environment; its output kept."""
    return subprocess.run(
        [sys.executable, "-m", "stash", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        cwd=OUTSIDE,
        env={**child_env(), **env},
    )
