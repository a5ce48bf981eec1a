"""The running digest of the log: cutting the log short, or putting back an
older copy of one file, is refused; a client's pin catches a rollback of both.

Every store is real (both file ciphers), every attack is done on the files by
hand the way someone holding them would, and every check goes through the
live routes in process."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from stash.crypto import chain, keys
from stash.crypto.epochs import KeyChain
from stash.service.access import Vault
from stash.storage.formats import LEGACY_PAGE_BYTES, MEMORY_FILE, current_mark
from stash.storage.keyring import state_copies
from stash.storage.sqlite.schema import sections
from stash.storage.sqlite.transactions import write_transaction
from stash.web.app import create_app
from tests.support.api import CHEAP_KDF, Api, assert_error, make_settings
from tests.support.files.raw import raw_memory_file


@pytest.fixture
def http(data_dir: Path, file_cipher: str):
    client = Api(create_app(make_settings(data_dir, file_cipher=file_cipher)))
    yield client
    client.close()


class User:
    def __init__(self, http: Api, data_dir: Path, file_cipher: str) -> None:
        self.http = http
        ident = http.init()
        self.token, self.user_id = ident["token"], ident["user_id"]
        self.folder = data_dir / "users" / self.user_id
        self.cipher = file_cipher
        with Vault(data_dir, file_cipher=file_cipher).session(self.token, "read") as s:
            self.master = bytes(s.master)

    def note(self, text: str, **kw) -> dict:
        resp = self.http.post("/note", self.token, json={"text": text}, **kw)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def wake(self, **kw):
        return self.http.get("/wake", self.token, **kw)

    def raw(self):
        """The memory file as someone holding it and its key would open it,
        with the log's guards dropped."""
        return raw_memory_file(self.folder, self.master, self.cipher)

    def ring(self) -> sqlite3.Connection:
        return sqlite3.connect(str(self.folder / "keyring.db"), isolation_level=None)

    def save(self, where: Path, *names: str) -> None:
        where.mkdir(parents=True, exist_ok=True)
        for name in names:
            for suffix in ("", "-wal"):
                src = self.folder / (name + suffix)
                if src.exists():
                    shutil.copy2(src, where / (name + suffix))

    def put_back(self, where: Path, *names: str) -> None:
        for name in names:
            for suffix in ("-wal", "-shm"):
                (self.folder / (name + suffix)).unlink(missing_ok=True)
            for suffix in ("", "-wal"):
                if (where / (name + suffix)).exists():
                    shutil.copy2(where / (name + suffix), self.folder / (name + suffix))


@pytest.fixture
def user(http: Api, data_dir: Path, file_cipher: str) -> User:
    return User(http, data_dir, file_cipher)


def texts(n: int, start: int = 0) -> list[str]:
    return [f"kestrel memory {i}" for i in range(start, start + n)]


def oracle_head(user: User, sealed_rows: list[bytes]) -> dict:
    """The head computed from the definition in stash/crypto/chain.py, over
    the rows as stored, with the key derived from the master key."""
    key = keys.subkey(user.master, b"chain")
    digest = chain.genesis(key, user.user_id)
    for i, sealed in enumerate(sealed_rows):
        digest = chain.step(key, digest, i, sealed)
    return {"count": len(sealed_rows), "digest": digest.hex(), "pin": f"{len(sealed_rows)}:{digest.hex()}"}


def without_state(head: dict) -> dict:
    """A head as the log alone defines it: the state version (checked to grow
    with every write) taken off its fields and its pin."""
    assert isinstance(head["state"], int) and head["pin"] == f"{head['count']}:{head['digest']}:{head['state']}"
    return {"count": head["count"], "digest": head["digest"], "pin": f"{head['count']}:{head['digest']}"}


def stored_rows(user: User) -> list[bytes]:
    with user.raw() as conn:
        return [r[0] for r in conn.execute("SELECT sealed FROM log ORDER BY id")]


# ----------------------------------------------------------------- the head answered


def test_every_note_and_wake_answers_the_head_of_the_log_as_stored(user: User):
    heads = [user.note(t)["head"] for t in texts(5)]
    rows = stored_rows(user)
    assert [without_state(h) for h in heads] == [oracle_head(user, rows[: i + 1]) for i in range(5)]
    states = [h["state"] for h in heads]
    assert states == sorted(set(states)), states  # every write moves the state forward
    assert user.wake().json()["head"] == heads[-1]
    assert user.wake(params={"T": 2}).json()["head"] == heads[-1]  # the head now, whatever the snapshot


def test_an_empty_memory_has_a_head_too(user: User):
    assert without_state(user.wake().json()["head"]) == oracle_head(user, [])


# ----------------------------------------------------------------- cut short


@pytest.mark.parametrize("cut", [1, 3])
def test_a_log_cut_short_is_refused_not_served(user: User, cut: int):
    for t in texts(6):
        user.note(t)
    with user.raw() as conn:
        conn.execute("DELETE FROM log WHERE id >= ?", (6 - cut,))
    for resp in (
        user.wake(),
        user.http.post("/recall", user.token, json={"q": "kestrel"}),
        user.http.post("/note", user.token, json={"text": "written over a cut log"}),
    ):
        body = assert_error(resp, 500, "store.rolled_back")
        assert "stash verify" in body["message"] and "backup" in body["message"]
        assert "kestrel" not in resp.text
    with user.raw() as conn:
        assert conn.execute("SELECT COUNT(*) FROM log").fetchone()[0] == 6 - cut  # the note wrote nothing


def test_a_last_row_replaced_is_damage(user: User):
    for t in texts(4):
        user.note(t)
    with user.raw() as conn:
        conn.execute("DELETE FROM log WHERE id = 3")
        conn.execute("INSERT INTO log(id, sealed) VALUES (3, ?)", (stored_rows(user)[0],))
    assert_error(user.wake(), 500, "store.damaged")


def test_rows_added_past_the_head_are_damage(user: User):
    for t in texts(4):
        user.note(t)
    rows = stored_rows(user)
    with user.raw() as conn:
        conn.execute("INSERT INTO log(id, sealed) VALUES (4, ?)", (rows[3],))
    assert_error(user.wake(), 500, "store.damaged")


def test_a_recorded_head_edited_to_match_a_cut_log_is_caught_by_the_key_rings_copy(user: User):
    for t in texts(6):
        user.note(t)
    with user.raw() as conn:
        (recorded,) = conn.execute("SELECT value FROM meta WHERE name = 'log_head'").fetchone()
    for t in texts(2, 6):
        user.note(t)
    # Someone cuts the log back to 6 and puts back the head the file had then.
    with user.raw() as conn:
        conn.execute("DELETE FROM log WHERE id >= 6")
        conn.execute("UPDATE meta SET value = ? WHERE name = 'log_head'", (recorded,))
    # The state head, which covers the recorded log head, no longer matches:
    # refused as damage before the key ring's copy is even consulted.
    assert_error(user.wake(), 500, "store.damaged")


# ----------------------------------------------------------------- an older copy put back


def test_an_older_memory_file_put_back_is_refused(user: User, tmp_path: Path):
    for t in texts(4):
        user.note(t)
    user.save(tmp_path / "old", "memory.db")
    for t in texts(4, 4):
        user.note(t)
    user.put_back(tmp_path / "old", "memory.db")
    assert_error(user.wake(), 500, "store.rolled_back")
    assert_error(user.http.post("/note", user.token, json={"text": "after the rollback"}), 500, "store.rolled_back")


def test_an_older_key_ring_put_back_is_caught_up_not_refused(user: User, tmp_path: Path):
    """The key ring's copy may lag the file (a crash between the two commits):
    a log that extends the copy is served, and the copy is brought forward."""
    for t in texts(3):
        user.note(t)
    user.save(tmp_path / "old", "keyring.db")
    heads = [user.note(t)["head"] for t in texts(3, 3)]
    user.put_back(tmp_path / "old", "keyring.db")
    ring = user.ring()
    try:
        assert ring.execute("SELECT value FROM keyring_meta WHERE name = 'log_head'").fetchone()[0].startswith("3:")
        resp = user.wake()
        assert resp.status_code == 200, resp.text
        assert resp.json()["head"] == heads[-1]
        # the copy is of the log's head; the state version has its own copy
        log_pin = f"{heads[-1]['count']}:{heads[-1]['digest']}"
        assert ring.execute("SELECT value FROM keyring_meta WHERE name = 'log_head'").fetchone()[0] == log_pin
    finally:
        ring.close()


def test_a_key_ring_copy_from_another_history_is_refused(user: User):
    for t in texts(3):
        user.note(t)
    ring = user.ring()
    try:
        # Sealed as a server holding the key would seal it (a copy another
        # history of this user left): the file does not extend it.
        with write_transaction(ring):
            state_copies.put(ring, user.user_id, KeyChain(user.user_id, (user.master,)), {"log_head": "2:" + "ab" * 32})
    finally:
        ring.close()
    assert_error(user.wake(), 500, "store.rolled_back")
    ring = user.ring()
    try:
        # Edited in by hand: its MAC fails before it is compared (storage/keyring/state_copies.py).
        ring.execute("UPDATE keyring_meta SET value = ? WHERE name = 'log_head'", ("3:" + "ab" * 32,))
    finally:
        ring.close()
    assert_error(user.wake(), 500, "store.damaged")


def test_both_files_rolled_back_are_served_but_a_pinned_client_is_refused(user: User, tmp_path: Path):
    """The limit stated in SECURITY.md: who rolls back the key ring too is only
    caught by a client that remembers the head."""
    for t in texts(3):
        user.note(t)
    user.save(tmp_path / "old", "memory.db", "keyring.db")
    pin = None
    for t in texts(3, 3):
        pin = user.note(t)["head"]["pin"]
    user.put_back(tmp_path / "old", "memory.db", "keyring.db")
    assert user.wake().status_code == 200  # the server alone cannot tell
    headers = {"Stash-Pin": pin}
    body = assert_error(user.wake(headers=headers), 409, "store.pin_mismatch")
    assert "rolled back" in body["message"]
    assert_error(
        user.http.post("/note", user.token, json={"text": "must not land"}, headers=headers), 409, "store.pin_mismatch"
    )
    assert user.wake().json()["T"] == 3


# ----------------------------------------------------------------- pins


def test_a_pin_from_earlier_in_the_same_log_is_accepted(user: User):
    first = user.note("the first")["head"]
    for t in texts(5):
        user.note(t)
    for head in (first, user.wake().json()["head"]):
        resp = user.wake(headers={"Stash-Pin": head["pin"]})
        assert resp.status_code == 200, resp.text
    resp = user.http.post("/note", user.token, json={"text": "pinned write"}, headers={"Stash-Pin": first["pin"]})
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("mutate", ["digest", "ahead"])
def test_a_pin_the_log_does_not_continue_is_refused(user: User, mutate: str):
    head = None
    for t in texts(4):
        head = user.note(t)["head"]
    assert head is not None
    count, digest = head["count"], head["digest"]
    pin = f"{count}:{digest[:-1]}{'0' if digest[-1] != '0' else '1'}" if mutate == "digest" else f"{count + 1}:{digest}"
    assert_error(user.wake(headers={"Stash-Pin": pin}), 409, "store.pin_mismatch")
    assert_error(
        user.http.post("/note", user.token, json={"text": "refused"}, headers={"Stash-Pin": pin}),
        409,
        "store.pin_mismatch",
    )
    assert user.wake().json()["T"] == 4


@pytest.mark.parametrize("pin", ["", "4", "4:xyz", "-1:" + "0" * 64, "4:" + "0" * 63, "4:" + "A" * 64])
def test_a_malformed_pin_is_400(user: User, pin: str):
    assert_error(user.wake(headers={"Stash-Pin": pin}), 400, "request.bad_pin")


# ----------------------------------------------------------------- stores from before the digest


def test_a_store_written_before_the_digest_gets_it_on_first_open(http: Api, data_dir: Path, file_cipher: str):
    """A store as the releases before 0.1.0 left it: 16 KiB pages, every
    table made, no digest, no state head, no key epoch, no copies (made here
    with no memories: this release's rows have a later, sealed length, which
    itself says the file is newer)."""
    vault = Vault(data_dir, kdf=CHEAP_KDF, file_cipher=file_cipher, page_bytes=LEGACY_PAGE_BYTES)
    ident = vault.create_identity()
    user = User.__new__(User)
    user.http, user.token, user.user_id, user.cipher = http, ident.token, ident.user_id, file_cipher
    user.folder = data_dir / "users" / ident.user_id
    with vault.session(user.token, "read") as s:
        user.master = bytes(s.master)
        genesis = s.open_memory().mf.head
    with raw_memory_file(user.folder, user.master, file_cipher, LEGACY_PAGE_BYTES) as conn:
        conn.execute("DELETE FROM meta WHERE name IN ('log_head', 'state', 'epoch', 'drops')")
        conn.execute("UPDATE meta SET value = '1' WHERE name = 'format'")
        conn.executescript(sections()["memory_on_use"])
    ring = user.ring()
    try:
        ring.execute(
            "DELETE FROM keyring_meta WHERE name IN ('log_head', 'state_version', 'copies_mac', 'memory_page_bytes')"
        )
    finally:
        ring.close()
    assert user.wake().json()["head"]["pin"].startswith(f"0:{genesis.digest.hex()}")
    with raw_memory_file(user.folder, user.master, file_cipher, LEGACY_PAGE_BYTES) as conn:
        assert conn.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()[0] == current_mark(MEMORY_FILE)
    heads = [user.note(t)["head"] for t in texts(5)]
    assert heads[-1]["count"] == 5
    # Once recorded, the digest guards the upgraded store like any other.
    with raw_memory_file(user.folder, user.master, file_cipher, LEGACY_PAGE_BYTES) as conn:
        conn.execute("DELETE FROM log WHERE id = 4")
    assert_error(user.wake(), 500, "store.rolled_back")


@pytest.mark.parametrize("harm", ["cut", "missing"])
def test_a_store_that_cannot_be_served_can_still_be_destroyed(user: User, harm: str):
    for t in texts(3):
        user.note(t)
    if harm == "cut":
        with user.raw() as conn:
            conn.execute("DELETE FROM log WHERE id = 2")
    else:
        (user.folder / "memory.db").unlink()
    assert user.wake().status_code in (500, 503)
    resp = user.http.delete("/store", user.token)
    assert resp.status_code == 200, resp.text
    assert resp.json()["memories"] is None
    assert not user.folder.exists()
