"""Grants that say what they are for (issue 12 item 8): a label, an expiry
after which the token is refused exactly like a revoked one, and the day each
was last used — and a key ring edited by hand can neither extend an expiry
nor move a label. In main and in a second memory, whose capabilities'
labels and days are sealed to that memory's own owner keys."""

from __future__ import annotations

import datetime as dt
import sqlite3
import time
from pathlib import Path

import pytest

from tests.support.api import Api, assert_error
from tests.support.memories import Memory


def keyring(data_dir: Path, token: str, memory: Memory) -> sqlite3.Connection:
    return sqlite3.connect(str(memory.folder(data_dir / "users" / token[7:23]) / "keyring.db"), isolation_level=None)


@pytest.fixture
def owner(api: Api, memory: Memory) -> str:
    """The owner of a new identity that holds ``memory``."""
    token = api.init()["token"]
    memory.create(api, token)
    return token


def mint(api: Api, owner: str, memory: Memory, **body) -> dict:
    resp = api.post("/grants", owner, json=memory.grant("read", **body))
    assert resp.status_code == 201, resp.text
    return resp.json()


def listed(api: Api, owner: str) -> dict[int, dict]:
    resp = api.get("/grants", owner)
    assert resp.status_code == 200, resp.text
    return {g["id"]: g for g in resp.json()["grants"]}


def utc(seconds: float = 0) -> str:
    return (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_label_and_expiry_are_listed_and_last_used_is_the_day(api: Api, owner: str, memory: Memory) -> None:
    until = utc(86_400)
    g = mint(api, owner, memory, label="  CI bot ✓ ", expires=until.replace("Z", "+00:00"))
    assert (g["label"], g["expires"]) == ("CI bot ✓", until)
    plain = mint(api, owner, memory)
    rows = listed(api, owner)
    assert rows[g["id"]]["label"] == "CI bot ✓" and rows[g["id"]]["expires"] == until
    assert rows[g["id"]]["last_used"] is None and rows[g["id"]]["live"] and not rows[g["id"]]["expired"]
    assert rows[plain["id"]]["label"] is None and rows[plain["id"]]["expires"] is None
    assert api.get("/wake", g["token"]).status_code == 200
    today = dt.datetime.now(dt.UTC).date().isoformat()
    rows = listed(api, owner)
    assert rows[g["id"]]["last_used"] == today and rows[plain["id"]]["last_used"] is None
    assert rows[1]["last_used"] == today  # the owner's own listing used it


@pytest.mark.parametrize("memory", ["main"], indirect=True)  # every memory: tests/e2e/test_expiry.py
def test_an_expired_capability_is_refused_like_a_revoked_one(api: Api, owner: str, memory: Memory) -> None:
    g = mint(api, owner, memory, expires=utc(2))
    assert api.get("/wake", g["token"]).status_code == 200
    revoked = mint(api, owner, memory)
    assert api.delete(f"/grants/{revoked['id']}", owner).status_code == 200
    time.sleep(max(0.0, dt.datetime.fromisoformat(g["expires"].replace("Z", "+00:00")).timestamp() - time.time()) + 0.2)
    expired = assert_error(api.get("/wake", g["token"]), 401, "auth.invalid")
    assert expired == assert_error(api.get("/wake", revoked["token"]), 401, "auth.invalid")
    row = listed(api, owner)[g["id"]]
    assert row["expired"] and not row["live"] and row["revoked"] is None


@pytest.mark.parametrize(
    "body,code",
    [
        ({"label": ""}, "grants.bad_label"),
        ({"label": "   "}, "grants.bad_label"),
        ({"label": "x" * 65}, "grants.bad_label"),
        ({"label": "é" * 33}, "grants.bad_label"),
        ({"label": "two\nlines"}, "grants.bad_label"),
        ({"label": "tab\there"}, "grants.bad_label"),
        ({"label": 7}, "grants.bad_label"),
        ({"label": "line\u2028sep"}, "grants.bad_label"),
        ({"expires": "2020-01-01T00:00:00Z"}, "grants.bad_expires"),
        ({"expires": "tomorrow"}, "grants.bad_expires"),
        ({"expires": "2099-01-01T00:00:00+02:00"}, "grants.bad_expires"),
        ({"expires": "2099-02-30T00:00:00Z"}, "grants.bad_expires"),
        ({"expires": "2099-01-01"}, "grants.bad_expires"),
        ({"expires": 4102444800}, "grants.bad_expires"),
    ],
)
def test_bad_labels_and_expiries_mint_nothing(api: Api, owner: str, memory: Memory, body: dict, code: str) -> None:
    before = listed(api, owner)
    assert_error(api.post("/grants", owner, json=memory.grant("read", **body)), 422, code)
    assert listed(api, owner) == before


def test_a_64_byte_label_is_taken(api: Api, owner: str, memory: Memory) -> None:
    assert mint(api, owner, memory, label="é" * 32)["label"] == "é" * 32


def test_editing_the_key_ring_cannot_extend_or_drop_an_expiry(
    api: Api, owner: str, data_dir: Path, memory: Memory
) -> None:
    a = mint(api, owner, memory, expires=utc(3600))
    b = mint(api, owner, memory, expires=utc(3600))
    with keyring(data_dir, owner, memory) as conn:
        conn.execute("UPDATE grant_notes SET expires = '2999-01-01T00:00:00Z' WHERE grant_id = ?", (a["id"],))
        conn.execute("DELETE FROM grant_notes WHERE grant_id = ?", (b["id"],))
    for g in (a, b):
        resp = api.get("/wake", g["token"])
        assert resp.status_code == 500 and resp.json()["error"] == "store.damaged", resp.text


def test_labels_are_sealed_and_bound_to_their_grant(api: Api, owner: str, data_dir: Path, memory: Memory) -> None:
    a = mint(api, owner, memory, label="kitchen tablet")
    b = mint(api, owner, memory, label="garden robot")
    raw = b"".join(p.read_bytes() for p in (data_dir / "users" / owner[7:23]).rglob("keyring*"))
    assert b"kitchen" not in raw and b"garden" not in raw
    with keyring(data_dir, owner, memory) as conn:
        la = conn.execute("SELECT label FROM grant_notes WHERE grant_id = ?", (a["id"],)).fetchone()[0]
        lb = conn.execute("SELECT label FROM grant_notes WHERE grant_id = ?", (b["id"],)).fetchone()[0]
        conn.execute("UPDATE grant_notes SET label = ? WHERE grant_id = ?", (lb, a["id"]))
        conn.execute("UPDATE grant_notes SET label = ? WHERE grant_id = ?", (la, b["id"]))
    resp = api.get("/grants", owner)
    if memory.name == "main":  # the owner's own key ring: nothing can be listed
        assert resp.status_code == 500 and resp.json()["error"] == "store.damaged"
    else:  # another memory's: named as damaged, never served, and the rest listed
        assert resp.status_code == 200 and resp.json()["unopened"] == [
            {"name": memory.name, "error": "store.damaged", "message": resp.json()["unopened"][0]["message"]}
        ]
        assert {g["memory"] for g in resp.json()["grants"]} == {"main"}


def test_a_key_ring_from_before_grant_notes_still_serves(api: Api, owner: str, data_dir: Path, memory: Memory) -> None:
    old = mint(api, owner, memory)
    with keyring(data_dir, owner, memory) as conn:
        conn.execute("DROP TABLE IF EXISTS grant_notes")  # a second memory makes it on first use
    assert api.get("/wake", old["token"]).status_code == 200  # its first use adds the table back
    rows = listed(api, owner)
    assert rows[old["id"]]["label"] is None and rows[old["id"]]["last_used"] is not None
    assert mint(api, owner, memory, label="after")["label"] == "after"
