"""A data folder written by the release before key epochs
(tests/fixtures/release1, made by that release's own code with
tests/fixtures/make_release1.py) is served by this one without loss; each
capability moves to key epochs when its token is next used, and `stash
verify` counts those that have not."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from stash.crypto import tokens
from tests.fixtures import make_release1 as fixture
from tests.support.api import assert_error
from tests.support.server import CLI_TIMEOUT, REPO, Http, Server

pytestmark = pytest.mark.slow

SOURCE = Path(__file__).resolve().parents[1] / "fixtures" / "release1"


def token_of(label: str) -> str:
    body = f"stash1_{fixture.USER_ID}_{tokens._b62(int.from_bytes(fixture.secret_of(label), 'big'), 43)}"
    return body + tokens._checksum(body)


def verify(data: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "stash", "verify", str(data)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def moved(data: Path) -> dict[int, bool]:
    conn = sqlite3.connect(data / "users" / fixture.USER_ID / "keyring.db")
    try:
        cols = {r[1] for r in conn.execute("PRAGMA table_info(grants)")}
        if "pub" not in cols:
            return {gid: False for (gid,) in conn.execute("SELECT id FROM grants WHERE wrapped IS NOT NULL")}
        return dict(conn.execute("SELECT id, pub IS NOT NULL FROM grants WHERE wrapped IS NOT NULL"))
    finally:
        conn.close()


def test_a_release1_folder_is_served_whole_and_each_capability_moves_when_used(tmp_path: Path):
    data = tmp_path / "data"
    shutil.copytree(SOURCE, data)
    assert "3 live capabilities have not moved to key epochs yet" in verify(data)
    owner, full, read, revoked = (token_of(x) for x in ("owner", "full", "read", "revoked"))
    server = Server(data=data, log=tmp_path / "server.log").start()
    http = Http(server.url)
    try:
        assert_error(http.get("/wake", revoked), 401, "auth.invalid")
        # Every memory the old release wrote, verbatim, in order; the two it erased stay erased.
        found = http.ok("POST", "/recall", read, json={"q": "^#\\d+ 2026-11-30 fixture memory"})
        assert found["total"] == fixture.T - len(fixture.ERASED)
        for i in (0, 6, 150, fixture.T - 1):
            assert http.ok("POST", "/recall", read, json={"q": f"^#{i} "})["matches"] == [
                f"#{i} 2026-11-30 {fixture.memory_text(i)}"
            ]
        for i in fixture.ERASED:
            assert http.ok("POST", "/recall", read, json={"q": f"^#{i} "})["matches"] == [f"#{i} 2026-11-30 [erased]"]
        assert http.ok("GET", "/config", owner)["sizes"]["WAKE_LINES"] == 40
        assert len(http.ok("GET", "/erasures", owner)["erasures"]) == 1
        assert moved(data) == {1: True, 2: False, 3: True}
        assert "1 live capability has not moved to key epochs yet" in verify(data)
        # The summaries the old release kept are served as written.
        zoom = http.ok("POST", "/zoom", owner, json={"block": "0-3"})["lines"]
        assert zoom == ["#0-1 fixture summary of 0-1", "#2-3 fixture summary of 2-3"]
        # The full capability writes and reads back, the tree settles, the wake is whole.
        http.ok("POST", "/note", full, json={"text": "written after the upgrade"})
        while (nap := http.ok("POST", "/nap", full, json={})["nap"]) is not None:
            http.ok("POST", "/nap", full, json={"block": nap["block"], "text": f"resettled {nap['block']}"})
        wake = http.ok("GET", "/wake", read)
        assert wake["awake"] and wake["T"] == fixture.T + 1
        assert wake["lines"][-1].endswith("written after the upgrade")
        assert "every live capability has moved to key epochs" in verify(data)
    finally:
        server.stop()


def test_a_revocation_revokes_the_capabilities_that_have_not_moved(tmp_path: Path):
    data = tmp_path / "data"
    shutil.copytree(SOURCE, data)
    owner, full, read = (token_of(x) for x in ("owner", "full", "read"))
    server = Server(data=data, log=tmp_path / "server.log").start()
    http = Http(server.url)
    try:
        http.ok("GET", "/config", full)  # full moves; read never shows up
        answer = http.ok("DELETE", "/grants/2", owner)
        # The unmoved read capability cannot be sealed a new epoch without its
        # secret, so it ends with this revocation rather than keep a key the
        # revoked one also holds.
        assert answer["also_revoked"] == [3] and answer["epoch"] == 1
        assert_error(http.get("/wake", full), 401, "auth.invalid")
        assert_error(http.get("/wake", read), 401, "auth.invalid")
        assert http.ok("POST", "/recall", owner, json={"q": "fixture memory 299"})["total"] == 1
    finally:
        server.stop()
