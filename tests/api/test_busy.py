"""Erase and revoke flush the write-ahead log so destroyed keys leave no copy.
A reader holding an old snapshot keeps that from completing: the request must
say so promptly (409, retry) instead of hanging, and the retry must flush."""

from __future__ import annotations

import sqlite3

from stash.web.app import create_app
from tests.helpers import Api, assert_error, make_settings


def reader_holding_a_snapshot(path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    return conn


def wal_is_empty(path) -> bool:
    # Truncated by the checkpoint, or removed when the last connection closed.
    return not path.exists() or path.stat().st_size == 0


def test_erase_and_revoke_answer_busy_then_flush_on_retry(data_dir) -> None:
    api = Api(create_app(make_settings(data_dir, file_cipher="none")))
    try:
        ident = api.init()
        owner, user = ident["token"], ident["user_id"]
        assert api.post("/note", owner, json={"text": "a secret noted by mistake"}).status_code == 200
        grant = api.post("/grants", owner, json={"scope": "read"}).json()
        folder = data_dir / "users" / user

        reader = reader_holding_a_snapshot(folder / "memory.db")
        assert_error(api.post("/erase", owner, json={"ids": [0]}), 409, "erase.busy")
        reader.close()
        retry = api.post("/erase", owner, json={"ids": [0]})
        assert retry.status_code == 200, retry.text
        assert retry.json()["erased"] == []  # the first call had erased it
        assert api.get("/wake", owner).json()["lines"][0].endswith("[erased]")
        assert wal_is_empty(folder / "memory.db-wal")

        reader = reader_holding_a_snapshot(folder / "keyring.db")
        assert_error(api.delete(f"/grants/{grant['id']}", owner), 409, "grants.busy")
        assert_error(api.get("/wake", grant["token"]), 401)  # revoked all the same
        reader.close()
        again = api.delete(f"/grants/{grant['id']}", owner)
        assert again.status_code == 200 and again.json()["already"] is True
        assert wal_is_empty(folder / "keyring.db-wal")
    finally:
        api.close()
