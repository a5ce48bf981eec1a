"""The server starts exactly as deploy/stash.service's ExecStart line says,
with only the binary path, the data folder and the port pointed at this test's
own, and serves: health, a minted identity whose prompt carries the unit's
public URL, a note and a wake, the unit's trusted proxy. It runs under the
kernel's MemoryDenyWriteExecute (prctl PR_SET_MDWE), the same refusal of
writable-executable memory the unit asks of systemd."""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support import loopback
from tests.support.ops.deploy import UNIT_BINARY, directives, stash_executable
from tests.support.server import free_port

UNIT_DATA = "/var/lib/stash"
UNIT_PORT = "8080"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1


def refuse_exec_gain() -> None:
    """Runs in the child before exec; the kernel keeps the refusal across exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        raise OSError(
            ctypes.get_errno(),
            "prctl(PR_SET_MDWE) failed: this kernel cannot check the unit's MemoryDenyWriteExecute=yes",
        )
    os.umask(0o077)  # the unit's UMask=


def exec_start(data: Path, port: int) -> list[str]:
    d = directives("stash.service")
    assert d["StateDirectory"] == ["stash"] and UNIT_DATA == "/var/lib/" + d["StateDirectory"][0]
    argv = shlex.split(d["ExecStart"][0])
    substitutes = {UNIT_BINARY: str(stash_executable()), UNIT_DATA: str(data), UNIT_PORT: str(port)}
    for placeholder in substitutes:
        assert argv.count(placeholder) == 1, f"ExecStart should name {placeholder} once: {argv}"
    return [substitutes.get(a, a) for a in argv]


def test_the_instrument_refuses_writable_executable_memory() -> None:
    """Without this, a server that ran fine under it would prove nothing."""
    probe = "import mmap; mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)"
    res = subprocess.run(
        [sys.executable, "-c", probe], preexec_fn=refuse_exec_gain, capture_output=True, text=True, timeout=30
    )
    assert res.returncode != 0 and "PermissionError" in res.stderr, res.stderr
    assert subprocess.run([sys.executable, "-c", probe], timeout=30).returncode == 0


RECALL_WORKER = """
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from stash.core.recall import compile_pattern


def job():
    return compile_pattern("ja?de").scan(["#0 2024-01-01 chose jade", "#1 2024-01-01 chrome"], 1000)


if __name__ == "__main__":
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        print(pool.submit(job).result())
"""


def test_the_recall_worker_process_runs_under_the_same_refusal(tmp_path: Path) -> None:
    """A long recall (200,000 memories and more) scans half the log in a
    spawned worker process: it too starts and matches under the refusal."""
    script = tmp_path / "worker.py"
    script.write_text(RECALL_WORKER, encoding="utf-8")
    res = subprocess.run(
        [sys.executable, str(script)],
        preexec_fn=refuse_exec_gain,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "(['#0 2024-01-01 chose jade'], 1)"


def test_the_server_runs_as_the_unit_starts_it(tmp_path: Path) -> None:
    data, port = tmp_path / "data", free_port()
    argv = exec_start(data, port)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # systemd's, plus nothing from this shell
    for entry in directives("stash.service").get("Environment", []):
        key, _, value = entry.partition("=")
        env[key] = value
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=refuse_exec_gain,
            cwd=tmp_path,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        health = None
        while health is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                health = loopback.get(base + "/health", timeout=2.0)
            except httpx.TransportError:
                time.sleep(0.1)
        assert health is not None and health.status_code == 200, log.read_text(errors="replace")
        assert health.json()["ok"] is True
        with loopback.client(base_url=base, timeout=30.0) as http:
            minted = http.post("/init", json={})
            assert minted.status_code == 201, minted.text
            # The unit's --url is the address the agent is told to use.
            url = shlex.split(directives("stash.service")["ExecStart"][0])
            assert url[url.index("--url") + 1] in minted.json()["prompt"]
            auth = {"Authorization": f"Bearer {minted.json()['token']}"}
            assert (
                http.post("/note", json={"text": "deployed under the unit's sandbox"}, headers=auth).status_code == 200
            )
            wake = http.get("/wake", headers=auth)
            assert wake.status_code == 200 and "deployed under the unit's sandbox" in wake.text
            found = http.get("/recall", params={"q": "sand?box"}, headers=auth)
            assert found.status_code == 200 and found.json()["total"] == 1, found.text
            # A words search stems its words (PyStemmer's C): "deploying" finds "deployed" by its stem alone.
            found = http.post("/recall", json={"words": "deploying"}, headers=auth)
            assert found.status_code == 200 and found.json()["total"] == 1, found.text
            # The unit trusts the local proxy: a relayed outside client is not loopback.
            assert http.get("/metrics", headers={"X-Forwarded-For": "203.0.113.9"}).status_code == 403
            assert http.get("/metrics").status_code == 200
        # The data folder holds the user, and only its owner can read it (UMask=0077).
        users = list((data / "users").iterdir())
        assert len(users) == 1 and users[0].stat().st_mode & 0o077 == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)
    # uvicorn drains, then re-raises SIGTERM; systemd counts death by the unit's KillSignal as a clean stop.
    assert proc.returncode in (0, -signal.SIGTERM), log.read_text(errors="replace")
