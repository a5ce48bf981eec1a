"""No file put back, alone or edited, is served as current (issue 26, finding
1 and must-hold 1; docs/DESIGN.md, "Formats" and "Whole-state
authentication"). With the app stopped, an older memory file is put back
and rows of either file deleted or put back with the sqlite3 module, so that
an older format could be claimed: no state head (pre-0.2.0), plain copies
(a key ring from before they were sealed), copies from an older key ring.
The restarted app refuses every one of them (store.damaged /
store.rolled_back) and never shows the erased memory, the later note is not
silently lost, and ``stash verify --token`` agrees. SQLCipher and plain
stores, real files, real crypto."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stash.crypto import tokens
from stash.service.ops.verify import verify_user
from stash.storage.keyring import Keyring
from stash.web.app import create_app
from tests.support.api import CHEAP_KDF, Api, assert_error, make_settings, token_parts
from tests.support.files.raw import file_key, open_raw

ERASED = "BRAVO-SECRET memory to be erased"
LATER = "written after the erasure"
REFUSED = ("store.damaged", "store.rolled_back")
MEMORY_FILES = ("memory.db", "memory.db-wal", "memory.db-shm")


class Store:
    """One user's store under an app that is started and stopped around
    each edit, as an operator's server is."""

    def __init__(self, data: Path, cipher: str) -> None:
        self.data, self.cipher = data, cipher
        self.api: Api | None = None
        self.start()
        self.owner = self.http.init()["token"]
        self.uid = token_parts(self.owner).user_id
        self.folder = data / "users" / self.uid

    @property
    def http(self) -> Api:
        assert self.api is not None
        return self.api

    def start(self) -> None:
        self.api = Api(create_app(make_settings(self.data, file_cipher=self.cipher, kdf=CHEAP_KDF)))

    def stop(self) -> None:
        self.http.close()
        self.api = None

    def ok(self, method: str, url: str, token: str | None = None, **kw) -> dict:
        resp = self.http.request(method, url, token or self.owner, **kw)
        assert resp.status_code in (200, 201), resp.text
        return resp.json()

    def base(self) -> bytes:
        tok = token_parts(self.owner)
        ring = Keyring(self.folder / "keyring.db", self.uid)
        try:
            grant = ring.find(tokens.lookup_tag(self.uid, tok.secret))
            assert grant is not None
            return ring.open_grant(grant, tok.secret).chain.base
        finally:
            ring.close()

    def snapshot(self, name: str) -> Path:
        """A copy of the user's folder, taken with the app stopped."""
        self.stop()
        dest = self.data.parent / name
        shutil.copytree(self.folder, dest)
        self.start()
        return dest

    def put_back(self, source: Path, names: tuple[str, ...] | None = None) -> None:
        """Files of ``source`` copied over the live folder (all of them when
        ``names`` is None), with the app stopped; it is started by the caller."""
        for name in names or tuple(p.name for p in source.iterdir()):
            (self.folder / name).unlink(missing_ok=True)
            if (source / name).exists():
                shutil.copy2(source / name, self.folder / name)

    @contextlib.contextmanager
    def memory_rows(self, base: bytes) -> Iterator[sqlite3.Connection]:
        conn = open_raw(
            self.folder / "memory.db", file_key(base) if self.cipher == "sqlcipher" else None, isolation_level=None
        )
        try:
            yield conn
        finally:
            conn.close()

    @contextlib.contextmanager
    def keyring_rows(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.folder / "keyring.db", isolation_level=None)
        try:
            yield conn
        finally:
            conn.close()

    def refused(self) -> None:
        """Every route that reads the memory refuses; the erased text is in no answer."""
        for method, url, body in (
            ("GET", "/wake", None),
            ("POST", "/recall", {"q": "BRAVO"}),
            ("GET", "/export", None),
            ("POST", "/note", {"text": "after the put-back"}),
        ):
            resp = self.http.request(method, url, self.owner, **({"json": body} if body else {}))
            assert resp.status_code == 500, (url, resp.status_code, resp.text[:300])
            assert assert_error(resp, 500)["error"] in REFUSED, resp.text
            assert "BRAVO" not in resp.text
        report = verify_user(self.folder, self.owner)
        assert not report.ok, report.facts  # stash verify --token agrees with the server


@pytest.fixture(params=["sqlcipher", "none"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "data", request.param)
    yield s
    if s.api is not None:
        s.stop()


def history(s: Store, revoke: bool) -> tuple[Path, bytes]:
    """Finding 1's history: three memories and a full capability; a copy of
    the folder; then #1 erased, (the capability revoked,) one more note. The
    copy from before, and epoch 0's key."""
    for text in ("alpha memory", ERASED, "charlie memory"):
        s.ok("POST", "/note", json={"text": text})
    full = s.ok("POST", "/grants", json={"scope": "full"})
    old = s.snapshot("old")
    s.ok("POST", "/erase", json={"ids": [1]})
    if revoke:
        s.ok("DELETE", f"/grants/{full['id']}")
    s.ok("POST", "/note", json={"text": LATER})
    return old, s.base()


def attack(s: Store, old: Path, edit: Callable[[Store], None]) -> None:
    """With the app stopped: the old memory file put back and ``edit`` made;
    then started. The live folder is put back as it was afterwards and must
    serve again (the edit, not something else, was refused)."""
    keep = s.snapshot(f"keep-{len(list(s.data.parent.iterdir()))}")
    s.stop()
    s.put_back(old, MEMORY_FILES)
    edit(s)
    s.start()
    s.refused()
    s.stop()
    s.put_back(keep)
    s.start()
    wake = s.ok("GET", "/wake")
    assert ERASED not in str(wake) and LATER in str(wake)


def drop_state(s: Store, base: bytes) -> None:
    with s.memory_rows(base) as conn:
        conn.execute("DELETE FROM meta WHERE name = 'state'")


def drop_ring_copies(s: Store) -> None:
    with s.keyring_rows() as conn:
        conn.execute("DELETE FROM keyring_meta WHERE name IN ('state_version', 'log_head', 'copies_mac')")


def test_finding_1_as_reported_state_row_and_key_ring_copies_deleted(store: Store) -> None:
    s = store
    old, base = history(s, revoke=True)

    def as_reported(s: Store) -> None:
        drop_state(s, base)
        drop_ring_copies(s)

    attack(s, old, as_reported)

    # And the file made to look as a pre-0.2.0 one as far as its plain rows go.
    def as_pre_epochs(s: Store) -> None:
        as_reported(s)
        with s.memory_rows(base) as conn:
            conn.execute("UPDATE meta SET value = '2' WHERE name = 'format'")
            conn.execute("DELETE FROM meta WHERE name IN ('epoch', 'drops')")

    attack(s, old, as_pre_epochs)


def test_an_old_memory_file_with_its_head_is_refused_whatever_copies_are_deleted_or_put_back(store: Store) -> None:
    s = store
    old, _ = history(s, revoke=True)
    attack(s, old, drop_ring_copies)  # the file's authenticated format says its copies are sealed

    def old_copies(s: Store) -> None:
        """The copies as the old key ring had them (sealed under the epoch before the revocation)."""
        with sqlite3.connect(old / "keyring.db") as src:
            rows = src.execute(
                "SELECT name, value FROM keyring_meta WHERE name IN ('state_version', 'log_head', 'copies_mac')"
            ).fetchall()
        drop_ring_copies(s)
        with s.keyring_rows() as conn:
            conn.executemany("INSERT INTO keyring_meta(name, value) VALUES (?, ?)", rows)

    attack(s, old, old_copies)


def test_without_a_revocation_a_file_passed_off_as_pre_0_2_0_is_refused(store: Store) -> None:
    """Key epoch 0 throughout: the key ring's copies (and a plain store's
    page-size record) deleted and the old file stripped of its head, its epoch and drop rows,
    its mark set to 2 (and, for a plain file, rebuilt in 16 KiB pages with
    every table): what still shows its format is sealed (its rows' length)."""
    s = store
    old, base = history(s, revoke=False)

    def passed_off(s: Store) -> None:
        drop_state(s, base)
        drop_ring_copies(s)
        if s.cipher == "none":  # (a SQLCipher file is read with the page size recorded: it stays)
            with s.keyring_rows() as conn:
                conn.execute("DELETE FROM keyring_meta WHERE name = 'memory_page_bytes'")
        with s.memory_rows(base) as conn:
            conn.execute("UPDATE meta SET value = '2' WHERE name = 'format'")
            conn.execute("DELETE FROM meta WHERE name IN ('epoch', 'drops')")
            if s.cipher == "none":
                from stash.storage.sqlite.schema import sections

                conn.executescript(sections()["memory_on_use"])
                conn.execute("PRAGMA journal_mode = DELETE")
                conn.execute("PRAGMA page_size = 16384")
                conn.execute("VACUUM")
                assert conn.execute("PRAGMA page_size").fetchone()[0] == 16384

    attack(s, old, passed_off)


def test_the_copies_are_sealed_an_edit_or_deletion_of_one_is_refused(store: Store) -> None:
    s = store
    for i in range(3):
        s.ok("POST", "/note", json={"text": f"memory {i}"})
    keep = s.snapshot("keep")
    edits = (
        "DELETE FROM keyring_meta WHERE name = 'copies_mac'",
        "UPDATE keyring_meta SET value = '1' WHERE name = 'state_version'",
        "DELETE FROM keyring_meta WHERE name = 'log_head'",
    )
    for sql in edits:
        s.stop()
        with s.keyring_rows() as conn:
            conn.execute(sql)
        s.start()
        s.refused()
        s.stop()
        s.put_back(keep)
        s.start()
        assert s.ok("GET", "/wake")["T"] == 3


def test_what_a_plain_memory_file_shows_of_an_erasure_and_a_sqlcipher_one_does_not(store: Store) -> None:
    """SECURITY.md, "What a replicated store shows": the erased ids and the
    config names are plain columns of a plain file; a SQLCipher file shows
    no table at all without its key."""
    s = store
    for text in ("alpha memory", ERASED, "charlie memory"):
        s.ok("POST", "/note", json={"text": text})
    s.ok("POST", "/erase", json={"ids": [1]})
    s.ok("POST", "/config", json={"WAKE_LINES": 50})
    s.stop()
    conn = sqlite3.connect(s.folder / "memory.db")
    try:
        if s.cipher == "none":
            assert conn.execute("SELECT id FROM erased").fetchall() == [(1,)]
            assert conn.execute("SELECT name FROM config").fetchall() == [("WAKE_LINES",)]
            assert not any(b"BRAVO" in bytes(r[0]) for r in conn.execute("SELECT sealed FROM log"))
        else:
            with pytest.raises(sqlite3.DatabaseError):
                conn.execute("SELECT id FROM erased").fetchall()
    finally:
        conn.close()
    s.start()


def test_copies_edited_do_not_stop_the_owner_revoking_a_capability(store: Store) -> None:
    """Whoever edits the copies can make the memory unservable (damage), but
    not keep a leaked capability alive: the revocation still goes through."""
    s = store
    s.ok("POST", "/note", json={"text": "one"})
    leaked = s.ok("POST", "/grants", json={"scope": "full"})
    s.stop()
    with s.keyring_rows() as conn:
        conn.execute("UPDATE keyring_meta SET value = '9' WHERE name = 'state_version'")
    s.start()
    assert_error(s.http.get("/wake", s.owner), 500, "store.damaged")
    s.ok("DELETE", f"/grants/{leaked['id']}")
    assert_error(s.http.get("/wake", leaked["token"]), 401, "auth.invalid")


def test_a_table_made_on_first_write_dropped_with_its_rows_is_refused(store: Store) -> None:
    """The log (its triggers go with it), the key chunks and the summaries
    are made by their first write, and a missing one reads as empty
    (schema.sql, "Pages"). Each dropped while holding rows, with the app
    stopped, is refused by every route once it is started, never served as
    an empty memory, and ``stash verify --token`` agrees; put back, the
    store serves again."""
    s = store
    for i in range(4):
        s.ok("POST", "/note", json={"text": f"memory {i}"})
    s.ok("POST", "/nap", json={"block": "0-1", "text": "what 0-1 held"})
    base = s.base()
    keep = s.snapshot("kept")
    for table in ("log", "memory_keys", "summaries"):
        s.stop()
        with s.memory_rows(base) as conn:
            assert conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] > 0, table
            conn.execute(f"DROP TABLE {table}")
        s.start()
        s.refused()
        s.stop()
        s.put_back(keep)
        s.start()
        assert "memory 3" in str(s.ok("GET", "/wake")), table
