"""The first week's stumbles of a newcomer and an operator (issue 30), on a
real server: the README's curl ``init`` line shows a refusal and fails,
``stash serve`` checks its port and data folder before it says it listens,
and logs its shutdown."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.support.server import CLI_TIMEOUT, REPO, free_port, path_with, python_bin, start_server

README_ADDRESS = "http://127.0.0.1:8080"


def readme_init_line() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## A first session", 1)[1].split("\n## ", 1)[0]
    return next(line for line in section.splitlines() if "STASH_TOKEN=" in line and "/init" in line)


def test_the_readmes_curl_init_line_shows_a_refusal_and_fails(base_url: str, tmp_path: Path) -> None:
    # A path no route answers stands in for any refusal: the server answers its JSON error with a message.
    line = readme_init_line()
    script = (
        f"export STASH_URL={base_url}/no-such-prefix\n{line}\n"
        'echo "status=$?"; env | grep "^STASH_TOKEN=" || echo "no STASH_TOKEN exported"\n'
    )
    env = {"PATH": path_with(python_bin(tmp_path / "bin")), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    done = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT)
    assert "Traceback" not in done.stderr
    assert re.search(r"^stash: .+", done.stderr, re.M), done.stderr  # the server's own sentence
    assert "status=0" not in done.stdout and "status=" in done.stdout
    assert "no STASH_TOKEN exported" in done.stdout


def serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    import sys

    return subprocess.run(
        [sys.executable, "-m", "stash", "serve", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        cwd=tmp_path,
    )


def test_serve_on_a_busy_port_says_so_before_listening(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = serve(tmp_path, "--data", str(tmp_path / "data"), "--port", str(port))
    assert done.returncode == 2
    assert "listening" not in done.stdout + done.stderr and "Traceback" not in done.stderr
    assert f"port {port} on 127.0.0.1 is already in use" in done.stderr and "--port" in done.stderr


def test_serve_with_an_unusable_data_folder_says_so_before_listening(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    for data in ("/proc/nope", str(tmp_path / "file")):
        done = serve(tmp_path, "--data", data, "--port", str(free_port()))
        assert done.returncode == 2, done.stderr
        assert "listening" not in done.stdout + done.stderr and "Traceback" not in done.stderr
        assert f"cannot use the data folder {data}" in done.stderr and "--data" in done.stderr


def test_sigterm_logs_one_line_when_shutdown_starts_and_one_when_it_ends(tmp_path: Path) -> None:
    srv = start_server(tmp_path)
    srv.stop()
    log = srv.log_text()
    assert srv.proc.returncode == 0, log
    lines = log.splitlines()
    started = [i for i, line in enumerate(lines) if "stash: shutting down" in line]
    ended = [i for i, line in enumerate(lines) if line.startswith("stash: stopped")]
    assert len(started) == 1 and len(ended) == 1 and started[0] < ended[0], log
