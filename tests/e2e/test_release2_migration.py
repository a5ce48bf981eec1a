"""A data folder written by the release before 4 KiB pages
(tests/fixtures/release2, made by that release's own code with
tests/fixtures/make_release2.py: 16 KiB pages, every table made with its
file) is served by this one without loss, written to, served again after a
restart, and keeps its page size: nothing converts it."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import make_release2 as fixture
from tests.support.api import assert_error
from tests.support.server import CLI_TIMEOUT, REPO, Http, Server

pytestmark = pytest.mark.slow

SOURCE = Path(__file__).resolve().parents[1] / "fixtures" / "release2"
LEGACY_PAGE = 16384


def verify(data: Path, token: str | None = None) -> str:
    env = {**os.environ, "STASH_TOKEN": token} if token else {k: v for k, v in os.environ.items() if k != "STASH_TOKEN"}
    out = subprocess.run(
        [sys.executable, "-m", "stash", "verify", str(data), *(["--token"] if token else [])],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        cwd=REPO,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def folder(data: Path) -> Path:
    return data / "users" / fixture.USER_ID


def keyring_page_size(data: Path) -> int:
    conn = sqlite3.connect(folder(data) / "keyring.db")
    try:
        return int(conn.execute("PRAGMA page_size").fetchone()[0])
    finally:
        conn.close()


def everything(http: Http, T: int) -> dict:
    """What the store serves, read through every capability that may read it."""
    owner, laptop, phone = (fixture.token_of(x) for x in ("owner", "laptop", "phone"))
    found = http.ok("POST", "/recall", phone, json={"q": "^#\\d+ 2026-12-01 fixture memory"})
    grants = {g["id"]: g for g in http.ok("GET", "/grants", owner)["grants"]}
    return {
        "wake": http.ok("GET", "/wake", laptop),
        "fixture_memories": found["total"],
        "lines": {
            i: http.ok("POST", "/recall", phone, json={"q": f"^#{i} "})["matches"]
            for i in (0, 5, 6, 77, 150, fixture.T - 1, fixture.T)
        },
        "zoom": http.ok("POST", "/zoom", owner, json={"block": "0-3"})["lines"],
        "config": http.ok("GET", "/config", owner)["sizes"]["WAKE_LINES"],
        "erasures": http.ok("GET", "/erasures", owner)["erasures"],
        "grants": {i: (g["scope"], g["label"], g["expires"], g["live"]) for i, g in grants.items()},
        "audit": [(e["grant"], e["event"]) for e in http.ok("GET", "/audit", owner)["events"]],
        "T": T,
    }


def test_a_release2_folder_is_served_whole_written_to_and_served_again_after_a_restart(tmp_path: Path):
    data = tmp_path / "data"
    shutil.copytree(SOURCE, data)
    assert "26 encrypted pages" in verify(data)
    owner, laptop, phone, gone = (fixture.token_of(x) for x in fixture.LABELS)
    server = Server(data=data, log=tmp_path / "server.log").start()
    http = Http(server.url)
    try:
        assert_error(http.get("/wake", gone), 401, "auth.invalid")
        before = everything(http, fixture.T + 1)
        # Every memory the old release wrote, verbatim and in order; the two it erased stay erased.
        assert before["fixture_memories"] == fixture.T - len(fixture.ERASED)
        assert before["lines"][0] == [f"#0 {fixture.DAY} {fixture.memory_text(0)}"]
        assert before["lines"][150] == [f"#150 {fixture.DAY} {fixture.memory_text(150)}"]
        assert before["lines"][5] == [f"#5 {fixture.DAY} [erased]"]
        assert before["lines"][77] == [f"#77 {fixture.DAY} [erased]"]
        assert before["lines"][fixture.T] == [f"#{fixture.T} {fixture.DAY} {fixture.IDEMPOTENT_NOTE}"]
        assert before["zoom"] == ["#0-1 fixture summary of 0-1", "#2-3 fixture summary of 2-3"]
        assert before["wake"]["awake"] and before["wake"]["T"] == fixture.T + 1
        assert before["config"] == 40 and len(before["erasures"]) == 1
        assert before["grants"] == {
            1: ("owner", None, None, True),
            2: ("full", "laptop", None, True),
            3: ("read", "phone", fixture.EXPIRES, True),
            4: ("full", "gone", None, False),
        }
        assert before["audit"] == [(1, "mint"), (1, "mint"), (1, "mint"), (1, "revoke"), (2, "erase")]

        # Writes of every kind to the old files: a note, a nap, a setting, a
        # new capability, a revocation (a new key epoch, the file re-sealed).
        http.ok("POST", "/note", laptop, json={"text": "written after the upgrade"})
        while (nap := http.ok("POST", "/nap", laptop, json={})["nap"]) is not None:
            http.ok("POST", "/nap", laptop, json={"block": nap["block"], "text": f"resettled {nap['block']}"})
        http.ok("POST", "/config", owner, json={"WAKE_LINES": 50})
        minted = http.ok("POST", "/grants", owner, json={"scope": "read", "label": "after"})
        assert http.ok("DELETE", "/grants/3", owner)["epoch"] == 2
        assert_error(http.get("/wake", phone), 401, "auth.invalid")
        wake = http.ok("GET", "/wake", minted["token"])
        assert wake["T"] == fixture.T + 2 and wake["lines"][-1].endswith("written after the upgrade")
    finally:
        server.stop()

    # The old files kept their page size: the new release serves them as they are.
    assert keyring_page_size(data) == LEGACY_PAGE
    assert (folder(data) / "memory.db").stat().st_size % LEGACY_PAGE == 0
    assert "every live capability has moved to key epochs" in verify(data)
    assert "with the token: 302 notes and" in verify(data, owner)

    server = Server(data=data, log=tmp_path / "server2.log").start()
    http = Http(server.url)
    try:
        assert http.ok("POST", "/recall", minted["token"], json={"q": "written after the upgrade"})["total"] == 1
        assert http.ok("POST", "/recall", laptop, json={"q": "^#\\d+ 2026-12-01 fixture memory"})["total"] == (
            fixture.T - len(fixture.ERASED)
        )
        assert http.ok("POST", "/recall", laptop, json={"q": "^#150 "})["matches"] == [
            f"#150 {fixture.DAY} {fixture.memory_text(150)}"
        ]
        assert http.ok("GET", "/config", owner)["sizes"]["WAKE_LINES"] == 50
        assert http.ok("POST", "/zoom", owner, json={"block": "0-3"})["lines"] == before["zoom"]
        grants = {g["id"]: (g["label"], g["live"]) for g in http.ok("GET", "/grants", owner)["grants"]}
        assert grants == {
            1: (None, True),
            2: ("laptop", True),
            3: ("phone", False),
            4: ("gone", False),
            5: ("after", True),
        }
        assert_error(http.get("/wake", gone), 401, "auth.invalid")
    finally:
        server.stop()
