"""Damage a stopped server's files, start it, and see the server and ``stash
verify`` agree: a ``memory.db`` cut to 0 bytes or to a sixth, the key ring's
copy of the state version put ahead of or behind the memory file's. A server
never writes into a file it has just found damaged: the evidence stays
exactly as it was, request after request, and verify still says FAIL after
the server has seen it."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from stash.service.access import Vault
from stash.service.ops.verify import verify as verify_folder
from stash.storage.keyring import STATE_COPY, state_copies
from stash.storage.sqlite.transactions import write_transaction
from tests.support.api import CHEAP_KDF_FLAGS, assert_error
from tests.support.server import Http, Server


def verify(data: Path, token: str | None = None) -> dict[str, str]:
    """What ``stash verify`` says of each user (its own code, in this process), by user id."""
    return {
        r.user_id: ("ok  " if r.ok else "FAIL") + "  " + "; ".join(r.problems or r.facts)
        for r in verify_folder(data, token)
    }


def state_copy(folder: Path, change: int = 0, token: str | None = None) -> int:
    """The key ring's copy of the state version, moved by ``change`` first
    and sealed with ``token``'s keys, as a server leaves it (one edited by
    hand fails its MAC: storage/keyring/state_copies.py)."""
    chain = None
    if change:
        with Vault(folder.parent.parent).session(token, "read") as s:
            chain = s.keys
    conn = sqlite3.connect(folder / "keyring.db", isolation_level=None)
    try:
        value = int(conn.execute("SELECT value FROM keyring_meta WHERE name = ?", (STATE_COPY,)).fetchone()[0])
        if chain is not None:
            with write_transaction(conn):
                state_copies.put(conn, folder.name, chain, {STATE_COPY: str(value + change)})
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return int(conn.execute("SELECT value FROM keyring_meta WHERE name = ?", (STATE_COPY,)).fetchone()[0])
    finally:
        conn.close()


@pytest.mark.slow
def test_damage_found_by_the_server_stays_as_it_was_and_verify_agrees(tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = Server(data=data, log=tmp_path / "server.log", extra=list(CHEAP_KDF_FLAGS)).start()
    http = Http(srv.url)
    today = datetime.now(UTC).date().isoformat()
    try:
        users = {}
        for case in ("empty", "cut", "ahead", "behind", "intact"):
            ident = http.init()
            users[case] = (ident["token"], data / "users" / ident["user_id"])
            # A sixth of 300 sealed rows' pages cannot hold them even at the smallest bucket, which is all a
            # verify without the token can count them at (deploy/README.md, "stash verify").
            n = 300 if case == "cut" else 8
            entries = [{"date": today, "text": f"{case} dunlin {k} " + "z" * 100} for k in range(n)]
            http.ok("POST", "/import", ident["token"], json={"entries": entries})
    finally:
        http.close()
        srv.stop()

    def memory(case: str) -> Path:
        return users[case][1] / "memory.db"

    memory("empty").write_bytes(b"")
    with open(memory("cut"), "r+b") as f:
        f.truncate(memory("cut").stat().st_size // 6 // 4096 * 4096)
    state_copy(users["ahead"][1], +1, users["ahead"][0])
    behind = state_copy(users["behind"][1], -1, users["behind"][0])
    evidence = {case: memory(case).read_bytes() for case in ("empty", "cut")}

    def check_verify() -> None:
        lines = verify(data)
        for case in ("empty", "cut", "ahead", "behind", "intact"):
            user_id = users[case][1].name
            assert ("FAIL" in lines[user_id]) == (case in ("empty", "cut")), lines[user_id]
        for case in ("ahead", "behind"):  # what only the token shows: the state version inside the file
            with_token = verify(data, users[case][0])[users[case][1].name]
            assert ("FAIL" in with_token) == (case == "ahead"), with_token

    check_verify()
    srv.start()
    http = Http(srv.url)
    try:
        for _ in range(3):
            for case, code in (("empty", "store.damaged"), ("cut", "store.damaged"), ("ahead", "store.rolled_back")):
                token = users[case][0]
                assert_error(http.get("/wake", token), 500, code)
                assert_error(http.post("/note", token, json={"text": "one more dunlin"}), 500, code)
        for case in ("behind", "intact"):
            assert http.ok("GET", "/wake", users[case][0])["T"] == 8
            assert http.ok("POST", "/note", users[case][0], json={"text": "one more dunlin"})["id"] == 8
    finally:
        http.close()
        srv.stop()
    for case, before in evidence.items():
        assert memory(case).read_bytes() == before, f"the server wrote into the {case} memory file"
    assert state_copy(users["behind"][1]) > behind  # the next write brought the lagging copy up
    check_verify()
