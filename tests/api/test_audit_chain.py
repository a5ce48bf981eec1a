"""The audit trail is MAC-chained and padded (issue 26, findings 6 and 7;
storage/keyring/audit_chain.py): anyone who can write the key ring can seal an
event to the cleartext owner public key, or delete one, but ``GET /audit``
then answers ``trail.intact: false``; every label and every event seals to
one size. Edits made with the sqlite3 module on the real key ring, in main
and in a second memory (whose events live in its own key ring)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from stash.crypto import owner_seal
from stash.service.grant_label_expiry import LABEL_MAX_BYTES
from stash.service.ops.verify import verify_user
from stash.storage.keyring import LABEL_PAD
from tests.support.api import Api, token_parts
from tests.support.memories import Memory


@contextlib.contextmanager
def ring(data_dir: Path, token: str, memory: Memory) -> Iterator[sqlite3.Connection]:
    uid = token_parts(token).user_id
    conn = sqlite3.connect(memory.folder(data_dir / "users" / uid) / "keyring.db", isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


def trail(api: Api, owner: str) -> dict:
    resp = api.get("/audit", owner)
    assert resp.status_code == 200, resp.text
    return resp.json()


def some_events(api: Api, owner: str, memory: Memory) -> dict:
    memory.create(api, owner)
    full = api.post("/grants", owner, json=memory.grant("full")).json()
    doomed = api.post("/grants", owner, json=memory.grant("read")).json()
    assert api.post("/note", full["token"], json={"text": "one"}).status_code == 200
    assert api.get(memory.at("/export"), owner).status_code == 200
    assert api.delete(f"/grants/{doomed['id']}", owner).status_code == 200
    return full


def test_an_untouched_trail_is_intact_from_its_first_event(api: Api, owner: str, memory: Memory) -> None:
    some_events(api, owner, memory)
    got = trail(api, owner)
    assert [e["event"] for e in got["events"] if e["memory"] == memory.name] == ["mint", "mint", "export", "revoke"]
    first = next(e["id"] for e in got["events"] if e["memory"] == "main")
    assert got["trail"] == {"intact": True, "chained_from": first, "problem": None}


def test_a_forged_revoke_sealed_to_the_owner_public_key_is_detected(
    api: Api, owner: str, data_dir: Path, memory: Memory
) -> None:
    """Finding 7 as reported: a revoke of a grant that is still live, sealed
    to the cleartext owner_pub (no key needed), inserted into the trail;
    ``stash verify`` with the owner token fails it too, in any memory."""
    full = some_events(api, owner, memory)
    uid = token_parts(owner).user_id
    with ring(data_dir, owner, memory) as conn:
        public = bytes.fromhex(conn.execute("SELECT value FROM keyring_meta WHERE name = 'owner_pub'").fetchone()[0])
        forged = json.dumps(
            {"at": "2026-12-01T00:00:00Z", "grant": 1, "event": "revoke", "detail": {"grant": full["id"]}},
            sort_keys=True,
        ).encode()
        sealed = owner_seal.seal(memory.store(uid), public, "audit", forged, pad=256).hex()
        last_at = conn.execute("SELECT at FROM audit ORDER BY id DESC LIMIT 1").fetchone()[0]
        conn.execute("INSERT INTO audit(at, grant_id, event, detail) VALUES (?, 0, 'sealed', ?)", (last_at, sealed))
    got = trail(api, owner)
    assert [e["event"] for e in got["events"]][-1] == "revoke"  # shown, and said to be not the trail's
    assert got["trail"]["intact"] is False and got["trail"]["problem"]
    report = verify_user(data_dir / "users" / uid, owner)
    assert not report.ok and any("audit trail" in p for p in report.problems), report


def test_a_deleted_event_middle_or_newest_is_detected(api: Api, owner: str, data_dir: Path, memory: Memory) -> None:
    some_events(api, owner, memory)
    with ring(data_dir, owner, memory) as conn:
        rows = conn.execute("SELECT * FROM audit ORDER BY id").fetchall()

    def edit(*sql: str) -> dict:
        with ring(data_dir, owner, memory) as conn:
            conn.execute("DELETE FROM audit")
            conn.executemany(f"INSERT INTO audit VALUES ({', '.join('?' * len(rows[0]))})", rows)
            for statement in sql:
                conn.execute(statement)
        return trail(api, owner)["trail"]

    assert edit()["intact"] is True  # put back as it was: intact
    assert edit(f"DELETE FROM audit WHERE id = {rows[1][0]}")["intact"] is False
    newest = edit(f"DELETE FROM audit WHERE id = {rows[-1][0]}")
    assert newest["intact"] is False and "head" in newest["problem"]
    assert edit("DELETE FROM audit")["intact"] is False  # the whole trail
    swapped = edit(
        f"UPDATE audit SET detail = (SELECT detail FROM audit WHERE id = {rows[0][0]}) WHERE id = {rows[1][0]}"
    )
    assert swapped["intact"] is False


def test_labels_and_audit_events_each_seal_to_one_size(api: Api, owner: str, data_dir: Path, memory: Memory) -> None:
    """Finding 6: a sealed label was 101 bytes plus its length, and audit
    events as long as their detail (mint 193 B, revoke 178 B, ...)."""
    memory.create(api, owner)
    minted = []
    for label in ("x", "a label of sixty-four bytes, the most a label may be: 0123456789"[:64]):
        resp = api.post("/grants", owner, json=memory.grant("read", label=label))
        assert resp.status_code == 201
        minted.append(resp.json()["id"])
    assert api.post(memory.at("/note"), owner, json={"text": "one"}).status_code == 200
    assert api.post(memory.at("/config"), owner, json={"WAKE_LINES": 50}).status_code == 200
    assert api.post(memory.at("/erase"), owner, json={"ids": [0]}).status_code == 200
    assert api.get(memory.at("/export"), owner).status_code == 200
    assert api.delete(f"/grants/{minted[0]}", owner).status_code == 200
    assert LABEL_PAD == 2 + LABEL_MAX_BYTES  # the longest label fills the pad exactly
    with ring(data_dir, owner, memory) as conn:
        labels = {r[0] for r in conn.execute("SELECT length(label) FROM grant_notes WHERE label IS NOT NULL")}
        events = conn.execute("SELECT length(detail) FROM audit").fetchall()
    assert len(labels) == 1
    assert len(events) == 6 and len({n for (n,) in events}) == 1
