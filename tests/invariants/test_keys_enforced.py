"""Capabilities are enforced by the keys, not by a flag (docs/DESIGN.md, "Keys and capabilities").

Each test runs the real app in process and then attacks its data folder by
hand — the stdlib sqlite3 for the key ring and plain memory files, sqlcipher3
with the file key for encrypted ones — and asks the HTTP API what it will
serve. Sealed values are opened here with libsodium directly, in the format
schema.sql documents, so no expectation comes from the code under test.
tests/unit/test_storage.py covers single tamper cases at the storage layer;
these go through the routes and sweep whole byte ranges and whole folders.
The grant attacks and the lost tokens run in main and in a second memory
(tests/support/memories.py).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import sqlite3
import tarfile
from pathlib import Path

import argon2.low_level
import pytest
from nacl import bindings
from nacl.exceptions import CryptoError

from stash.crypto import keys, tokens
from stash.web.app import create_app
from tests.support.api import CHEAP_KDF, Api, assert_error, make_settings, member_bytes, token_parts
from tests.support.files.raw import file_key, open_raw, restore_log_triggers
from tests.support.forgery import with_checksum
from tests.support.memories import MAIN_MEMORY, Memory

pytestmark = pytest.mark.slow

NONCE, TAG, KEY = 24, 16, 32


@pytest.fixture
def http(data_dir: Path, file_cipher: str):
    client = Api(create_app(make_settings(data_dir, kdf=CHEAP_KDF, file_cipher=file_cipher)))
    yield client
    client.close()


@pytest.fixture
def plain_http(data_dir: Path):
    """For attacks on the key ring alone, which is plain SQLite either way."""
    client = Api(create_app(make_settings(data_dir, kdf=CHEAP_KDF)))
    yield client
    client.close()


# ---------------------------------------------------------------- an attacker's tools


def opens(key: bytes, sealed: bytes, aad: bytes) -> bytes | None:
    """XChaCha20-Poly1305 as schema.sql stores it: nonce || ciphertext || tag."""
    if len(key) != KEY or len(sealed) < NONCE + TAG:
        return None
    try:
        return bindings.crypto_aead_xchacha20poly1305_ietf_decrypt(sealed[NONCE:], aad, sealed[:NONCE], key)
    except CryptoError:
        return None


def aad(user_id: str, table: str, position) -> bytes:
    return f"stash/v1|{user_id}|{table}|{position}".encode()


def grant_aad(user_id: str, grant_id: int, scope: str) -> bytes:
    return f"stash/v1|{user_id}|grant|{grant_id}|{scope}".encode()


def user_of(token: str) -> str:
    return token[7:23]


def folder(data_dir: Path, user_id: str, memory: Memory = MAIN_MEMORY) -> Path:
    return memory.folder(data_dir / "users" / user_id)


def every_file(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def windows(blob: bytes) -> set[bytes]:
    return {blob[k : k + KEY] for k in range(len(blob) - KEY + 1)}


def master_of(api: Api, token: str, memory: Memory = MAIN_MEMORY) -> bytes:
    """Epoch 0's key: the root of the file key (and, before any revocation,
    of the rows key)."""
    with api.app.state.vault.session(token, "read", memory=memory.name) as s:
        return bytes(s.master)


def rows_key_of(api: Api, token: str, memory: Memory = MAIN_MEMORY) -> bytes:
    """The rows key of the store's current key epoch."""
    with api.app.state.vault.session(token, "read", memory=memory.name) as s:
        return keys.subkey(s.chain.current, b"rows")


def cert_aad(user_id: str, grant_id: int, scope: str) -> bytes:
    return f"stash/v2|{user_id}|grant|{grant_id}|{scope}".encode()


def file_cipher_of(data_dir: Path, user_id: str) -> str:
    conn = sqlite3.connect(str(folder(data_dir, user_id) / "keyring.db"))
    try:
        return conn.execute("SELECT value FROM keyring_meta WHERE name = 'file_cipher'").fetchone()[0]
    finally:
        conn.close()


@contextlib.contextmanager
def raw_memory(data_dir: Path, user_id: str, master: bytes, memory: Memory = MAIN_MEMORY):
    """The memory file opened outside the server, the log's guard triggers
    dropped, as someone holding the file (and its key) would."""
    path = folder(data_dir, user_id, memory) / "memory.db"
    conn = open_raw(
        path, file_key(master) if file_cipher_of(data_dir, user_id) == "sqlcipher" else None, isolation_level=None
    )
    try:
        conn.execute("PRAGMA synchronous = OFF")  # an attacker's edits need no fsync
        conn.execute("DROP TRIGGER IF EXISTS log_no_update")
        yield conn
        restore_log_triggers(conn)
    finally:
        conn.close()


@contextlib.contextmanager
def raw_keyring(data_dir: Path, user_id: str, memory: Memory = MAIN_MEMORY):
    conn = sqlite3.connect(str(folder(data_dir, user_id, memory) / "keyring.db"), isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = OFF")
        yield conn
    finally:
        conn.close()


def grant_row(data_dir: Path, user_id: str, grant_id: int, memory: Memory = MAIN_MEMORY) -> dict:
    with raw_keyring(data_dir, user_id, memory) as conn:
        row = conn.execute(
            "SELECT tag, scope, created, revoked, kdf, wrapped FROM grants WHERE id = ?", (grant_id,)
        ).fetchone()
    return dict(zip(("tag", "scope", "created", "revoked", "kdf", "wrapped"), row))


def every_value(conn) -> list[bytes]:
    """Every stored value of every table, as bytes."""
    out = []
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for name in names:
        for row in conn.execute(f'SELECT * FROM "{name}"'):
            for v in row:
                if isinstance(v, bytes):
                    out.append(v)
                elif isinstance(v, str):
                    out.append(v.encode())
    return out


def flip(blob: bytes, pos: int) -> bytes:
    b = bytearray(blob)
    b[pos] ^= 0x20
    return bytes(b)


def opens_nothing(resp, *markers: str, scope_first: bool = False) -> None:
    """Refused as unknown (401) or as damage (500): never served. With
    ``scope_first``, refused for its scope (403) is allowed too: a route of
    the identity asked by a capability of a memory other than main is
    refused so before any key is opened (tests/api/test_memories.py)."""
    codes = {401: "auth.invalid", 500: "store.damaged"} | ({403: "auth.scope"} if scope_first else {})
    assert resp.status_code in codes, (resp.status_code, resp.text[:300])
    assert_error(resp, resp.status_code, codes[resp.status_code])
    for m in markers:
        assert m not in resp.text


def mint(api: Api, owner: str, scope: str, memory: Memory = MAIN_MEMORY) -> dict:
    resp = api.post("/grants", owner, json=memory.grant(scope))
    assert resp.status_code == 201, resp.text
    return resp.json()


def new_memory(api: Api, notes: int = 4, memory: Memory = MAIN_MEMORY) -> tuple[str, str]:
    """A new identity's owner token, with ``notes`` notes in ``memory``, and their marker."""
    owner = api.init()["token"]
    memory.create(api, owner)
    marker = "m" + os.urandom(6).hex()
    for i in range(notes):
        assert api.post(memory.at("/note"), owner, json={"text": f"{marker} note {i}"}).status_code == 200
    return owner, marker


def settle(api: Api, token: str, text=lambda b: f"summary {b}", memory: Memory = MAIN_MEMORY) -> None:
    nap = api.post(memory.at("/nap"), token, json={}).json()["nap"]
    while nap is not None:
        resp = api.post(memory.at("/nap"), token, json={"block": nap["block"], "text": text(nap["block"])})
        assert resp.status_code == 200, resp.text
        nap = resp.json()["nap"]


def export(api: Api, owner: str, memory: Memory = MAIN_MEMORY) -> bytes:
    """The memory's content, for before/after comparisons (gzip timestamps aside)."""
    resp = api.get(memory.at("/export"), owner)
    assert resp.status_code == 200, resp.text
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(resp.content)), mode="r:") as tar:
        return b"".join(m.name.encode() + member_bytes(tar, m) for m in tar.getmembers() if m.isfile())


# Every route a capability could use, each with a body it would accept.
CALLS = [
    ("GET", "/wake", None),
    ("POST", "/recall", {"q": "note"}),
    ("GET", "/zoom?block=0-1", None),
    ("GET", "/config", None),
    ("POST", "/note", {"text": "forged write"}),
    ("POST", "/nap", {}),
    ("POST", "/config", {"WAKE_LINES": 7}),
    ("POST", "/forget", {"block": "0-1"}),
    ("POST", "/import", {"entries": [{"date": "2020-01-01", "text": "forged import"}]}),
    ("GET", "/grants", None),
    ("POST", "/grants", {"scope": "full"}),
    ("POST", "/erase", {"ids": [0]}),
    ("GET", "/erasures", None),
    ("GET", "/export", None),
    ("DELETE", "/grants/1", None),
    ("DELETE", "/store", None),
]


# Of those, the routes of the identity (main's key ring), not of the memory a capability is bound to.
IDENTITY_ROUTES = {"/grants", "/grants/1", "/store"}


def assert_every_route_refuses(api: Api, token: str, *markers: str, memory: Memory = MAIN_MEMORY) -> None:
    """Every route refuses ``token``, a capability bound to ``memory``; the
    routes that open its keys (all but the identity's, for a memory other
    than main) show that its wrap no longer opens."""
    for method, url, body in CALLS:
        kw = {} if body is None else {"json": body}
        scope_first = not memory.is_main and url in IDENTITY_ROUTES
        opens_nothing(api.request(method, url, token, **kw), *markers, scope_first=scope_first)


# ---------------------------------------------------------------- grants


@pytest.mark.parametrize(("scope", "forged"), [("read", "full"), ("read", "owner"), ("full", "owner")])
def test_raising_a_grants_scope_by_hand_opens_nothing(
    plain_http: Api, data_dir: Path, scope: str, forged: str, memory: Memory
):
    api = plain_http
    owner, marker = new_memory(api, memory=memory)
    uid = user_of(owner)
    grant = mint(api, owner, scope, memory)
    before = export(api, owner, memory)
    with raw_keyring(data_dir, uid, memory) as conn:
        conn.execute("UPDATE grants SET scope = ? WHERE id = ?", (forged, grant["id"]))
    # Not the raised scope, and not even the old one: the wrap no longer opens.
    assert_every_route_refuses(api, grant["token"], marker, memory=memory)
    assert export(api, owner, memory) == before
    assert api.get(memory.at("/wake"), owner).json()["T"] == 4
    # Put back, the same key opens again: the edit alone was refused.
    with raw_keyring(data_dir, uid, memory) as conn:
        conn.execute("UPDATE grants SET scope = ? WHERE id = ?", (scope, grant["id"]))
    assert api.get("/wake", grant["token"]).status_code == 200


def test_a_revoked_token_stays_dead_when_its_row_is_restored_by_hand(plain_http: Api, data_dir: Path, memory: Memory):
    api = plain_http
    owner, marker = new_memory(api, memory=memory)
    uid = user_of(owner)
    grant = mint(api, owner, "full", memory)
    row = grant_row(data_dir, uid, grant["id"], memory)
    assert api.delete(f"/grants/{grant['id']}", owner).status_code == 200
    # Clear the flag and refile the tag and the key derivation parameters (in
    # a memory but main, its tag's home in main's key ring too); only the
    # wrapped key cannot be put back, because it exists nowhere any more.
    with raw_keyring(data_dir, uid, memory) as conn:
        conn.execute(
            "UPDATE grants SET revoked = NULL, tag = ?, kdf = ? WHERE id = ?", (row["tag"], row["kdf"], grant["id"])
        )
    if not memory.is_main:
        with raw_keyring(data_dir, uid) as conn:
            conn.execute("INSERT OR REPLACE INTO memory_tags(tag, memory) VALUES (?, ?)", (row["tag"], memory.name))
    for name, data in every_file(data_dir).items():
        assert row["wrapped"] not in data, name
    assert_every_route_refuses(api, grant["token"], marker, memory=memory)
    assert api.get(memory.at("/wake"), owner).json()["T"] == 4


def test_a_wrapped_key_copied_to_another_grant_row_opens_nothing(plain_http: Api, data_dir: Path):
    api = plain_http
    owner, marker = new_memory(api)
    uid = user_of(owner)
    read, full = mint(api, owner, "read"), mint(api, owner, "full")
    r, f = grant_row(data_dir, uid, read["id"]), grant_row(data_dir, uid, full["id"])
    before = export(api, owner)
    # 1. The full grant's key material under the read grant's row.
    with raw_keyring(data_dir, uid) as conn:
        conn.execute("UPDATE grants SET kdf = ?, wrapped = ? WHERE id = ?", (f["kdf"], f["wrapped"], read["id"]))
    assert_every_route_refuses(api, read["token"], marker)
    # 2. The read grant's whole row (tag, salt, key) filed as the full grant.
    with raw_keyring(data_dir, uid) as conn:
        conn.execute("UPDATE grants SET tag = NULL, kdf = NULL, wrapped = NULL WHERE id = ?", (read["id"],))
        conn.execute(
            "UPDATE grants SET tag = ?, kdf = ?, wrapped = ? WHERE id = ?",
            (r["tag"], r["kdf"], r["wrapped"], full["id"]),
        )
    assert_every_route_refuses(api, read["token"], marker)
    assert_every_route_refuses(api, full["token"], marker)
    assert export(api, owner) == before
    assert api.post("/note", owner, json={"text": "the owner is untouched"}).status_code == 200


def test_a_wrapped_key_copied_into_another_users_key_ring_opens_nothing(plain_http: Api, data_dir: Path):
    api = plain_http
    x_owner, x_marker = new_memory(api)
    y_owner, y_marker = new_memory(api)
    x, y = user_of(x_owner), user_of(y_owner)
    grant = mint(api, x_owner, "read")
    row = grant_row(data_dir, x, grant["id"])
    y_before = export(api, y_owner)
    # The same token secret, addressed to Y, filed in Y's key ring under the
    # same id and scope with the tag Y's ring would look up: only the user
    # bound in the wrap differs.
    forged = with_checksum(f"stash1_{y}_{grant['token'][24:-6]}")
    parsed = tokens.parse(forged)
    assert parsed is not None and parsed.user_id == y
    with raw_keyring(data_dir, y) as conn:
        conn.execute(
            "INSERT INTO grants(id, tag, scope, created, kdf, wrapped) VALUES (?, ?, ?, ?, ?, ?)",
            (
                grant["id"],
                tokens.lookup_tag(y, parsed.secret),
                row["scope"],
                row["created"],
                row["kdf"],
                row["wrapped"],
            ),
        )
    assert_every_route_refuses(api, forged, x_marker, y_marker)
    # Filed verbatim (X's tag) it is not even found.
    with raw_keyring(data_dir, y) as conn:
        conn.execute("UPDATE grants SET tag = ? WHERE id = ?", (row["tag"], grant["id"]))
    assert_every_route_refuses(api, forged, x_marker, y_marker)
    assert export(api, y_owner) == y_before
    assert api.get("/wake", grant["token"]).json()["lines"][0].endswith(f"{x_marker} note 0")
    assert api.get("/wake", y_owner).json()["T"] == 4


def test_every_flipped_byte_of_a_grant_key_is_damage(plain_http: Api, data_dir: Path):
    api = plain_http
    owner, marker = new_memory(api)
    neighbour, n_marker = new_memory(api)
    uid = user_of(owner)
    grant = mint(api, owner, "full")
    row = grant_row(data_dir, uid, grant["id"])
    wrapped, kdf = row["wrapped"], row["kdf"]
    salt = json.loads(kdf)["salt"]
    edits = [("wrapped", flip(wrapped, k)) for k in range(len(wrapped))]
    edits += [("wrapped", wrapped[:-1]), ("wrapped", wrapped + b"\0"), ("wrapped", b"")]
    for k in range(0, len(salt), 3):
        other = "0" if salt[k] != "0" else "1"
        edits.append(("kdf", kdf.replace(salt, salt[:k] + other + salt[k + 1 :])))
    with raw_keyring(data_dir, uid) as conn:
        for k, (column, value) in enumerate(edits):
            # One edit at a time: the other column holds its true value.
            conn.execute(
                "UPDATE grants SET wrapped = ?, kdf = ? WHERE id = ?",
                (value if column == "wrapped" else wrapped, value if column == "kdf" else kdf, grant["id"]),
            )
            resp = api.get("/wake", grant["token"]) if k % 2 else api.post("/note", grant["token"], json={"text": "x"})
            body = assert_error(resp, 500, "store.damaged")
            for secret in (wrapped.hex(), salt, grant["token"][24:-6], marker):
                assert secret not in body["message"]
        conn.execute("UPDATE grants SET wrapped = ?, kdf = ? WHERE id = ?", (wrapped, kdf, grant["id"]))
    # The server survived every one of them, and nobody else noticed.
    assert api.get("/wake", grant["token"]).json()["T"] == 4
    assert api.get("/wake", neighbour).json()["lines"][0].endswith(f"{n_marker} note 0")


def test_every_flipped_bit_of_a_grants_key_parameters_is_damage(plain_http: Api, data_dir: Path):
    # The argon2id parameters and salt stored beside the wrapped key are part
    # of what opens it: a flipped bit there (a cost of 1 becoming 0, a salt
    # digit, a name) is the same damage as one in the key, not an internal error.
    api = plain_http
    owner, marker = new_memory(api)
    uid = user_of(owner)
    grant = mint(api, owner, "read")
    kdf = grant_row(data_dir, uid, grant["id"])["kdf"]
    raw = kdf.encode()
    wrong = []
    with raw_keyring(data_dir, uid) as conn:
        for k in range(len(raw)):
            edited = bytearray(raw)
            edited[k] ^= 0x01
            conn.execute("UPDATE grants SET kdf = ? WHERE id = ?", (edited.decode("latin-1"), grant["id"]))
            resp = api.get("/wake", grant["token"])
            if resp.status_code == 200:
                # A flip that leaves the same parameters (JSON whitespace or
                # escapes) is no edit at all; anything else must not open.
                assert json.loads(edited) == json.loads(raw), edited
                continue
            body = resp.json() if resp.headers["content-type"].startswith("application/json") else {}
            if (resp.status_code, body.get("error")) != (500, "store.damaged"):
                wrong.append((edited.decode("latin-1"), resp.status_code, body.get("error")))
            else:
                assert_error(resp, 500, "store.damaged")
                assert marker not in resp.text and grant["token"][24:-6] not in resp.text
        conn.execute("UPDATE grants SET kdf = ? WHERE id = ?", (kdf, grant["id"]))
    assert wrong == [], "not reported as damage:\n" + "\n".join(map(str, wrong))
    assert api.get("/wake", grant["token"]).status_code == 200


# ---------------------------------------------------------------- sealed rows


def positions(n: int) -> list[int]:
    """Every byte of the nonce and the tag, and a sweep through the ciphertext."""
    inner = list(range(NONCE, n - TAG, max(1, (n - NONCE - TAG) // 24)))
    return sorted(set(range(NONCE)) | set(inner) | set(range(n - TAG, n)))


# table, key column, key value, the request that has to open it
SEALED = [
    ("log", "id", 6, ("GET", "/wake")),
    ("memory_keys", "chunk", 0, ("GET", "/wake")),
    ("summaries", "size = 2 AND idx", 0, ("GET", "/zoom?block=0-3")),
    ("config", "name", "WAKE_LINES", ("GET", "/config")),
    ("erased", "id", 3, ("GET", "/wake")),
    ("erasures", "id", 1, ("GET", "/erasures")),
]


@pytest.mark.parametrize(("table", "column", "key", "route"), SEALED, ids=[s[0] for s in SEALED])
def test_a_flipped_byte_anywhere_in_a_sealed_row_is_damage(http: Api, data_dir: Path, table, column, key, route):
    api = http
    owner, marker = new_memory(api, notes=8)
    neighbour, n_marker = new_memory(api)
    settle(api, owner)
    assert api.post("/config", owner, json={"WAKE_LINES": 50}).status_code == 200
    assert api.post("/erase", owner, json={"ids": [3]}).status_code == 200
    settle(api, owner)
    uid = user_of(owner)
    method, url = route
    assert api.request(method, url, owner).status_code == 200
    before = export(api, owner)
    master = master_of(api, owner)
    where = f"{column} = ?"
    with raw_memory(data_dir, uid, master) as conn:
        (sealed,) = conn.execute(f"SELECT sealed FROM {table} WHERE {where}", (key,)).fetchone()
        for pos in positions(len(sealed)):
            conn.execute(f"UPDATE {table} SET sealed = ? WHERE {where}", (flip(sealed, pos), key))
            body = assert_error(api.request(method, url, owner), 500, "store.damaged")
            assert marker not in body["message"] and n_marker not in body["message"]
            if pos == 0:
                # While this store is damaged, another one serves as usual.
                assert api.get("/wake", neighbour).json()["lines"][0].endswith(f"{n_marker} note 0")
                assert api.post("/note", neighbour, json={"text": "unaffected"}).status_code == 200
        conn.execute(f"UPDATE {table} SET sealed = ? WHERE {where}", (sealed[:-1], key))
        assert_error(api.request(method, url, owner), 500, "store.damaged")
        conn.execute(f"UPDATE {table} SET sealed = ? WHERE {where}", (sealed, key))
    assert api.request(method, url, owner).status_code == 200
    assert export(api, owner) == before


# ---------------------------------------------------------------- erasure and loss


def all_values(data_dir: Path, user_id: str, master: bytes) -> list[bytes]:
    """What a holder of the file key reads out of both databases."""
    with raw_memory(data_dir, user_id, master) as conn:
        values = every_value(conn)
    with raw_keyring(data_dir, user_id) as conn:
        values += every_value(conn)
    return values


def memory_keys(
    data_dir: Path, user_id: str, master: bytes, rows_key: bytes | None = None, memory: Memory = MAIN_MEMORY
) -> dict[int, bytes]:
    rows_key = rows_key or keys.subkey(master, b"rows")
    with raw_memory(data_dir, user_id, master, memory) as conn:
        chunks = conn.execute("SELECT chunk, sealed FROM memory_keys").fetchall()
    out = {}
    for c, sealed in chunks:
        plain = opens(rows_key, sealed, aad(memory.store(user_id), "memory_keys", c))
        assert plain is not None
        out.update({c * 128 + k: plain[KEY * k : KEY * (k + 1)] for k in range(len(plain) // KEY)})
    return out


def test_an_erased_memory_cannot_be_recovered_with_every_token_and_every_file(http: Api, data_dir: Path):
    api = http
    owner = api.init()["token"]
    uid = user_of(owner)
    words = [f"w{i}q{os.urandom(6).hex()}" for i in range(8)]
    for w in words:
        assert api.post("/note", owner, json={"text": f"memory {w}"}).status_code == 200

    def quoting(block: str) -> str:
        lo, last = map(int, block.split("-"))
        return "holds " + " ".join(words[lo : last + 1])

    settle(api, owner, quoting)
    tokens_held = [owner, mint(api, owner, "read")["token"], mint(api, owner, "full")["token"]]
    master = master_of(api, owner)
    with raw_memory(data_dir, uid, master) as conn:
        (row5,) = conn.execute("SELECT sealed FROM log WHERE id = 5").fetchone()
        (old_chunk,) = conn.execute("SELECT sealed FROM memory_keys WHERE chunk = 0").fetchone()
    key5 = memory_keys(data_dir, uid, master)[5]
    # The control: with the key it had, memory #5 opens to its text.
    assert words[5].encode() in (opens(key5, row5, aad(uid, "log", 5)) or b"")
    if file_cipher_of(data_dir, uid) == "none":
        raw = b"".join(every_file(data_dir).values())
        assert old_chunk[:NONCE] in raw and old_chunk[NONCE + 5 * KEY : NONCE + 6 * KEY] in raw

    assert api.post("/erase", owner, json={"ids": [5]}).status_code == 200

    # Now hold everything: every token, so every master and subkey, every
    # memory key, every value of both databases, every byte of every file.
    masters = {master_of(api, t) for t in tokens_held}
    assert masters == {master}
    files = every_file(data_dir)
    values = all_values(data_dir, uid, master)
    slots = memory_keys(data_dir, uid, master)
    assert slots[5] == bytes(KEY) and len(slots) == 128
    with raw_memory(data_dir, uid, master) as conn:
        assert conn.execute("SELECT sealed FROM log WHERE id = 5").fetchone()[0] == row5
    candidates = {master, keys.subkey(master, b"rows"), keys.subkey(master, b"file"), *slots.values()}
    for blob in [*files.values(), *values]:
        candidates |= windows(blob)
    assert key5 not in candidates
    target = aad(uid, "log", 5)
    assert [c for c in candidates if opens(c, row5, target) is not None] == []
    # Nor is the text, or a summary that quoted it, anywhere to read.
    for name, data in files.items():
        assert words[5].encode() not in data, name
    for v in values:
        assert words[5].encode() not in v
    rows_key = keys.subkey(master, b"rows")
    with raw_memory(data_dir, uid, master) as conn:
        log = conn.execute("SELECT id, sealed FROM log").fetchall()
        summaries = conn.execute("SELECT size, idx, sealed FROM summaries").fetchall()
    for i, sealed in log:
        plain = opens(slots[i], sealed, aad(uid, "log", i))
        assert (plain is None) == (i == 5)
        if plain is not None:
            assert words[i].encode() in plain and words[5].encode() not in plain
    for size, idx, sealed in summaries:
        plain = opens(rows_key, sealed, aad(uid, "summaries", f"{size}|{idx}"))
        assert plain is not None and words[5].encode() not in plain
    if file_cipher_of(data_dir, uid) == "none":
        # No stale page or WAL frame keeps the old key chunk.
        raw = b"".join(files.values())
        assert old_chunk[:NONCE] not in raw and old_chunk[NONCE + 5 * KEY : NONCE + 6 * KEY] not in raw
    wake = api.get("/wake", owner).json()["lines"]
    assert wake[5].endswith(" [erased]") and words[5] not in api.get("/export", owner).text


def test_lose_every_token_and_no_file_opens_the_memory(http: Api, data_dir: Path, memory: Memory):
    api = http
    owner, marker = new_memory(api, notes=6, memory=memory)
    settle(api, owner, memory=memory)
    uid = user_of(owner)
    store = memory.store(uid)
    held = [owner, mint(api, owner, "read", memory)["token"], mint(api, owner, "full", memory)["token"]]
    gone = mint(api, owner, "read", memory)
    assert api.delete(f"/grants/{gone['id']}", owner).status_code == 200
    # What only the tokens give, recorded by the test before the tokens are lost.
    master = master_of(api, owner, memory)
    rows_key, file_key = rows_key_of(api, owner, memory), keys.subkey(master, b"file")
    with raw_memory(data_dir, uid, master, memory) as conn:
        (chunk,) = conn.execute("SELECT sealed FROM memory_keys WHERE chunk = 0").fetchone()
        (row0,) = conn.execute("SELECT sealed FROM log WHERE id = 0").fetchone()
    slots = memory_keys(data_dir, uid, master, rows_key, memory)
    # Each token's secret, and the one the owner is enrolled under in this memory.
    secrets = [memory.filed(data_dir / "users" / uid, t).secret for t in held]
    secrets += [token_parts(t).secret for t in held + [gone["token"]]]
    with raw_keyring(data_dir, uid, memory) as conn:
        grants = conn.execute("SELECT id, scope, kdf, wrapped, pub FROM grants WHERE wrapped IS NOT NULL").fetchall()
    assert len(grants) == 3
    # The harness can succeed: with a token's secret, argon2id opens its grant's certificate.
    gid, scope, kdf, wrapped, pub = grants[0]
    p = json.loads(kdf)
    kek = argon2.low_level.hash_secret_raw(
        secrets[0], bytes.fromhex(p["salt"]), p["t"], p["m"], p["p"], KEY, argon2.low_level.Type.ID
    )
    assert opens(kek, wrapped, cert_aad(store, gid, scope)) == pub
    assert opens(rows_key, chunk, aad(store, "memory_keys", 0)) is not None
    del held, kek

    # From here on: only the data folder.
    files = every_file(data_dir)
    together = b"".join(files.values())
    for name, data in files.items():
        for what, value in (("master", master), ("rows key", rows_key), ("file key", file_key)):
            assert value not in data and value[:16] not in data, f"{what} in {name}"
        for s in secrets:
            assert s not in data and s.hex().encode() not in data, name
        for i, k in slots.items():
            assert k not in data, f"key of memory #{i} in {name}"
        assert marker.encode() not in data, name
    # Every 32 bytes of the files — each alone and all of them end to end — as
    # a key-encryption key, a master key, a row key or a memory key.
    candidates = windows(together)
    plain_file = file_cipher_of(data_dir, uid) == "none"
    for c in candidates:
        for gid, scope, _kdf, wrapped, _pub in grants:
            assert opens(c, wrapped, grant_aad(store, gid, scope)) is None
            assert opens(c, wrapped, cert_aad(store, gid, scope)) is None
        assert c != master
        derived_rows, derived_file = keys.subkey(c, b"rows"), keys.subkey(c, b"file")
        assert derived_rows != rows_key and derived_file != file_key
        if plain_file:
            assert opens(derived_rows, chunk, aad(store, "memory_keys", 0)) is None
            assert opens(c, chunk, aad(store, "memory_keys", 0)) is None
            assert opens(c, row0, aad(store, "log", 0)) is None
