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

import pytest

from tests.api.support import Mem, mint
from tests.support.api import assert_error

KEY = "Idempotency-Key"


def live_owners(mem: Mem, token: str) -> list[int]:
    grants = mem.ok(mem.api.get("/grants", token))["grants"]
    return [g["id"] for g in grants if g["scope"] == "owner" and g["live"]]


@pytest.mark.parametrize("memory", ["main", "other"])
def test_the_old_token_stays_the_owner_until_the_new_one_is_first_used(mem: Mem, memory: str) -> None:
    """In every memory alike: ``other`` is a memory made before the rotation."""
    old = mem.token
    at = "" if memory == "main" else f"/m/{memory}"
    if memory != "main":
        mem.ok(mem.api.post("/memories", old, json={"name": memory}), 201)
    mem.ok(mem.api.post(at + "/note", old, json={"text": "before the rotation"}))
    rotated = mem.ok(mem.api.post("/rotate", old, json={}))
    new = rotated["token"]
    # The answer was "lost": the old token still does everything an owner does, in this memory too.
    assert len(live_owners(mem, old)) == 2
    mem.ok(mem.api.post(at + "/note", old, json={"text": "written with the old token meanwhile"}))
    assert mem.ok(mem.api.get("/memories", old))["unopened"] == []
    # The new token's first use (any route, even a read, in any memory) retires the old one.
    woke = mem.ok(mem.api.post(at + "/wake", new, json={}))
    assert "written with the old token meanwhile" in "\n".join(woke["lines"])
    for method, path in (("GET", "/grants"), ("POST", at + "/wake"), ("POST", "/wake"), ("POST", "/rotate")):
        assert_error(mem.api.request(method, path, old, json={} if method == "POST" else None), 401, "auth.invalid")
    assert live_owners(mem, new) == [rotated["id"]]
    grants = {g["id"]: g for g in mem.ok(mem.api.get("/grants", new))["grants"]}
    assert grants[rotated["retires"]]["revoked"] is not None
    assert {m["name"] for m in mem.ok(mem.api.get("/memories", new))["memories"]} == {"main", memory}


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


def test_the_retired_token_gets_nothing_from_the_key_ring_after_the_new_one_is_used(mem: Mem, data_dir: Path) -> None:
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


def test_stash_verify_opens_the_store_with_a_successor_not_yet_used(
    mem: Mem, data_dir: Path, capsys, monkeypatch
) -> None:
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


@pytest.mark.parametrize("made", ["fork", "create"])
def test_a_second_rotation_in_the_window_hands_every_memory_to_the_token_used(mem: Mem, made: str) -> None:
    """The owner's rotation is lost and sent again (or the leaked old token
    rotates again): the successor never used is ended, and the token used
    takes every memory, those made before the window and the one the old
    token made in it, with every capability minted in the window ended."""
    old = mem.token
    mem.ok(mem.api.post("/memories", old, json={"name": "kept"}), 201)
    mem.ok(mem.api.post("/m/kept/note", old, json={"text": "kept before"}))
    kept_reader = mem.ok(mem.api.post("/grants", old, json={"scope": "read", "memory": "kept"}), 201)
    lost = mem.ok(mem.api.post("/rotate", old, json={}))["token"]
    if made == "fork":
        mem.ok(mem.api.post("/memories/main/fork", old, json={"name": "shadow"}), 201)
    else:
        mem.ok(mem.api.post("/memories", old, json={"name": "shadow"}), 201)
    tx = mem.ok(mem.api.post("/grants", old, json={"scope": "full", "memory": "shadow"}), 201)
    in_kept = mem.ok(mem.api.post("/grants", old, json={"scope": "append", "memory": "kept"}), 201)
    again = mem.ok(mem.api.post("/rotate", old, json={}))
    new = again["token"]
    listed = mem.ok(mem.api.get("/memories", new))
    assert {m["name"] for m in listed["memories"]} == {"main", "kept", "shadow"} and listed["unopened"] == []
    for token in (old, lost, tx["token"], in_kept["token"]):
        assert_error(mem.api.get("/m/kept/wake", token), 401, "auth.invalid")
    assert_error(mem.api.post("/note", tx["token"], json={"text": "x"}), 401, "auth.invalid")
    assert "kept before" in "\n".join(mem.ok(mem.api.get("/wake", kept_reader["token"]))["lines"])
    for name in ("kept", "shadow"):
        mem.ok(mem.api.post(f"/m/{name}/note", new, json={"text": f"the new owner in {name}"}))
    assert live_owners(mem, new) == [again["id"]]


def _key_ring_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.glob("keyring.db*")}


def _put_back(folder: Path, files: dict[str, bytes]) -> None:
    for p in folder.glob("keyring.db*"):
        p.unlink()
    for name, data in files.items():
        (folder / name).write_bytes(data)


def test_the_listings_name_a_memory_they_cannot_open_and_list_the_rest(mem: Mem, data_dir: Path) -> None:
    """A memory whose key ring was altered, in which the owner is not
    enrolled, whose key ring was put back from before a revocation, or whose
    owner row alone was, is named with its error in every owner listing; the
    others are listed, and the memory itself answers the same refusal."""
    grants = {}
    for name in ("good", "garbled", "unenrolled", "older", "stale"):
        mem.ok(mem.api.post("/memories", mem.token, json={"name": name}), 201)
        grants[name] = mem.ok(
            mem.api.post("/grants", mem.token, json={"scope": "read", "memory": name, "label": f"{name} bot"}), 201
        )
    (folder,) = data_dir.glob("users/*")
    before = {name: _key_ring_files(folder / "m" / name) for name in ("older", "stale")}
    with sqlite3.connect(folder / "m" / "stale" / "keyring.db") as conn:
        owner_row = conn.execute("SELECT id, kdf, wrapped, pub, box FROM grants WHERE scope = 'owner'").fetchone()
    for name in ("older", "stale"):
        mem.ok(mem.api.delete(f"/grants/{grants[name]['id']}", mem.token))  # a new epoch in that memory
    _put_back(folder / "m" / "older", before["older"])
    with sqlite3.connect(folder / "m" / "stale" / "keyring.db") as conn:
        conn.execute(
            "UPDATE grants SET kdf = ?, wrapped = ?, pub = ?, box = ? WHERE id = ?", (*owner_row[1:], owner_row[0])
        )
    ring = folder / "m" / "garbled" / "keyring.db"
    ring.write_bytes(b"\x00" * ring.stat().st_size)
    with sqlite3.connect(folder / "m" / "unenrolled" / "keyring.db") as conn:
        conn.execute("DELETE FROM grants WHERE scope = 'owner'")
    listed = mem.ok(mem.api.get("/memories", mem.token))
    assert {m["name"] for m in listed["memories"]} == {"main", "good"}
    unopened = {u["name"]: u for u in listed["unopened"]}
    assert {n: u["error"] for n, u in unopened.items()} == {
        "garbled": "store.damaged",
        "unenrolled": "store.damaged",
        "older": "store.rolled_back",
        "stale": "store.rolled_back",
    }
    grants = mem.ok(mem.api.get("/grants", mem.token))
    assert "good bot" in [g["label"] for g in grants["grants"]]
    assert {u["name"]: u["error"] for u in grants["unopened"]} == {n: u["error"] for n, u in unopened.items()}
    audit = mem.ok(mem.api.get("/audit", mem.token))
    assert "good" in {e["memory"] for e in audit["events"]}
    assert {u["name"]: u["error"] for u in audit["unopened"]} == {n: u["error"] for n, u in unopened.items()}
    for name in unopened:
        assert_error(mem.api.get(f"/m/{name}/wake", mem.token), 500, unopened[name]["error"])
    # Nor do they stop a rotation: the new token takes over what opens and finds the rest named as before.
    new = mem.ok(mem.api.post("/rotate", mem.token, json={}))["token"]
    again = mem.ok(mem.api.get("/memories", new))
    assert {m["name"] for m in again["memories"]} == {"main", "good"}
    assert {u["name"] for u in again["unopened"]} == set(unopened)
    mem.ok(mem.api.post("/m/good/note", new, json={"text": "after the rotation"}))
    assert_error(mem.api.get("/memories", mem.token), 401, "auth.invalid")
