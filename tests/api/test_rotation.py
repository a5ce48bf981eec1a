"""Owner rotation never leaves the owner without an owner token, and its
resend hands out the new token only while the old one is still the owner
(docs/DESIGN.md, "Key epochs": the old owner grant is retired by the new
token's first use).

Each test drives the real app in process (httpx ASGI) over real files; the
"lost answer" is a rotation whose answer the test throws away, as a cut
connection or a crash after the commit would."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

from tests.api.support import Mem, mint
from tests.helpers import assert_error

KEY = "Idempotency-Key"


def live_owners(mem: Mem, token: str) -> list[int]:
    grants = mem.ok(mem.api.get("/grants", token))["grants"]
    return [g["id"] for g in grants if g["scope"] == "owner" and g["live"]]


def test_the_old_token_stays_the_owner_until_the_new_one_is_first_used(mem: Mem) -> None:
    old = mem.token
    mem.note("before the rotation")
    rotated = mem.ok(mem.api.post("/rotate", old, json={}))
    new = rotated["token"]
    # The answer was "lost": the old token still does everything an owner does.
    assert len(live_owners(mem, old)) == 2
    mem.ok(mem.api.post("/note", old, json={"text": "written with the old token meanwhile"}))
    # The new token's first use (any route, even a read) retires the old one.
    woke = mem.ok(mem.api.post("/wake", new, json={}))
    assert "written with the old token meanwhile" in "\n".join(woke["lines"])
    for method, path in (("GET", "/grants"), ("POST", "/wake"), ("POST", "/rotate")):
        assert_error(mem.api.request(method, path, old, json={} if method == "POST" else None), 401,
                     "auth.invalid")
    assert live_owners(mem, new) == [rotated["id"]]
    grants = {g["id"]: g for g in mem.ok(mem.api.get("/grants", new))["grants"]}
    assert grants[rotated["retires"]]["revoked"] is not None


def test_a_rotation_without_a_key_whose_answer_was_lost_is_simply_sent_again(mem: Mem) -> None:
    old = mem.token
    lost = mem.ok(mem.api.post("/rotate", old, json={}))["token"]
    again = mem.ok(mem.api.post("/rotate", old, json={}))
    # The successor that was never delivered is ended by the next rotation ...
    assert_error(mem.api.get("/grants", lost), 401, "auth.invalid")
    assert again["epoch"] == 1 and again["also_revoked"]
    # ... and the one delivered retires the old token at its first use.
    assert live_owners(mem, again["token"]) == [again["id"]]
    assert_error(mem.api.get("/grants", old), 401, "auth.invalid")
    assert_error(mem.api.get("/grants", lost), 401, "auth.invalid")


def test_a_resend_returns_the_new_token_only_while_the_old_one_is_the_owner(mem: Mem) -> None:
    old = mem.token
    key = str(uuid.uuid4())
    first = mem.ok(mem.api.post("/rotate", old, json={}, headers={KEY: key}))
    resent = mem.api.post("/rotate", old, json={}, headers={KEY: key})
    assert resent.status_code == 200 and resent.headers.get("Idempotent-Replayed") == "true"
    assert resent.json()["token"] == first["token"]
    mem.ok(mem.api.get("/grants", first["token"]))  # the new token is in use
    # From now on the old token with the key is refused like any revoked token.
    assert_error(mem.api.post("/rotate", old, json={}, headers={KEY: key}), 401, "auth.invalid")
    assert_error(mem.api.post("/rotate", old, json={}, headers={KEY: str(uuid.uuid4())}), 401, "auth.invalid")


def test_the_retired_token_gets_nothing_from_the_key_ring_after_the_new_one_is_used(mem: Mem,
                                                                                   data_dir: Path) -> None:
    """The record that held the new token is deleted with the old owner
    grant, so even a copy of the key ring taken after that moment holds no
    sealed answer for the old token and its key to open."""
    old = mem.token
    key = str(uuid.uuid4())
    new = mem.ok(mem.api.post("/rotate", old, json={}, headers={KEY: key}))["token"]
    (ring_path,) = data_dir.glob("users/*/keyring.db")
    with sqlite3.connect(ring_path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM idempotency").fetchone()[0] == 1
    mem.ok(mem.api.get("/grants", new))
    with sqlite3.connect(ring_path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM idempotency").fetchone()[0] == 0


def test_the_new_owner_reads_every_label_and_event_and_the_old_one_nothing(mem: Mem) -> None:
    old = mem.token
    mem.ok(mem.api.post("/grants", old, json={"scope": "read", "label": "laptop agent"}), 201)
    new = mem.ok(mem.api.post("/rotate", old, json={}))["token"]
    # Before the new token is used, the old owner still reads its labels.
    assert "laptop agent" in [g["label"] for g in mem.ok(mem.api.get("/grants", old))["grants"]]
    assert "laptop agent" in [g["label"] for g in mem.ok(mem.api.get("/grants", new))["grants"]]
    events = [e["event"] for e in mem.ok(mem.api.get("/audit", new))["events"]]
    assert events[-2:] == ["mint", "rotate"]
    assert_error(mem.api.get("/audit", old), 401, "auth.invalid")


def test_a_reader_keeps_working_across_a_rotation_and_its_retirement(mem: Mem) -> None:
    reader = mint(mem.api, mem.token, "read")
    new = mem.ok(mem.api.post("/rotate", mem.token, json={}))["token"]
    mem.ok(mem.api.post("/wake", reader, json={}))
    mem.ok(mem.api.post("/note", new, json={"text": "after the retirement"}))
    woke = mem.ok(mem.api.post("/wake", reader, json={}))
    assert "after the retirement" in "\n".join(woke["lines"])


def test_stash_verify_opens_the_store_with_a_successor_not_yet_used(mem: Mem, data_dir: Path, capsys,
                                                                      monkeypatch) -> None:
    """Between a rotation and its new token's first use, the new token
    already opens the owner-only data (its copy of the owner seeds was boxed
    to it at the rotation), so `stash verify --token` passes with it."""
    from stash.cli.main import main

    mem.ok(mem.api.post("/grants", mem.token, json={"scope": "read", "label": "ci bot"}), 201)
    new = mem.ok(mem.api.post("/rotate", mem.token, json={}))["token"]
    monkeypatch.setenv("STASH_TOKEN", new)
    code = main(["verify", str(data_dir), "--token"])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
