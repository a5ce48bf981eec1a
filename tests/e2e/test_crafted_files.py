"""Crafted files fail fast (docs/DESIGN.md, "Formats"; SECURITY.md): a key
ring whose ``keyring_meta`` is replaced by a view over an endless
``WITH RECURSIVE`` query, and a memory file given an extra trigger and view,
both made with the sqlite3 module as an attacker with the data folder would.
``stash verify`` and ``stash backup`` (real processes) finish, fail that
user as damaged and go on to the next, which is still copied whole; a
request of the crafted user answers ``store.damaged`` at once; a server
holding one stops on SIGTERM. On SQLCipher and plain stores (a SQLCipher
memory file cannot be crafted without its key, so the memory-file case runs
on plain stores only)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from stash.web.app import create_app
from tests.helpers import Api, make_settings
from tests.live import CLI_TIMEOUT, REPO, STOP_TIMEOUT, Http, Server

ENDLESS = ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
           "SELECT 'user_id' AS name, CAST(n AS TEXT) AS value FROM r")


def craft_keyring(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("ALTER TABLE keyring_meta RENAME TO keyring_meta_kept")
    conn.execute(f"CREATE VIEW keyring_meta AS {ENDLESS}")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def craft_memory(path: Path) -> None:
    """An extra view and a trigger that would loop on the next note (the
    user has noted, so its log is made; its summaries are not yet)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"CREATE VIEW endless AS {ENDLESS}")
    conn.execute("CREATE TRIGGER log_spin BEFORE INSERT ON log BEGIN "
                 "SELECT COUNT(*) FROM endless; END")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def two_users(data: Path, cipher: str) -> tuple[list[dict], Api]:
    api = Api(create_app(make_settings(data, file_cipher=cipher)))
    users = []
    for _ in range(2):
        ident = api.init()
        for k in range(3):
            assert api.post("/note", ident["token"], json={"text": f"memory {k}"}).status_code == 200
        users.append(ident)
    api.close()
    users.sort(key=lambda u: u["user_id"])  # the crafted one first: the next must still be copied
    return users, api


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    # Bounded: a tool that hangs on the crafted file fails here instead of stalling the suite.
    return subprocess.run([sys.executable, "-m", "stash", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT)


def request_in_thread(api: Api, token: str) -> dict:
    out: dict = {}

    def go() -> None:
        resp = api.get("/wake", token)
        out["status"], out["body"] = resp.status_code, resp.json()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(CLI_TIMEOUT)
    assert not t.is_alive(), "the request of the crafted user never returned"
    return out


CASES = [("sqlcipher", "keyring"), ("none", "keyring"), ("none", "memory")]


@pytest.mark.parametrize(("cipher", "which"), CASES)
def test_verify_backup_and_a_request_refuse_a_crafted_file_and_go_on(tmp_path: Path, cipher: str, which: str):
    data = tmp_path / "data"
    users, _ = two_users(data, cipher)
    crafted, other = users
    folder = data / "users" / crafted["user_id"]
    if which == "keyring":
        craft_keyring(folder / "keyring.db")
    else:
        craft_memory(folder / "memory.db")

    done = cli("verify", str(data))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line[:1].isalnum() and "  " in line}
    assert "ok" not in lines[crafted["user_id"]].split()[1], lines
    assert lines[other["user_id"]].split()[1] == "ok", lines
    assert "1 failed" in done.stdout

    dest = tmp_path / "backup"
    done = cli("backup", "--data", str(data), str(dest))
    assert done.returncode == 1, done.stdout + done.stderr
    assert (dest / "users" / other["user_id"] / "memory.db").is_file()
    # Backup checks each copy as verify does: the next user's copy is whole.
    assert f"{other['user_id']}  ok" in done.stdout, done.stdout
    assert f"{crafted['user_id']}  ok" not in done.stdout, done.stdout

    api = Api(create_app(make_settings(data, file_cipher=cipher)))
    try:
        answer = request_in_thread(api, crafted["token"])
        assert answer["status"] == 500 and answer["body"]["error"] == "store.damaged", answer
        assert api.get("/wake", other["token"]).status_code == 200
    finally:
        api.close()


@pytest.mark.slow
def test_a_server_holding_a_crafted_key_ring_answers_and_stops_on_sigterm(tmp_path: Path):
    data = tmp_path / "data"
    users, _ = two_users(data, "none")
    craft_keyring(data / "users" / users[0]["user_id"] / "keyring.db")
    server = Server(data=data, log=tmp_path / "server.log", extra=["--shutdown-timeout", "3"]).start()
    http = Http(server.url)
    try:
        resp = http.get("/wake", users[0]["token"])
        assert resp.status_code == 500 and resp.json()["error"] == "store.damaged", resp.text
        assert server.proc is not None
        server.proc.terminate()
        assert server.proc.wait(timeout=STOP_TIMEOUT) == 0
    finally:
        http.close()
        server.stop()
    assert "graceful shutdown exceeded" not in server.log_text().lower()
