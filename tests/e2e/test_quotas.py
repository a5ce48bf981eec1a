"""Quotas against a real ``stash serve`` (issue 11, item 3): memories and
bytes per identity and identities per address per day, each a clear 4xx that
writes nothing; and keyed writes that change nothing store nothing."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.support.api import assert_error, wal_folded
from tests.support.server import Http, start_server

OLD = "2021-03-01"


def folder_bytes(data: Path, token: str) -> int:
    """What the user's files hold at rest, once the server folded their WALs."""
    folder = data / "users" / token[7:23]
    assert wal_folded(folder / "keyring.db", folder / "memory.db")
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def test_memories_and_identities_quotas(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--quota-memories", "5", "--init-per-day", "3")
    http = Http(server.url)
    try:
        tokens = [http.init()["token"] for _ in range(3)]
        refused = http.post("/init", json={})
        body = assert_error(refused, 429, "quota.identities")
        assert int(refused.headers["retry-after"]) > 60 and "identities a day" in body["message"]
        owner = tokens[0]
        for k in range(4):
            http.ok("POST", "/note", owner, json={"text": f"memory {k}"})
        two = [{"date": OLD, "text": "a"}, {"date": OLD, "text": "b"}]
        body = assert_error(http.post("/import", owner, json={"entries": two}), 403, "quota.memories")
        assert "1 more fit" in body["message"]
        assert http.ok("GET", "/wake", owner)["T"] == 4  # nothing of the import was written
        http.ok("POST", "/note", owner, json={"text": "the fifth"})
        assert_error(
            http.post("/note", owner, json={"text": "a sixth"}, headers={"Idempotency-Key": "six"}),
            403,
            "quota.memories",
        )
        assert http.ok("GET", "/wake", owner)["T"] == 5
        # Another identity has its own room.
        http.ok("POST", "/note", tokens[1], json={"text": "room of its own"})
    finally:
        http.close()
        server.stop()


def test_bytes_quota_refuses_whole_writes(tmp_path: Path) -> None:
    limit = 400_000
    server = start_server(tmp_path, "--quota-bytes", str(limit))
    http = Http(server.url)
    try:
        owner = http.init()["token"]
        batch = 0
        while True:
            entries = [{"date": OLD, "text": f"batch {batch} memory {k} " + "x" * 200} for k in range(200)]
            resp = http.post("/import", owner, json={"entries": entries})
            if resp.status_code != 200:
                break
            batch += 1
            assert batch < 50, "the byte quota never bit"
        assert_error(resp, 403, "quota.bytes")
        # Every accepted batch whole, the refused one not at all.
        assert http.ok("POST", "/recall", owner, json={"q": "^#\\d+ \\S+ batch"})["total"] == 200 * batch
        assert_error(http.post("/note", owner, json={"text": "one more"}), 403, "quota.bytes")
        assert folder_bytes(server.data, owner) < limit + 16 * 1024 * 1024  # over by at most one write
    finally:
        http.close()
        server.stop()


@pytest.mark.slow
def test_keyed_no_op_naps_store_nothing(http: Http, server) -> None:
    """The issue's measurement: 300 status-only naps, each with a fresh
    Idempotency-Key, grew the memory file by about 19 KiB each."""
    owner = http.init()["token"]
    for k in range(7):
        http.ok("POST", "/note", owner, json={"text": f"memory {k}"})
    http.ok("POST", "/nap", owner, json={})
    before = folder_bytes(server.data, owner)
    for _ in range(300):
        http.ok("POST", "/nap", owner, json={}, headers={"Idempotency-Key": str(uuid.uuid4())})
    grown = folder_bytes(server.data, owner) - before
    assert grown < 64 * 1024, f"300 keyed no-op naps grew the files by {grown} bytes"
    assert http.ok("GET", "/wake", owner)["T"] == 7


def test_a_keyed_note_record_is_small(http: Http, server) -> None:
    owner = http.init()["token"]
    for k in range(3):
        http.ok("POST", "/note", owner, json={"text": f"warm {k} " + "y" * 250})
    before = folder_bytes(server.data, owner)
    n = 100
    for k in range(n):
        http.ok(
            "POST",
            "/note",
            owner,
            json={"text": f"keyed {k} " + "z" * 250},
            headers={"Idempotency-Key": str(uuid.uuid4())},
        )
    per_note = (folder_bytes(server.data, owner) - before) / n
    # A sealed, padded memory row plus a record of 1 to 3 KiB; at 4 KiB padding a record alone was ~19 KiB.
    assert per_note < 8 * 1024, per_note
