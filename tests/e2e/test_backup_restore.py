"""Back up under load, restore to a new folder, serve it: every memory is
there. Real processes throughout: a ``stash serve``, writer processes noting
as fast as they can during the backup, ``stash backup`` and ``stash verify``
as the operator would run them, and a second ``stash serve`` on the copy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import pytest

from tests.support.ops.backup import log_of
from tests.support.server import CLI_TIMEOUT, REPO, Http, start_server

NOTER = Path(__file__).with_name("_noter.py")
WAIT_S = 60.0


def stash(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stash", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_backup_under_load_restores_every_memory(tmp_path: Path):
    live = start_server(tmp_path / "live")
    http = Http(live.url)
    writers: list[subprocess.Popen] = []
    stop = tmp_path / "stop"
    try:
        a, b = http.init(), http.init()
        for k in range(5):
            http.ok("POST", "/note", a["token"], json={"text": f"before the load {k}"})
        for token, label in ((a["token"], "a1"), (a["token"], "a2"), (b["token"], "b1")):
            writers.append(
                subprocess.Popen(
                    [sys.executable, str(NOTER), live.url, label, str(stop)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    cwd=REPO,
                    env={**os.environ, "STASH_TEST_TOKEN": token},
                )
            )

        # How many memories each holds, counted by a recall of every line: a wake
        # would be refused once the log outgrows WAKE_LINES with nothing napped.
        def held(token: str) -> int:
            return http.ok("POST", "/recall", token, json={"q": "."})["total"]

        wait_for(lambda: held(a["token"]) >= 30 and held(b["token"]) >= 10, "the writers to get going")
        before = {u["user_id"]: log_of(http, u["token"]) for u in (a, b)}

        backup = tmp_path / "backup"
        done = stash("backup", str(backup), "--data", str(live.data))
        assert done.returncode == 0, (done.stdout, done.stderr)
        # The writers were noting the whole time: none has stopped or failed.
        assert all(w.poll() is None for w in writers), [
            w.stderr and w.stderr.read() for w in writers if w.poll() is not None
        ]
        stop.touch()
        acked: dict[str, list[str]] = {"a": [], "b": []}
        for w in writers:
            out, err = w.communicate(timeout=WAIT_S)
            assert w.returncode == 0, err
            acked["b" if cast(list[str], w.args)[3] == "b1" else "a"].extend(out.splitlines())
        assert len(acked["a"]) > 0 and len(acked["b"]) > 0
        assert a["user_id"] in done.stdout and b["user_id"] in done.stdout
        assert str(live.data) not in done.stdout + done.stderr

        # Restore: copy the backup to a new folder and serve it.
        restored = tmp_path / "restored"
        shutil.copytree(backup, restored / "data")
        check = stash("verify", str(restored / "data"))
        assert check.returncode == 0, (check.stdout, check.stderr)
        for u in (a, b):
            deep = stash("verify", str(restored / "data"), "--token", env={"STASH_TOKEN": u["token"]})
            assert deep.returncode == 0, (deep.stdout, deep.stderr)
            assert "with the token" in deep.stdout
        after = {u["user_id"]: log_of(http, u["token"]) for u in (a, b)}
        copy = start_server(restored)
        copy_http = Http(copy.url)
        try:
            for u in (a, b):
                got = log_of(copy_http, u["token"])
                uid = u["user_id"]
                # Everything acknowledged before the backup began is there, at
                # its place with its text; the copy is a prefix of the live log.
                assert len(got) >= len(before[uid])
                assert got[: len(before[uid])] == before[uid]
                assert got == after[uid][: len(got)]
                # The restored server takes new memories after them.
                assert copy_http.ok("POST", "/note", u["token"], json={"text": "after the restore"})["id"] == len(got)
        finally:
            copy_http.close()
            copy.stop()
        # Every memory the writers were told was stored is in the live log.
        for label, lines in acked.items():
            log = after[(a if label == "a" else b)["user_id"]]
            for line in lines:
                i, text = line.split(" ", 1)
                assert log[int(i)].split(" ", 2)[2] == text
    finally:
        stop.touch()
        for w in writers:
            if w.poll() is None:
                w.kill()
                w.wait(timeout=WAIT_S)
        http.close()
        live.stop()


@pytest.mark.slow
def test_backup_refuses_a_destination_that_is_not_empty(tmp_path: Path):
    live = start_server(tmp_path / "live")
    try:
        dest = tmp_path / "dest"
        dest.mkdir()
        (dest / "something").write_text("x")
        done = stash("backup", str(dest), "--data", str(live.data))
        assert done.returncode == 2
        assert "empty" in done.stderr and str(dest) not in done.stderr
        inside = stash("backup", str(live.data / "inside"), "--data", str(live.data))
        assert inside.returncode == 2
        assert not (live.data / "inside").exists()
    finally:
        live.stop()
