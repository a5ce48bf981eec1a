"""Owner-only data sealed for the owner only (issue 20 items 3 and 4): labels,
audit events and last-used days open with the owner capability alone. A read
or full capability holding every file — its own epoch keys opened with the
project's own classes — reads none of them, and a disk thief finds none of
them in any byte of the key ring; in main and in a second memory, whose
key ring seals them to its own owner keys. Old key rings
(tests/fixtures/release2) are moved on the owner's first request."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from stash.crypto import aead, epochs
from stash.crypto.owner_seal import OwnerKeys
from stash.storage.keyring import Keyring, label_aad, label_key
from tests.fixtures import make_release2 as fixture
from tests.support.api import CHEAP_KDF_FLAGS, assert_error
from tests.support.files.copies import pages, put_back_page
from tests.support.files.epochs import snapshot
from tests.support.memories import MAIN_MEMORY, Memory
from tests.support.server import Http, Server, start_server

OWNER_BOX = "owner_box"  # the key ring's record of the owner box (keyring_meta)
RELEASE2 = Path(__file__).resolve().parents[1] / "fixtures" / "release2"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    with start_server(tmp_path_factory.mktemp("owner-only"), *CHEAP_KDF_FLAGS) as srv:
        yield srv


def opened(user_copy: Path, token: str, memory: Memory = MAIN_MEMORY):
    """(key ring, grant, what the token opens) of ``memory`` from a copy of
    the user's folder, offline."""
    tok = memory.filed(user_copy, token)
    ring = Keyring(memory.folder(user_copy) / "keyring.db", memory.store(tok.user_id))
    grant = ring.find(tok.tag)
    assert grant is not None
    return ring, grant, ring.open_grant(grant, tok.secret)


def what_a_capability_reads(user_copy: Path, token: str, memory: Memory = MAIN_MEMORY) -> list[str]:
    """Every label, audit detail and last-used day that ``token`` opens from
    a copy of ``memory``'s key ring: with its epoch keys (the label key of
    every epoch), and with its own private key tried on the owner box."""
    ring, _, got = opened(user_copy, token, memory)
    found: list[str] = []
    try:
        rows = ring.conn.execute("SELECT grant_id, label, last_used FROM grant_notes").fetchall()
        for grant_id, label, day in rows:
            if day is not None and not day.startswith("sealed:"):
                found.append(day)
            if label is None:
                continue
            for n in range(got.chain.epoch + 1):
                sub = type(got.chain)(got.chain.user_id, got.chain.keys[: n + 1])
                try:
                    found.append(aead.open_sealed(label_key(sub), label, label_aad(ring.user_id, grant_id)).decode())
                except aead.Unsealable:
                    pass
        found += [f"{e} {d}" for e, d in ring.conn.execute("SELECT event, detail FROM audit WHERE event != 'sealed'")]
        box = ring.meta(OWNER_BOX)
        if box is not None:
            gid, _, hexbox = box.partition(":")
            try:
                OwnerKeys.unbox(ring.user_id, int(gid), epochs.capability_private_key(got.kek), bytes.fromhex(hexbox))
                found.append("the owner box")
            except aead.Unsealable:
                pass
    finally:
        ring.close()
    return found


@pytest.mark.slow
def test_labels_audit_and_last_used_open_with_the_owner_only(server: Server, tmp_path: Path, memory: Memory):
    http = Http(server.url)
    owner = http.init()["token"]
    uid = owner[7:23]
    memory.create(http, owner)
    secret_label = f"temp contractor {os.urandom(4).hex()}"
    reader = http.ok(
        "POST", "/grants", owner, json=memory.grant("read", label=secret_label, expires="2099-01-01T00:00:00Z")
    )
    writer = http.ok("POST", "/grants", owner, json=memory.grant("full", label="ci bot"))
    entries = [{"date": "2024-01-02", "text": f"m {i}"} for i in range(6)]
    http.ok("POST", "/import", writer["token"], json={"entries": entries})
    http.ok("POST", "/config", writer["token"], json={"WAKE_LINES": 50})
    assert http.get(memory.at("/export"), owner).status_code == 200
    http.ok("GET", "/wake", reader["token"])
    http.ok("POST", memory.at("/erase"), owner, json={"ids": [1]})
    grants = {g["id"]: g for g in http.ok("GET", "/grants", owner)["grants"]}
    assert grants[reader["id"]]["label"] == secret_label and grants[reader["id"]]["last_used"]
    kinds = [e["event"] for e in http.ok("GET", "/audit", owner)["events"] if e["memory"] == memory.name]
    assert kinds == ["mint", "mint", "import", "config", "export", "erase"]
    copy = snapshot(server, uid, tmp_path / "copy")

    # A read and a full capability with every file read none of it.
    for token in (reader["token"], writer["token"]):
        assert what_a_capability_reads(copy, token, memory) == []
    # The owner's own classes do (the harness can succeed).
    ring, grant, got = opened(copy, owner, memory)
    try:
        own = ring.open_owner_keys(grant, got.kek)
        assert own is not None and ring.label(reader["id"], got.chain, own) == secret_label
        assert ring.last_used(reader["id"], own) == grants[reader["id"]]["last_used"]
        assert [e["event"] for e in ring.events(own)] == kinds
    finally:
        ring.close()
    # A disk thief: no event kind, detail, label or day in any byte of the key ring.
    folder = memory.folder(copy)
    raw = b"".join((folder / name).read_bytes() for name in os.listdir(folder) if name.startswith("keyring"))
    for word in (b'"first"', b'"memories"', b'"names"', b'"receipt"', b'"grant"', secret_label.encode(), b"ci bot"):
        assert word not in raw, word
    if not memory.is_main:
        return  # a rotation with more than one memory: tests/api/test_rotation.py

    # After a rotation the new owner reads the whole history; the old owner
    # token with the new key ring opens no owner key.
    new_owner = http.ok("POST", "/rotate", owner)["token"]
    assert [e["event"] for e in http.ok("GET", "/audit", new_owner)["events"]] == [*kinds, "rotate"]
    assert {g["label"] for g in http.ok("GET", "/grants", new_owner)["grants"]} >= {secret_label, "ci bot"}
    later = snapshot(server, uid, tmp_path / "later")
    # The key ring's pages from before the rotation put back (the old owner
    # row and its box come back): the rotated-away token is refused by every
    # owner route, and the new one is not served an old key ring either.
    server.stop()
    folder = server.data / "users" / uid
    old_pages, new_pages = pages(copy / "keyring.db"), pages(later / "keyring.db")
    for k in range(min(len(old_pages), len(new_pages))):
        if old_pages[k] != new_pages[k]:
            put_back_page(folder / "keyring.db", copy / "keyring.db", k)
    server.start(same_port=True)
    try:
        for route in ("/grants", "/audit", "/erasures"):
            resp = http.get(route, owner)
            assert_error(resp, 500, "store.rolled_back")
            assert secret_label not in resp.text
        assert http.request("POST", "/rotate", owner).status_code == 500
    finally:
        server.stop()
        shutil.rmtree(folder)
        shutil.copytree(later, folder)
        server.start(same_port=True)
    assert http.ok("GET", "/grants", new_owner)
    ring = Keyring(later / "keyring.db", uid)
    try:
        box = ring.meta(OWNER_BOX)
        assert box is not None
        gid, _, hexbox = box.partition(":")
        old_kek = old_owner_kek(copy, owner)
        with pytest.raises(aead.Unsealable):
            OwnerKeys.unbox(uid, int(gid), epochs.capability_private_key(old_kek), bytes.fromhex(hexbox))
    finally:
        ring.close()


def old_owner_kek(user_copy: Path, token: str) -> bytes:
    ring, _, got = opened(user_copy, token)
    ring.close()
    return got.kek


def test_a_release2_key_ring_is_sealed_for_the_owner_on_its_first_request(tmp_path: Path):
    data = tmp_path / "data"
    shutil.copytree(RELEASE2, data)
    folder = data / "users" / fixture.USER_ID
    owner, laptop, phone = (fixture.token_of(x) for x in ("owner", "laptop", "phone"))
    # Before: the read capability reads the labels, the thief the audit.
    assert what_a_capability_reads(folder, phone)
    srv = Server(data=data, log=tmp_path / "server.log").start()
    try:
        http = Http(srv.url)
        http.ok("GET", "/wake", laptop)
        grants = {g["id"]: (g["label"], g["last_used"]) for g in http.ok("GET", "/grants", owner)["grants"]}
        events = http.ok("GET", "/audit", owner)["events"]
    finally:
        srv.stop()
    assert grants[2][0] == "laptop" and grants[3][0] == "phone" and grants[2][1] is not None
    assert [(e["grant"], e["event"]) for e in events][:5] == [
        (1, "mint"),
        (1, "mint"),
        (1, "mint"),
        (1, "revoke"),
        (2, "erase"),
    ]
    for token in (phone, laptop):
        assert what_a_capability_reads(folder, token) == []
    raw = b"".join(p.read_bytes() for p in folder.iterdir() if p.name.startswith("keyring"))
    for word in (b'"scope"', b'"grant"', b'"erased"', b"laptop", b"phone"):
        assert word not in raw, word
    # Served the same after a restart.
    srv.start()
    try:
        again = {g["id"]: (g["label"], g["last_used"]) for g in Http(srv.url).ok("GET", "/grants", owner)["grants"]}
    finally:
        srv.stop()
    assert again == grants
