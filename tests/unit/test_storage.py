"""Storage at rest (docs/DESIGN.md, "Sealing rows", "Formats"): real SQLite / SQLCipher files, attacked by hand.

Every store here is built through the service (Vault, Session, Memory) on
disk under tmp_path, for both file ciphers. The attacks then use a raw
connection opened the way an attacker who holds the file would: the stdlib
sqlite3 for a plain file, sqlcipher3 with the file key for an encrypted one,
dropping the append-only triggers first. Whatever the edit, the service must
raise Damaged — it never serves the altered bytes.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlcipher3.dbapi2 as sqlcipher

from stash.core import blocks
from stash.core.errors import Damaged, Unauthorized
from stash.crypto import aead, keys, tokens
from stash.service.access import Vault
from stash.storage.keyring import Keyring
from stash.storage.memfile import MemoryFile
from stash.web.app import create_app
from tests.support.api import Api, assert_error, make_settings, token_parts
from tests.support.files.raw import file_key, open_raw, restore_log_triggers

SQLITE_HEADER = b"SQLite format 3\x00"
DB_ERRORS = (sqlite3.Error, sqlcipher.Error)
T = 8


# ----------------------------------------------------------------- building stores


@dataclass
class Store:
    vault: Vault
    cipher: str
    user_id: str
    token: str
    master: bytes
    texts: list[str]

    @property
    def folder(self) -> Path:
        return self.vault.data_dir / "users" / self.user_id

    @property
    def memory_path(self) -> Path:
        return self.folder / "memory.db"

    @property
    def keyring_path(self) -> Path:
        return self.folder / "keyring.db"


def settle(memory) -> None:
    nap = memory.nap()["nap"]
    while nap is not None:
        nap = memory.nap(nap["block"], f"summary of {nap['block']}")["nap"]


def build(vault: Vault, cipher: str, texts: list[str] | None = None) -> Store:
    """A store of T memories with every summary settled."""
    marker = os.urandom(6).hex()
    texts = texts or [f"zebra {marker} memory number {i} is kept" for i in range(T)]
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        master = bytes(s.master)
        for text in texts:
            s.open_memory().note(text)
        settle(s.open_memory())
    return Store(vault, cipher, ident.user_id, ident.token, master, texts)


@pytest.fixture
def vault(tmp_path: Path, file_cipher: str) -> Vault:
    return Vault(tmp_path / "data", file_cipher=file_cipher)


@pytest.fixture
def store(vault: Vault, file_cipher: str) -> Store:
    return build(vault, file_cipher)


@contextlib.contextmanager
def raw_memory(store: Store, *, attacker: bool = True):
    """A connection to the memory file outside the service. As an attacker
    who stole the file key would, it drops the triggers that guard the log."""
    conn = open_raw(
        store.memory_path, file_key(store.master) if store.cipher == "sqlcipher" else None, isolation_level=None
    )
    try:
        if attacker:
            conn.execute("DROP TRIGGER IF EXISTS log_no_update")
            conn.execute("DROP TRIGGER IF EXISTS log_no_delete")
        yield conn
        if attacker:
            restore_log_triggers(conn)
    finally:
        conn.close()


def flip(blob: bytes, pos: int) -> bytes:
    b = bytearray(blob)
    b[pos] ^= 0x01
    return bytes(b)


def set_config(store: Store, changes: dict) -> None:
    with store.vault.session(store.token, "full") as s:
        s.open_memory().set_config(changes)


def all_files_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file())


# ----------------------------------------------------------------- the checks


def wake(m):
    return m.wake()


def recall(m):
    return m.recall("memory")


def zoom(block: str):
    def run(m):
        return m.zoom(block)

    run.__name__ = f"zoom {block}"
    return run


def assert_intact(store: Store) -> None:
    """The control: the untouched store serves everything it is asked for."""
    with store.vault.session(store.token, "read") as s:
        lines = s.open_memory().wake()["lines"]
        assert [line.split(" ", 2)[2] for line in lines] == store.texts
        assert s.open_memory().recall("memory")["total"] == T
        assert len(s.open_memory().zoom("0-7")["lines"]) == 2


def assert_damaged(store: Store, *ops) -> None:
    for op in ops:
        with pytest.raises(Damaged):
            with store.vault.session(store.token, "read") as s:
                served = op(s.open_memory())
                pytest.fail(f"{op.__name__} served altered data: {served!r}")


# ----------------------------------------------------------------- the log is append-only


def test_log_triggers_abort_update_and_delete(store: Store):
    with store.vault.session(store.token, "owner") as s:
        conn = s.open_memory().mf.conn
        before = conn.execute("SELECT id, sealed FROM log ORDER BY id").fetchall()
        attempts = [
            ("UPDATE log SET sealed = ? WHERE id = 0", (b"x" * 360,)),
            ("UPDATE log SET id = 100 WHERE id = 7", ()),
            ("UPDATE log SET sealed = sealed", ()),
            ("DELETE FROM log WHERE id = 7", ()),
            ("DELETE FROM log", ()),
            (
                "INSERT INTO log(id, sealed) VALUES (0, x'00') ON CONFLICT(id) DO UPDATE SET sealed = excluded.sealed",
                (),
            ),
        ]
        for sql, args in attempts:
            with pytest.raises(DB_ERRORS) as info:
                conn.execute(sql, args)
            assert "append-only" in str(info.value) or "constraint" in str(info.value).lower(), sql
        assert conn.execute("SELECT id, sealed FROM log ORDER BY id").fetchall() == before
    assert_intact(store)


def test_log_refuses_replace(store: Store):
    # INSERT OR REPLACE deletes the old row without firing DELETE triggers
    # (unless recursive_triggers is on): it must not rewrite the past either.
    with store.vault.session(store.token, "owner") as s:
        conn = s.open_memory().mf.conn
        before = conn.execute("SELECT id, sealed FROM log ORDER BY id").fetchall()
        for verb in ("INSERT OR REPLACE", "REPLACE"):
            sql = f"{verb} INTO log(id, sealed) VALUES (3, ?)"
            with contextlib.suppress(*DB_ERRORS):
                conn.execute(sql, (b"y" * 360,))
        assert conn.execute("SELECT id, sealed FROM log ORDER BY id").fetchall() == before


def test_triggers_survive_reopening(store: Store):
    # They are part of the file, not of one connection.
    with raw_memory(store, attacker=False) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        assert {"log_no_update", "log_no_delete"} <= names
        with pytest.raises(DB_ERRORS):
            conn.execute("DELETE FROM log WHERE id = 1")
        assert conn.execute("SELECT COUNT(*) FROM log").fetchone()[0] == T


# ----------------------------------------------------------------- what the files reveal


def test_sqlcipher_file_is_not_plain_sqlite(tmp_path: Path):
    store = build(Vault(tmp_path / "data", file_cipher="sqlcipher"), "sqlcipher")
    data = store.memory_path.read_bytes()
    assert not data.startswith(SQLITE_HEADER)
    conn = sqlite3.connect(str(store.memory_path))
    try:
        with pytest.raises(sqlite3.DatabaseError):
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchall()
    finally:
        conn.close()
    # Another key does not open it either.
    wrong = open_raw(store.memory_path, os.urandom(32))
    try:
        with pytest.raises(sqlcipher.DatabaseError):
            wrong.execute("SELECT COUNT(*) FROM sqlite_master").fetchall()
    finally:
        wrong.close()
    # The key ring must stay readable before the master key is known.
    assert store.keyring_path.read_bytes().startswith(SQLITE_HEADER)


def test_plain_file_holds_only_ciphertext(tmp_path: Path):
    store = build(Vault(tmp_path / "data", file_cipher="none"), "none")
    set_config(store, {"WAKE_LINES": 5})
    assert store.memory_path.read_bytes().startswith(SQLITE_HEADER)
    conn = sqlite3.connect(str(store.memory_path))
    try:
        rows = conn.execute("SELECT id, sealed FROM log ORDER BY id").fetchall()
        chunks = conn.execute("SELECT chunk, sealed FROM memory_keys").fetchall()
        summaries = conn.execute("SELECT size, idx, sealed FROM summaries").fetchall()
        config = conn.execute("SELECT name, sealed FROM config").fetchall()
    finally:
        conn.close()
    assert [r[0] for r in rows] == list(range(T))
    assert len(chunks) == 1 and len(summaries) == 7 and len(config) == 1
    # Every memory row's length is its text's bucket (schema.sql: "YYYY-MM-DD text"
    # padded to a multiple of 32 bytes with the writer's 4 bytes, at most 312).
    for i, sealed in rows:
        padded = 2 + len(f"2026-01-01 {store.texts[i]}".encode()) + 4
        assert len(sealed) == min(-(-padded // 32) * 32, 312) + aead.OVERHEAD
    # The documented format opens: chunk under the rows key, each memory under its own key.
    user = store.user_id
    rows_key = keys.subkey(store.master, b"rows")
    chunk = aead.open_sealed(rows_key, chunks[0][1], f"stash/v1|{user}|memory_keys|0".encode())
    for i, sealed in rows:
        plain = aead.open_sealed(chunk[32 * i : 32 * i + 32], sealed, f"stash/v1|{user}|log|{i}".encode())
        assert aead.unpad(plain).decode().endswith(" " + store.texts[i])
    assert aead.open_sealed(rows_key, config[0][1], f"stash/v1|{user}|config|WAKE_LINES".encode()) == b"5"
    # ...and nothing of it shows in the raw bytes.
    raw = all_files_bytes(store.folder)
    for text in store.texts:
        assert text.encode() not in raw
    assert store.texts[0].split()[1].encode() not in raw  # the random marker alone
    assert b"summary of" not in raw


def test_no_plaintext_in_the_file_or_its_wal_while_open(store: Store):
    marker = "okapi-" + os.urandom(8).hex()
    with store.vault.session(store.token, "full") as s:
        s.open_memory().note(f"{marker} noted while the file is open")
        s.open_memory().nap()
        files = sorted(p.name for p in store.folder.iterdir())
        raw = all_files_bytes(store.folder)
    assert any(name.endswith("-wal") for name in files), files
    assert marker.encode() not in raw
    assert marker.encode() not in all_files_bytes(store.folder)


# ----------------------------------------------------------------- tampering with rows


@pytest.mark.parametrize("row", [0, 7])
@pytest.mark.parametrize("pos", [0, 30, 80, -1])  # nonce, ciphertext, its padding and writer, tag
def test_flipped_byte_in_a_log_row_is_damage(store: Store, row: int, pos: int):
    assert_intact(store)
    with raw_memory(store) as conn:
        (sealed,) = conn.execute("SELECT sealed FROM log WHERE id = ?", (row,)).fetchone()
        conn.execute("UPDATE log SET sealed = ? WHERE id = ?", (flip(sealed, pos), row))
    block = "0-1" if row == 0 else "6-7"
    assert_damaged(store, wake, recall, zoom(block))


def test_a_row_moved_to_another_position_is_damage(store: Store):
    with raw_memory(store) as conn:
        (sealed,) = conn.execute("SELECT sealed FROM log WHERE id = 2").fetchone()
        conn.execute("UPDATE log SET sealed = ? WHERE id = 5", (sealed,))
    assert_damaged(store, wake, recall, zoom("4-5"))
    # The source row itself is untouched and still opens.
    with store.vault.session(store.token, "read") as s:
        assert s.open_memory().zoom("2-3")["lines"][0].endswith(store.texts[2])


def test_two_rows_swapped_is_damage(store: Store):
    with raw_memory(store) as conn:
        a = conn.execute("SELECT sealed FROM log WHERE id = 1").fetchone()[0]
        b = conn.execute("SELECT sealed FROM log WHERE id = 6").fetchone()[0]
        conn.execute("UPDATE log SET sealed = ? WHERE id = 1", (b,))
        conn.execute("UPDATE log SET sealed = ? WHERE id = 6", (a,))
    assert_damaged(store, wake, recall, zoom("0-1"), zoom("6-7"))


def test_a_deleted_row_is_damage_not_a_shorter_log(store: Store):
    with raw_memory(store) as conn:
        conn.execute("DELETE FROM log WHERE id = 3")
    assert_damaged(store, wake, recall, zoom("2-3"))


def test_a_flipped_memory_key_chunk_is_damage(store: Store):
    with raw_memory(store) as conn:
        (sealed,) = conn.execute("SELECT sealed FROM memory_keys WHERE chunk = 0").fetchone()
        conn.execute("UPDATE memory_keys SET sealed = ? WHERE chunk = 0", (flip(sealed, 100),))
    assert_damaged(store, wake, recall, zoom("0-1"))


def test_a_summary_copied_to_another_block_of_its_level_is_damage(store: Store):
    with raw_memory(store) as conn:
        (sealed,) = conn.execute("SELECT sealed FROM summaries WHERE size = 2 AND idx = 0").fetchone()
        conn.execute("UPDATE summaries SET sealed = ? WHERE size = 2 AND idx = 1", (sealed,))
    assert_damaged(store, zoom("0-3"))
    with store.vault.session(store.token, "read") as s:
        assert s.open_memory().zoom("4-7")["lines"] == ["#4-5 summary of 4-5", "#6-7 summary of 6-7"]


def test_a_summary_copied_to_another_level_is_damage(store: Store):
    with raw_memory(store) as conn:
        (sealed,) = conn.execute("SELECT sealed FROM summaries WHERE size = 2 AND idx = 0").fetchone()
        conn.execute("UPDATE summaries SET sealed = ? WHERE size = 4 AND idx = 0", (sealed,))
    assert_damaged(store, zoom("0-7"))


def test_a_damaged_summary_the_wake_needs_is_damage(store: Store):
    set_config(store, {"WAKE_LINES": 2})
    needed = [(lo, hi) for lo, hi in blocks.cover(T, 2) if hi - lo > 1]
    assert needed
    lo, hi = needed[0]
    size = hi - lo
    with raw_memory(store) as conn:
        donor = conn.execute(
            "SELECT sealed FROM summaries WHERE NOT (size = ? AND idx = ?) LIMIT 1", (size, lo // size)
        ).fetchone()[0]
        conn.execute("UPDATE summaries SET sealed = ? WHERE size = ? AND idx = ?", (donor, size, lo // size))
    assert_damaged(store, wake)


def test_a_flipped_config_value_is_damage(store: Store):
    set_config(store, {"WAKE_LINES": 5})
    with raw_memory(store) as conn:
        (sealed,) = conn.execute("SELECT sealed FROM config WHERE name = 'WAKE_LINES'").fetchone()
        conn.execute("UPDATE config SET sealed = ? WHERE name = 'WAKE_LINES'", (flip(sealed, len(sealed) - 3),))
    assert_damaged(store, wake, recall, zoom("0-1"))


def test_a_config_value_copied_to_another_name_is_damage(store: Store):
    set_config(store, {"WAKE_LINES": 5, "PART_LINES": 7})
    with raw_memory(store) as conn:
        (sealed,) = conn.execute("SELECT sealed FROM config WHERE name = 'WAKE_LINES'").fetchone()
        conn.execute("UPDATE config SET sealed = ? WHERE name = 'PART_LINES'", (sealed,))
    assert_damaged(store, wake)


# ----------------------------------------------------------------- across users


@pytest.fixture
def two(vault: Vault, file_cipher: str) -> tuple[Store, Store]:
    a = build(vault, file_cipher)
    b = build(vault, file_cipher, texts=list(a.texts))  # same words, so only the binding differs
    return a, b


def copy_rows(src: Store, dst: Store, table: str, key: str, ids: list[int]) -> None:
    with raw_memory(src, attacker=False) as s:
        rows = [s.execute(f"SELECT sealed FROM {table} WHERE {key} = ?", (i,)).fetchone()[0] for i in ids]
    with raw_memory(dst) as d:
        for i, sealed in zip(ids, rows):
            d.execute(f"UPDATE {table} SET sealed = ? WHERE {key} = ?", (sealed, i))


def test_a_log_row_from_another_user_is_damage(two):
    a, b = two
    copy_rows(a, b, "log", "id", [3])
    assert_damaged(b, wake, recall, zoom("2-3"))
    assert_intact(a)


def test_a_memory_key_chunk_from_another_user_is_damage(two):
    a, b = two
    copy_rows(a, b, "memory_keys", "chunk", [0])
    assert_damaged(b, wake, recall, zoom("6-7"))
    assert_intact(a)


def test_another_users_keys_and_log_together_are_damage(two):
    # Even the whole sealed content of A, keys included, does not open as B's.
    a, b = two
    copy_rows(a, b, "memory_keys", "chunk", [0])
    copy_rows(a, b, "log", "id", list(range(T)))
    assert_damaged(b, wake, recall, zoom("0-1"))


def test_a_summary_from_another_user_is_damage(two):
    a, b = two
    with raw_memory(a, attacker=False) as s:
        (sealed,) = s.execute("SELECT sealed FROM summaries WHERE size = 2 AND idx = 0").fetchone()
    with raw_memory(b) as d:
        d.execute("UPDATE summaries SET sealed = ? WHERE size = 2 AND idx = 0", (sealed,))
    assert_damaged(b, zoom("0-3"))


def test_another_users_whole_file_is_damage(two):
    a, b = two
    b.memory_path.write_bytes(a.memory_path.read_bytes())
    assert_damaged(b, wake)
    assert_intact(a)


# ----------------------------------------------------------------- the key ring


def edit_keyring(store: Store, sql: str, args: tuple = ()) -> None:
    conn = sqlite3.connect(str(store.keyring_path), isolation_level=None)
    try:
        conn.execute(sql, args)
    finally:
        conn.close()


def grant_row(store: Store, grant_id: int) -> tuple:
    conn = sqlite3.connect(str(store.keyring_path))
    try:
        return conn.execute("SELECT tag, scope, created, kdf, wrapped FROM grants WHERE id = ?", (grant_id,)).fetchone()
    finally:
        conn.close()


def mint(store: Store, scope: str) -> tuple[int, str]:
    with store.vault.session(store.token, "owner") as s:
        return store.vault.mint_grant(s, scope)


def assert_opens_nothing(store: Store, token: str) -> None:
    for need in ("read", "full", "owner"):
        with pytest.raises((Damaged, Unauthorized)):
            with store.vault.session(token, need) as s:
                pytest.fail(f"opened a {s.scope} session")


@pytest.mark.parametrize(
    ("scope", "forged"), [("read", "full"), ("read", "owner"), ("full", "owner"), ("full", "read")]
)
def test_editing_a_grants_scope_opens_nothing(store: Store, scope: str, forged: str):
    grant_id, token = mint(store, scope)
    with store.vault.session(token, "read") as s:
        assert s.scope == scope
    edit_keyring(store, "UPDATE grants SET scope = ? WHERE id = ?", (forged, grant_id))
    assert_opens_nothing(store, token)
    assert_intact(store)  # the owner's grant is untouched


def test_a_wrapped_key_copied_to_another_grant_opens_nothing(store: Store):
    read_id, read_token = mint(store, "read")
    full_id, _ = mint(store, "full")
    _, _, _, kdf, wrapped = grant_row(store, full_id)
    edit_keyring(store, "UPDATE grants SET kdf = ?, wrapped = ? WHERE id = ?", (kdf, wrapped, read_id))
    assert_opens_nothing(store, read_token)


def test_a_grant_row_moved_to_another_id_opens_nothing(store: Store):
    # Same tag, salt and wrapped key, filed under a fresh id claiming "full":
    # the wrap binds the id and scope, so it does not open.
    read_id, read_token = mint(store, "read")
    tag, _, created, kdf, wrapped = grant_row(store, read_id)
    edit_keyring(store, "DELETE FROM grants WHERE id = ?", (read_id,))
    edit_keyring(
        store,
        "INSERT INTO grants(id, tag, scope, created, kdf, wrapped) VALUES (99, ?, 'full', ?, ?, ?)",
        (tag, created, kdf, wrapped),
    )
    assert_opens_nothing(store, read_token)


def test_a_flipped_wrapped_key_opens_nothing(store: Store):
    read_id, read_token = mint(store, "read")
    wrapped = grant_row(store, read_id)[4]
    edit_keyring(store, "UPDATE grants SET wrapped = ? WHERE id = ?", (flip(wrapped, 40), read_id))
    assert_opens_nothing(store, read_token)


def test_a_revoked_grant_stays_dead_after_hand_edits(store: Store):
    read_id, read_token = mint(store, "read")
    with store.vault.session(store.token, "owner") as s:
        assert store.vault.revoke_grant(s, read_id)["already"] is False
    tag, scope, _, kdf, wrapped = grant_row(store, read_id)
    assert (tag, kdf, wrapped) == (None, None, None) and scope == "read"
    assert_opens_nothing(store, read_token)
    # Un-revoke by hand, even refiling the tag (a token holder can compute it):
    # there is no wrapped key left to open.
    parsed = token_parts(read_token)
    edit_keyring(
        store,
        "UPDATE grants SET revoked = NULL, tag = ? WHERE id = ?",
        (tokens.lookup_tag(parsed.user_id, parsed.secret), read_id),
    )
    assert_opens_nothing(store, read_token)


def test_no_key_material_in_any_file(store: Store):
    _, read_token = mint(store, "read")
    secrets = {
        "master": store.master,
        "file key": keys.subkey(store.master, b"file"),
        "rows key": keys.subkey(store.master, b"rows"),
        "owner secret": token_parts(store.token).secret,
        "read secret": token_parts(read_token).secret,
        "owner token": store.token.encode(),
        "read token": read_token.encode(),
    }
    for path in sorted(store.folder.iterdir()):
        data = path.read_bytes()
        for name, value in secrets.items():
            assert value not in data, f"{name} found in {path.name}"
            assert value[:16] not in data, f"half of the {name} found in {path.name}"


def test_keyring_holds_one_wrap_per_live_grant_and_nothing_else_secret(store: Store):
    mint(store, "read")
    conn = sqlite3.connect(str(store.keyring_path))
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        grants = conn.execute("SELECT scope, wrapped FROM grants ORDER BY id").fetchall()
        meta = dict(conn.execute("SELECT name, value FROM keyring_meta"))
        records = conn.execute("SELECT COUNT(*) FROM idempotency").fetchone()[0] if "idempotency" in tables else 0
    finally:
        conn.close()
    # idempotency holds sealed answers to keyed mints only (tests/unit/test_idempotency.py);
    # it, grant_notes and audit are made by their first write (schema.sql, "Pages"): an
    # unkeyed mint makes none of the first, and the owner's session records its last use.
    assert tables == {"grants", "keyring_meta", "grant_notes"}
    assert records == 0
    assert [g[0] for g in grants] == ["owner", "read"]
    for _, wrapped in grants:
        assert len(wrapped) == 32 + aead.OVERHEAD  # one sealed master key, nothing more
    assert meta["file_cipher"] == store.cipher
    assert store.master.hex() not in " ".join(meta.values())


# ----------------------------------------------------------------- sessions forget their keys


def reachable_bytes(root: object, limit: int = 5000) -> list[bytes]:
    """Every bytes value reachable from ``root`` through instance attributes
    and containers — what code holding the session object could still read."""
    found, seen, todo = [], set[int](), [root]
    while todo and len(seen) < limit:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, bytes | bytearray | memoryview):
            found.append(bytes(obj))
        elif isinstance(obj, dict):
            todo.extend(obj.keys())
            todo.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            todo.extend(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            todo.extend(vars(obj).values())
    return found


def test_session_drops_its_keys_on_exit(store: Store):
    with store.vault.session(store.token, "owner") as s:
        inside = bytes(s.master)
        assert inside == store.master
        assert s.open_memory().recall("memory")["total"] == T
    assert s.master == b""
    mf = s.open_memory().mf
    assert isinstance(mf, MemoryFile)
    with pytest.raises(DB_ERRORS):
        mf.conn.execute("SELECT 1")
    assert isinstance(s.keyring, Keyring)
    with pytest.raises(DB_ERRORS):
        s.keyring.conn.execute("SELECT 1")
    derived = {inside, keys.subkey(inside, b"file"), keys.subkey(inside, b"rows")}
    leftovers = [b for b in reachable_bytes(s) if any(k in b for k in derived)]
    assert leftovers == []


def test_session_drops_its_keys_when_the_work_fails(store: Store):
    class Boom(Exception):
        pass

    held: dict[str, Any] = {}
    with pytest.raises(Boom), store.vault.session(store.token, "owner") as s:
        held["s"] = s
        held["mf"] = s.open_memory().mf
        assert held["mf"].count() == T
        raise Boom
    s = held["s"]
    assert s.master == b""
    with pytest.raises(DB_ERRORS):
        held["mf"].conn.execute("SELECT 1")
    with pytest.raises(DB_ERRORS):
        s.open_memory().mf.count()


def test_an_ended_session_cannot_open_the_memory(store: Store):
    with store.vault.session(store.token, "owner") as s:
        pass  # never touched the memory file
    with pytest.raises(RuntimeError):
        _ = s.open_memory()


# ----------------------------------------------------------------- over HTTP


@pytest.fixture
def http(data_dir: Path, file_cipher: str):
    client = Api(create_app_for(data_dir, file_cipher))
    yield client
    client.close()


def create_app_for(data_dir: Path, file_cipher: str):
    return create_app(make_settings(data_dir, file_cipher=file_cipher))


def test_damaged_store_answers_500_and_other_users_keep_working(http: Api, data_dir: Path, file_cipher: str):
    a, b = http.init()["token"], http.init()["token"]
    marker = "heron-" + os.urandom(6).hex()
    for token in (a, b):
        for i in range(4):
            assert http.post("/note", token, json={"text": f"{marker} note {i}"}).status_code == 200
    vault = Vault(data_dir, file_cipher=file_cipher)
    with vault.session(a, "owner") as s:
        victim = Store(vault, file_cipher, s.user_id, a, bytes(s.master), [])
    with raw_memory(victim) as conn:
        (sealed,) = conn.execute("SELECT sealed FROM log WHERE id = 1").fetchone()
        conn.execute("UPDATE log SET sealed = ? WHERE id = 1", (flip(sealed, 50),))
    for resp in (
        http.get("/wake", a),
        http.post("/wake", a, json={}),
        http.get("/recall", a, params={"q": "note"}),
        http.post("/recall", a, json={"q": "note"}),
        http.get("/zoom", a, params={"block": "0-1"}),
    ):
        assert_error(resp, 500, "store.damaged")
        assert marker not in resp.text
    ok = http.get("/wake", b)
    assert ok.status_code == 200, ok.text
    assert ok.json()["lines"][1].endswith(f"{marker} note 1")
    assert http.post("/note", b, json={"text": "still here"}).json()["id"] == 4
    assert http.get("/recall", b, params={"q": "still"}).json()["total"] == 1


def test_a_forged_scope_is_refused_over_http(http: Api, data_dir: Path, file_cipher: str):
    owner = http.init()["token"]
    vault = Vault(data_dir, file_cipher=file_cipher)
    with vault.session(owner, "owner") as s:
        grant_id, read_token = vault.mint_grant(s, "read")
        user_id = s.user_id
    assert http.get("/wake", read_token).status_code == 200
    conn = sqlite3.connect(str(data_dir / "users" / user_id / "keyring.db"), isolation_level=None)
    try:
        conn.execute("UPDATE grants SET scope = 'full' WHERE id = ?", (grant_id,))
    finally:
        conn.close()
    for resp in (http.get("/wake", read_token), http.post("/note", read_token, json={"text": "forged write"})):
        assert resp.status_code in (401, 500), resp.text
        assert_error(resp, resp.status_code, "auth.invalid" if resp.status_code == 401 else "store.damaged")
    assert http.get("/wake", owner).json()["T"] == 0
