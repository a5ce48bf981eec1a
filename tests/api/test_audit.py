"""The audit trail (issue 12 item 9): GET /audit lists, oldest first, each
event with its time and the grant that did it — never memory text — and a
destroyed store leaves its receipt in the data folder."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.support.api import Api, assert_error

SECRET_WORDS = "marzipan-zeppelin"


def events(api: Api, owner: str) -> list[dict]:
    resp = api.get("/audit", owner)
    assert resp.status_code == 200, resp.text
    return resp.json()["events"]


def test_every_kind_of_event_is_recorded_with_its_grant_and_no_content(api: Api, owner: str) -> None:
    writer = api.post("/grants", owner, json={"scope": "full", "label": SECRET_WORDS}).json()
    reader = api.post("/grants", owner, json={"scope": "read"}).json()
    entries = [{"date": "2024-01-02", "text": f"{SECRET_WORDS} {i}"} for i in range(6)]
    assert api.post("/import", writer["token"], json={"entries": entries}).status_code == 200
    assert api.post("/note", writer["token"], json={"text": SECRET_WORDS}).status_code == 200
    for block in ("0-1", "2-3"):
        assert api.post("/nap", writer["token"], json={"block": block, "text": SECRET_WORDS}).status_code == 200
    assert api.post("/forget", writer["token"], json={"block": "2-3"}).status_code == 200
    assert api.post("/config", writer["token"], json={"WAKE_LINES": 50}).status_code == 200
    assert api.post("/erase", owner, json={"ids": [1]}).status_code == 200
    assert api.get("/export", owner).status_code == 200
    assert api.delete(f"/grants/{reader['id']}", owner).status_code == 200
    assert api.delete(f"/grants/{reader['id']}", owner).status_code == 200  # already revoked: no second event
    # Refused requests record nothing.
    assert api.post("/forget", writer["token"], json={"block": "4-5"}).status_code == 404
    assert api.post("/config", writer["token"], json={"WAKE_LINES": 0}).status_code == 422

    got = events(api, owner)
    assert [(e["event"], e["grant"]) for e in got] == [
        ("mint", 1),
        ("mint", 1),
        ("import", writer["id"]),
        ("forget", writer["id"]),
        ("config", writer["id"]),
        ("erase", 1),
        ("export", 1),
        ("revoke", 1),
    ]
    assert got[0]["detail"] == {"grant": writer["id"], "scope": "full", "memory": "main"}
    assert got[2]["detail"] == {"first": 0, "last": 5}
    assert got[3]["detail"] == {"block": "2-3", "dropped": 1}
    assert got[4]["detail"] == {"names": ["WAKE_LINES"]}
    assert got[5]["detail"]["erased"] == 1
    assert got[7]["detail"] == {"grant": reader["id"], "memory": "main"}
    assert [e["id"] for e in got] == sorted(e["id"] for e in got)
    assert all(e["at"].endswith("Z") for e in got)
    assert SECRET_WORDS not in api.get("/audit", owner).text


def test_only_the_owner_reads_the_trail(api: Api, owner: str) -> None:
    full = api.post("/grants", owner, json={"scope": "full"}).json()["token"]
    assert_error(api.get("/audit", full), 403, "auth.scope")
    assert_error(api.get("/audit"), 401, "auth.invalid")


def test_an_idempotent_replay_records_nothing_again(api: Api, owner: str) -> None:
    body = {"entries": [{"date": "2024-01-02", "text": "once"}]}
    headers = {"Idempotency-Key": "audit-replay-1"}
    assert api.post("/import", owner, json=body, headers=headers).status_code == 200
    again = api.post("/import", owner, json=body, headers=headers)
    assert again.status_code == 200 and again.headers.get("Idempotent-Replayed") == "true"
    assert [e["event"] for e in events(api, owner)] == ["import"]


def test_a_destroyed_store_leaves_its_receipt_for_the_operator(api: Api, owner: str, data_dir: Path) -> None:
    helper = api.post("/grants", owner, json={"scope": "read"}).json()
    assert api.post("/note", owner, json={"text": SECRET_WORDS}).status_code == 200
    resp = api.delete("/store", owner)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["receipt"] == "receipts/deletions.jsonl"
    lines = (data_dir / answer["receipt"]).read_text(encoding="utf-8").splitlines()
    receipt = json.loads(lines[-1])
    # Named by a digest an operator recomputes from the user id; the id itself is left nowhere on disk.
    digest = hashlib.sha256(f"stash/v1|deleted-user|{owner[7:23]}".encode()).hexdigest()
    assert receipt == {"user_sha256": digest, "at": answer["at"], "grant": 1, "memories": 1}
    assert SECRET_WORDS not in lines[-1] and owner[7:23] not in lines[-1]
    assert_error(api.get("/audit", helper["token"]), 401, "auth.invalid")


def test_every_event_names_a_capability_get_grants_lists(api: Api, owner: str, data_dir: Path) -> None:
    """The owner acts in main and in two other memories, rotates and acts
    again with the new token: every event's grant is one GET /grants lists
    (the owner's enrolment in another memory is its owner capability there),
    also for a memory made before the record that says so (by order)."""
    import sqlite3

    for name in ("alpha", "bravo"):
        assert api.post("/memories", owner, json={"name": name}).status_code == 201
        assert api.post("/grants", owner, json={"scope": "read", "memory": name}).status_code == 201
        assert api.post(f"/m/{name}/config", owner, json={"WAKE_LINES": 10}).status_code == 200
    new = api.post("/rotate", owner).json()["token"]
    for name in ("main", "alpha", "bravo"):
        assert api.post("/grants", new, json={"scope": "full", "memory": name}).status_code == 201
        path = "/config" if name == "main" else f"/m/{name}/config"
        assert api.post(path, new, json={"WAKE_LINES": 12}).status_code == 200
    listed = {g["id"] for g in api.get("/grants", new).json()["grants"]}
    events = api.get("/audit", new).json()["events"]
    assert {e["memory"] for e in events} == {"main", "alpha", "bravo"}
    assert {e["grant"] for e in events} <= listed, events
    owners = [g["id"] for g in api.get("/grants", new).json()["grants"] if g["scope"] == "owner"]
    old_id, new_id = sorted(owners)
    configs = [(e["memory"], e["grant"]) for e in events if e["event"] == "config"]
    assert sorted(configs) == sorted(
        [("alpha", old_id), ("bravo", old_id), ("main", new_id), ("alpha", new_id), ("bravo", new_id)]
    )
    # A memory made before its key ring recorded whose enrolment is whose: the same answer, by order.
    ring = next((data_dir / "users").iterdir()) / "m" / "alpha" / "keyring.db"
    conn = sqlite3.connect(ring)
    with conn:
        conn.execute("DELETE FROM keyring_meta WHERE name = 'owner_grants'")
    conn.close()
    assert api.get("/audit", new).json()["events"] == events
