"""Revocation and owner rotation with forward secrecy (docs/DESIGN.md, "Key epochs"; issue 10 item
1 and 2), attacked as someone with ordinary file access would: a revoked
token plus every copy of the user's files made before and after, opened
offline with every key that token reaches, alone and together; and the old
key ring, or the revoked grant's old row, put back under a live server. The
revocation's guarantees are run in main and in a second memory (whose rows
are bound to its own store id and keys), the offline attack on SQLCipher and
plain files."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from stash.crypto import tokens
from tests.support.api import CHEAP_KDF_FLAGS, assert_error, token_parts
from tests.support.files.epochs import epoch_keys_of, everything_readable, settle, snapshot, text_in
from tests.support.memories import Memory
from tests.support.server import Http, Server, start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """One server for the module, each test its own identity (a test may stop it to copy files, then start it)."""
    with start_server(tmp_path_factory.mktemp("srv"), *CHEAP_KDF_FLAGS) as srv:
        yield srv


@pytest.fixture(scope="module", params=["sqlcipher", "none"])
def cipher_server(request, tmp_path_factory: pytest.TempPathFactory):
    """One server per file cipher for the module, each test its own identity."""
    with start_server(
        tmp_path_factory.mktemp(f"epochs-{request.param}"), *CHEAP_KDF_FLAGS, "--file-cipher", request.param
    ) as srv:
        yield srv, request.param


def test_nothing_written_after_a_revocation_opens_with_the_revoked_token_and_every_copy(
    cipher_server, memory: Memory, tmp_path: Path
):
    server, cipher = cipher_server
    http = Http(server.url)
    owner = http.init()["token"]
    uid = owner[7:23]
    memory.create(http, owner)
    store = memory.store(uid)
    revoked = http.ok("POST", "/grants", owner, json=memory.grant("full"))
    keeper = http.ok("POST", "/grants", owner, json=memory.grant("read"))["token"]
    before, after = f"before-{os.urandom(6).hex()}", f"after-{os.urandom(6).hex()}"
    for k in range(5):
        http.ok("POST", "/note", revoked["token"], json={"text": f"{before} note {k}"})
    settle(http, owner, f"{before} summary", memory)
    old = memory.folder(snapshot(server, uid, tmp_path / "backup-before"))

    answer = http.ok("DELETE", f"/grants/{revoked['id']}", owner)
    assert answer["epoch"] == 1 and answer["also_revoked"] == []
    # Written after: memories in the same key chunk as the ones before (whose
    # unused key slots the old copy holds), summaries, a config value, an erasure.
    for k in range(6):
        http.ok("POST", memory.at("/note"), owner, json={"text": f"{after} note {k}"})
    settle(http, owner, f"{after} summary", memory)
    http.ok("POST", memory.at("/config"), owner, json={"WAKE_LINES": 77})
    http.ok("POST", memory.at("/erase"), owner, json={"ids": [0]})
    new = memory.folder(snapshot(server, uid, tmp_path / "backup-after"))

    # The live capabilities read everything, before and after.
    recall = http.ok("POST", "/recall", keeper, json={"q": "note"})
    assert recall["total"] == 10 and any(after in m for m in recall["matches"])
    assert any(before in m for m in recall["matches"])
    assert_error(http.get("/wake", revoked["token"]), 401, "auth.invalid")

    # Offline: the revoked token with the old key ring opens epoch 0 only.
    reached = epoch_keys_of(old / "keyring.db", revoked["token"], store)
    assert len(reached) == 1
    assert epoch_keys_of(new / "keyring.db", revoked["token"], store) == []
    # Control: with what it reaches, the old copy reads what was written before.
    assert text_in(before, everything_readable(store, [old], reached, cipher))
    # Neither the new copy alone nor both copies together give anything written after.
    for copies in ([new], [old, new]):
        plain = everything_readable(store, copies, reached, cipher)
        assert not text_in(after, plain), copies
        assert "77" not in plain
    # The live key ring's epoch keys do read it (the harness can succeed).
    assert text_in(after, everything_readable(store, [new], epoch_keys_of(new / "keyring.db", keeper, store), cipher))


# The key ring is plain SQLite under either cipher: one cipher's server suffices.
@pytest.mark.parametrize("cipher_server", ["sqlcipher"], indirect=True)
def test_an_old_key_ring_or_grant_row_put_back_serves_the_revoked_token_nothing(
    cipher_server, memory: Memory, tmp_path: Path
):
    server, _ = cipher_server
    http = Http(server.url)
    owner = http.init()["token"]
    uid = owner[7:23]
    memory.create(http, owner)
    revoked = http.ok("POST", "/grants", owner, json=memory.grant("read"))
    http.ok("POST", memory.at("/note"), owner, json={"text": "written before the revocation"})
    old_user = snapshot(server, uid, tmp_path / "old")
    old = memory.folder(old_user)
    http.ok("DELETE", f"/grants/{revoked['id']}", owner)
    secret_after = f"after-{os.urandom(6).hex()}"
    http.ok("POST", memory.at("/note"), owner, json={"text": secret_after})
    live_user = server.data / "users" / uid
    live = memory.folder(live_user)

    # 1. The revoked grant's old row (tag, certificate, box) written back; in
    # a memory but main, with its tag's home in main's key ring too.
    server.stop()
    src = sqlite3.connect(old / "keyring.db")
    row = src.execute("SELECT tag, kdf, wrapped, pub, box FROM grants WHERE id = ?", (revoked["id"],)).fetchone()
    src.close()
    dst = sqlite3.connect(live / "keyring.db")
    with dst:
        dst.execute(
            "UPDATE grants SET tag = ?, kdf = ?, wrapped = ?, pub = ?, box = ?, revoked = NULL WHERE id = ?",
            (*row, revoked["id"]),
        )
    dst.close()
    if not memory.is_main:
        main = sqlite3.connect(live_user / "keyring.db")
        with main:
            main.execute("INSERT OR REPLACE INTO memory_tags(tag, memory) VALUES (?, ?)", (row[0], memory.name))
        main.close()
    server.start(same_port=True)
    for method, url in (("GET", "/wake"), ("POST", "/recall")):
        resp = http.request(method, url, revoked["token"], json={"q": "after"} if method == "POST" else None)
        assert_error(resp, 401, "auth.invalid")
    assert secret_after in http.ok("POST", memory.at("/recall"), owner, json={"q": "after"})["matches"][0]

    # 2. The whole old key ring copied over the live one (in a memory but
    # main, main's too, which names the revoked token's memory): refused,
    # never served.
    server.stop()
    for folder in {live, live_user}:
        for name in ("keyring.db", "keyring.db-wal", "keyring.db-shm"):
            (folder / name).unlink(missing_ok=True)
        shutil.copy2((old_user if folder == live_user else old) / "keyring.db", folder / "keyring.db")
    server.start(same_port=True)
    for token, url in ((revoked["token"], "/wake"), (owner, memory.at("/wake"))):
        resp = http.get(url, token)
        body = assert_error(resp, 500, "store.rolled_back")
        assert secret_after not in resp.text and "key ring" in body["message"]


def test_rotate_gives_a_new_owner_token_whose_first_use_ends_the_old_as_a_revocation_does(
    server: Server, tmp_path: Path
):
    http = Http(server.url)
    first = http.init()["token"]
    uid = first[7:23]
    reader = http.ok("POST", "/grants", first, json={"scope": "read"})["token"]
    http.ok("POST", "/note", first, json={"text": "before the rotation"})
    old = snapshot(server, uid, tmp_path / "old")

    rotated = http.ok("POST", "/rotate", first)
    second = rotated["token"]
    assert rotated["scope"] == "owner" and rotated["epoch"] == 0 and second != first
    assert token_parts(second).user_id == uid
    http.ok("GET", "/wake", first)  # the owner still, until the new token is first used
    after = f"after-{os.urandom(6).hex()}"
    http.ok("POST", "/note", second, json={"text": after})  # that first use starts epoch 1
    assert_error(http.get("/wake", first), 401, "auth.invalid")
    assert_error(http.post("/rotate", first), 401, "auth.invalid")
    assert http.ok("POST", "/recall", reader, json={"q": "after|before"})["total"] == 2
    grants = {g["id"]: g for g in http.ok("GET", "/grants", second)["grants"]}
    assert grants[rotated["retires"]]["revoked"] and grants[rotated["id"]]["live"]
    # Rotation is owner-only; a read or full capability is rotated by mint + revoke.
    assert_error(http.post("/rotate", reader), 403, "auth.scope")
    assert_error(http.post("/rotate", second, json={"x": 1}), 400)
    new = snapshot(server, uid, tmp_path / "new")
    reached = epoch_keys_of(old / "keyring.db", first)
    assert len(reached) == 1 and text_in("before the rotation", everything_readable(uid, [old], reached))
    assert not text_in(after, everything_readable(uid, [old, new], reached))


def test_stash_rotate_prints_the_new_export_line_and_the_old_token_dies(server: Server):
    import subprocess
    import sys

    from tests.support.server import CLI_TIMEOUT, REPO

    http = Http(server.url)
    first = http.init()["token"]
    http.ok("POST", "/note", first, json={"text": "kept across the rotation"})
    out = subprocess.run(
        [sys.executable, "-m", "stash", "rotate"],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        cwd=REPO,
        env={**os.environ, "STASH_URL": server.url, "STASH_TOKEN": first},
    )
    assert out.returncode == 0, out.stderr
    exports = [line for line in out.stdout.splitlines() if line.startswith("export STASH_TOKEN=")]
    assert len(exports) == 1
    second = exports[0].split("=", 1)[1]
    assert tokens.parse(second) is not None and second != first
    assert_error(http.get("/wake", first), 401, "auth.invalid")
    assert http.ok("GET", "/wake", second)["lines"][0].endswith("kept across the rotation")
