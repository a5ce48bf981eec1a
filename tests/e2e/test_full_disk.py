"""A full data disk under a real ``stash serve --workers 2``: a clear, local
refusal. Writes that need space answer ``507 store.full`` — when a few dozen
KiB are left as when not one byte is — never ``503 store.unreadable``; reads,
``/health`` and ``/metrics`` keep answering, reads even of files no
worker has open (with no room for SQLite's WAL index); no worker dies (the workers'
metrics files are not on the data disk, where a write to a mapped page with no
room behind it would kill the worker with SIGBUS); once space is back, writes
work without a restart and every acknowledged note is there.

The disk is a real tmpfs mounted for the test (the suite runs as root); the
test fails on a server that keeps those metrics files in the data folder."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.support.api import CHEAP_KDF_FLAGS, assert_error
from tests.support.files.disk_space import fill
from tests.support.ops.backup import log_of
from tests.support.server import Http, Server, metrics_folder, worker_pids


def _mount_tmpfs(where: Path, size: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs as the full disk needs root (CI runs the suite as root)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True, timeout=30
    )
    if done.returncode != 0:
        pytest.skip(f"this host does not let the test mount a tmpfs ({done.stderr.strip()[:200]})")


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "disk"
    where.mkdir()
    _mount_tmpfs(where, "8m")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


@pytest.mark.slow
def test_two_workers_on_a_full_disk_refuse_writes_with_507_and_keep_serving(disk: Path, tmp_path: Path) -> None:
    srv = Server(
        data=disk / "data", log=tmp_path / "server.log", extra=["--workers", "2", "--keep-open", "0", *CHEAP_KDF_FLAGS]
    ).start()
    http = Http(srv.url)
    try:
        token = http.init()["token"]
        acked: list[str] = []

        def note(text: str):
            resp = http.post("/note", token, json={"text": text})
            if resp.status_code == 200:
                assert resp.json()["id"] == len(acked)
                acked.append(text)
            return resp

        while http.ok("POST", "/nap", token, json={})["nap"] is None:  # a block is due: a nap needs space
            assert note(f"avocet before the flood {len(acked)}").status_code == 200
        before = worker_pids(srv.proc.pid)
        assert len(before) >= 2
        counters = metrics_folder(min(before))
        assert any(counters.glob("*.db"))
        assert os.stat(counters).st_dev != os.stat(disk).st_dev
        assert os.stat(counters).st_mode & 0o777 == 0o700

        # A few dozen KiB left: notes succeed while they fit, and the first
        # that does not is refused as a full disk, not as an unreadable file.
        filler = fill(disk, leave=48 * 1024)
        for k in range(400):
            resp = note(f"avocet at the brim {k} " + "x" * 200)
            if resp.status_code != 200:
                assert_error(resp, 507, "store.full")
                break
        else:
            pytest.fail("400 notes of 200 bytes fitted in 48 KiB")
        fill(disk)
        for _ in range(2):
            # A note or a summary may still fit in WAL pages the file already
            # holds; whatever did not fit is refused as a full disk.
            resp = note("avocet in the flood")
            if resp.status_code != 200:
                assert_error(resp, 507, "store.full")
            nap = http.post("/nap", token, json={})
            if nap.status_code == 200 and nap.json()["nap"] is not None:
                due = nap.json()["nap"]["block"]
                resp = http.post("/nap", token, json={"block": due, "text": "the flood"})
                if resp.status_code != 200:
                    assert_error(resp, 507, "store.full")
            else:
                assert_error(nap, 507, "store.full")
            today = datetime.now(UTC).date().isoformat()
            entries = [{"date": today, "text": f"imported avocet {j} " + "y" * 200} for j in range(400)]
            assert_error(http.post("/import", token, json={"entries": entries}), 507, "store.full")
            for _ in range(3):  # each on a new connection, which either worker may take
                fresh = Http(srv.url)
                try:
                    assert fresh.get("/health").status_code == 200
                    assert fresh.get("/metrics").status_code == 200
                    # --keep-open 0: every read opens the files anew, with no room for SQLite's WAL index
                    wake = fresh.get("/wake", token)
                    assert wake.status_code == 200, wake.text
                    assert wake.json()["T"] == len(acked)
                    assert fresh.get("/recall", token, params={"q": "avocet"}).status_code == 200
                finally:
                    fresh.close()
        assert worker_pids(srv.proc.pid) == before, srv.log_text()[-3000:]
        assert "SIGBUS" not in srv.log_text() and "Traceback" not in srv.log_text()

        filler.unlink()  # space back: no restart
        assert note("avocet after the flood").status_code == 200
        body = http.ok("GET", "/wake", token)
        assert body["T"] == len(acked)
        assert [line.split(" ", 2)[2] for line in log_of(http, token)] == acked
        assert worker_pids(srv.proc.pid) == before
    finally:
        http.close()
        srv.stop()
    assert not counters.exists()  # the server removes its counter folder when it stops
