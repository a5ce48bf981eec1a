"""Erase and revoke flush the write-ahead log so destroyed keys leave no copy,
and answer success once in force whatever else holds the file: the flush
blocks writers for its moment instead of waiting for an idle one, and when a
reader on an old snapshot keeps it from completing the answer says so
(``flushed: false``); a resend with the same Idempotency-Key flushes."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from stash.storage import userlock
from stash.storage.sqlite import transactions
from stash.web.app import create_app
from tests.support.api import Api, make_settings


@pytest.fixture
def api(data_dir, monkeypatch):
    monkeypatch.setattr(transactions, "FLUSH_WAIT_MS", 300)  # a held snapshot is waited for this long, not 5 s
    client = Api(create_app(make_settings(data_dir, file_cipher="none")))
    yield client
    client.close()


def reader_holding_a_snapshot(path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    return conn


def wal_is_empty(path) -> bool:
    # Truncated by the checkpoint, or removed when the last connection closed.
    return not path.exists() or path.stat().st_size == 0


def test_a_held_snapshot_leaves_the_flush_pending_and_the_resend_flushes(api: Api, data_dir) -> None:
    ident = api.init()
    owner, user = ident["token"], ident["user_id"]
    assert api.post("/note", owner, json={"text": "a secret noted by mistake"}).status_code == 200
    grant = api.post("/grants", owner, json={"scope": "read"}).json()
    folder = data_dir / "users" / user

    reader = reader_holding_a_snapshot(folder / "memory.db")
    first = api.post("/erase", owner, json={"ids": [0]}, headers={"Idempotency-Key": "erase-0"})
    assert first.status_code == 200, first.text
    assert first.json()["erased"] == [0] and first.json()["flushed"] is False
    assert api.get("/wake", owner).json()["lines"][0].endswith("[erased]")  # in force
    reader.close()
    again = api.post("/erase", owner, json={"ids": [0]}, headers={"Idempotency-Key": "erase-0"})
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == {**first.json(), "flushed": True}  # the same receipt, nothing erased twice
    assert wal_is_empty(folder / "memory.db-wal")

    reader = reader_holding_a_snapshot(folder / "keyring.db")
    revoked = api.delete(f"/grants/{grant['id']}", owner, headers={"Idempotency-Key": "revoke-1"})
    assert revoked.status_code == 200 and revoked.json()["flushed"] is False
    assert api.get("/wake", grant["token"]).status_code == 401  # in force all the same
    reader.close()
    again = api.delete(f"/grants/{grant['id']}", owner, headers={"Idempotency-Key": "revoke-1"})
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == {**revoked.json(), "flushed": True}
    assert wal_is_empty(folder / "keyring.db-wal")


def test_a_steady_writer_does_not_keep_the_erasure_from_flushing(api: Api, data_dir) -> None:
    ident = api.init()
    owner, user = ident["token"], ident["user_id"]
    assert api.post("/note", owner, json={"text": "to be erased"}).status_code == 200
    path = data_dir / "users" / user / "memory.db"
    stop = threading.Event()
    writes = []

    def writer() -> None:
        # Another process's steady commits, as agents noting make them: the WAL is never empty for long.
        conn = sqlite3.connect(path, isolation_level=None, timeout=30)
        # (Into a table of the file's own schema: one Stash does not make is refused on open.)
        while not stop.is_set():
            with userlock.shared(path.parent):  # as every request of the server holds it
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT OR REPLACE INTO meta(name, value) VALUES ('chatter', '1')")
                conn.execute("COMMIT")
            writes.append(1)
            stop.wait(0.001)
        conn.close()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while len(writes) < 20:
            stop.wait(0.01)
        for k in range(2):
            answer = api.post("/erase", owner, json={"ids": [0]})
            assert answer.status_code == 200, answer.text
            assert answer.json()["flushed"] is True, k
    finally:
        stop.set()
        thread.join()
