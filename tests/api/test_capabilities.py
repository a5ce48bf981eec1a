"""Capabilities and key ownership over HTTP: listing, minting and revoking
grants, erasing memories, destroying the store (docs/DESIGN.md, "HTTP surface" and "Keys and capabilities")."""

from __future__ import annotations

import base64
import datetime as dt
import os
import re
import sqlite3
from pathlib import Path

import pytest

from stash.crypto import tokens
from stash.web.app import create_app
from tests.api.support import export_members
from tests.support.api import CHEAP_KDF, Api, assert_error, make_settings, matched, token_parts
from tests.support.files.raw import file_key, open_raw
from tests.support.memories import MAIN_MEMORY, Memory
from tests.support.oracle import bid

TOKEN = re.compile(tokens.TOKEN_PATTERN)
STAMP = "%Y-%m-%dT%H:%M:%SZ"


@pytest.fixture
def cap_api(data_dir: Path, keep_open: float):
    client = Api(create_app(make_settings(data_dir, kdf=CHEAP_KDF, keep_open=keep_open)))
    yield client
    client.close()


# ---------------------------------------------------------------- helpers


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0, tzinfo=None)


def stamp(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, STAMP)


def user_of(token: str) -> str:
    return token[7:23]


def every_file(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def grant_rows(data_dir: Path, user_id: str, memory: Memory = MAIN_MEMORY) -> dict[int, tuple]:
    """The key ring's grant rows as a thief of the file reads them."""
    conn = sqlite3.connect(str(memory.folder(data_dir / "users" / user_id) / "keyring.db"))
    try:
        rows = conn.execute("SELECT id, tag, scope, created, revoked, kdf, wrapped FROM grants ORDER BY id")
        return {r[0]: r[1:] for r in rows}
    finally:
        conn.close()


def log_rows(api: Api, data_dir: Path, owner: str) -> list[tuple[int, bytes]]:
    """The sealed log as stored, read with the file key (SQLCipher) or as is."""
    vault = api.app.state.vault
    with vault.session(owner, "owner") as s:
        master = bytes(s.master)
        cipher = s.keyring.meta("file_cipher")
    path = data_dir / "users" / user_of(owner) / "memory.db"
    conn = open_raw(path, file_key(master) if cipher == "sqlcipher" else None)
    try:
        return conn.execute("SELECT id, sealed FROM log ORDER BY id").fetchall()
    finally:
        conn.close()


def forms(blob: bytes) -> list[str]:
    """The ways a binary secret could be spelled in a JSON answer."""
    return [blob.hex(), blob.hex().upper(), base64.b64encode(blob).decode(), base64.urlsafe_b64encode(blob).decode()]


def mint(api: Api, owner: str, scope: str, memory: Memory = MAIN_MEMORY) -> dict:
    resp = api.post("/grants", owner, json=memory.grant(scope))
    assert resp.status_code == 201, resp.text
    return resp.json()


def settle(api: Api, token: str, text=lambda block: f"summary {block}") -> list[str]:
    done = []
    nap = api.post("/nap", token, json={}).json()["nap"]
    while nap is not None:
        resp = api.post("/nap", token, json={"block": nap["block"], "text": text(nap["block"])})
        assert resp.status_code == 200 and resp.json()["saved"] == nap["block"], resp.text
        done.append(nap["block"])
        nap = resp.json()["nap"]
    return done


# ---------------------------------------------------------------- GET /grants, POST /grants


def test_grants_lists_every_capability_live_and_revoked_and_never_a_secret(cap_api: Api, data_dir: Path) -> None:
    api = cap_api
    start = now()
    owner = api.init()["token"]
    read = mint(api, owner, "read")
    full = mint(api, owner, "full")
    gone = mint(api, owner, "read")
    revoked = api.delete(f"/grants/{gone['id']}", owner)
    assert revoked.status_code == 200, revoked.text
    end = now()

    resp = api.get("/grants", owner)
    assert resp.status_code == 200, resp.text
    listing = resp.json()["grants"]
    assert [g["scope"] for g in listing] == ["owner", "read", "full", "read"]
    ids = [g["id"] for g in listing]
    assert ids == sorted(ids) and len(set(ids)) == 4
    assert ids[1:] == [read["id"], full["id"], gone["id"]]
    for g in listing:
        assert {"id", "scope", "created", "revoked"} <= set(g), g
        assert all(v is None or isinstance(v, str | int | bool) for v in g.values()), g
        created = stamp(g["created"])
        assert start <= created <= end, g
        if g["id"] == gone["id"]:
            assert start <= created <= stamp(g["revoked"]) <= end
        else:
            assert g["revoked"] is None, g
    assert [g["id"] for g in listing if g.get("you")] == [ids[0]]
    assert {g["id"]: g["created"] for g in listing if g["id"] != ids[0]} == {
        m["id"]: m["created"] for m in (read, full, gone)
    }
    # Never a token, a secret, a lookup tag, a salt or a wrapped key.
    text = resp.text
    assert "stash1_" not in text
    for token in (owner, read["token"], full["token"], gone["token"]):
        assert token[24:-6] not in text
        assert not any(f in text for f in forms(token_parts(token).secret))
    for tag, _scope, _c, _r, kdf, wrapped in grant_rows(data_dir, user_of(owner)).values():
        for blob in (tag, wrapped):
            if blob is not None:
                assert not any(f in text for f in forms(blob))
        if kdf is not None:
            assert matched(re.search(r'"salt": "([0-9a-f]+)"', kdf)).group(1) not in text


def test_a_minted_token_is_shown_once_and_opens_its_scope_only(cap_api: Api, data_dir: Path) -> None:
    api = cap_api
    owner = api.init()["token"]
    read = mint(api, owner, "read")
    full = mint(api, owner, "full")
    for m, scope in ((read, "read"), (full, "full")):
        assert set(m) >= {"id", "scope", "created", "token"}
        assert m["scope"] == scope
        assert TOKEN.fullmatch(m["token"]) and user_of(m["token"]) == user_of(owner)
    assert read["token"] != full["token"] and read["id"] != full["id"]

    assert api.get("/wake", read["token"]).status_code == 200
    assert_error(api.post("/note", read["token"], json={"text": "reader writes"}), 403, "auth.scope")
    assert api.post("/note", full["token"], json={"text": "writer writes"}).status_code == 200
    assert_error(api.get("/grants", full["token"]), 403, "auth.scope")
    assert_error(api.post("/grants", full["token"], json={"scope": "read"}), 403, "auth.scope")

    # Shown once: no later answer and no file repeats it.
    later = [api.get("/grants", owner).text, api.get("/wake", owner).text, api.get("/erasures", owner).text]
    for blob in export_members(api, owner).values():
        later.append(blob.decode("utf-8", "replace"))
    files = every_file(data_dir)
    assert any(name.endswith("keyring.db") for name in files)
    for m in (read, full):
        secret = token_parts(m["token"]).secret
        assert not any(m["token"][24:-6] in t for t in later)
        for name, data in files.items():
            assert m["token"].encode() not in data and secret not in data, name


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"", 400, "request.empty_body"),
        (b"  \n ", 400, "request.empty_body"),
        (b"{}", 400, "request.missing_field"),
        (b'{"scope": "read"', 400, "request.bad_json"),
        (b'{"scope": "read", "color": "x"}', 400, "request.unknown_field"),
        (b'{"scope": "owner"}', 422, "grants.bad_scope"),
        (b'{"scope": "admin"}', 422, "grants.bad_scope"),
        (b'{"scope": "READ"}', 422, "grants.bad_scope"),
        (b'{"scope": null}', 422, "grants.bad_scope"),
        (b'{"scope": 1}', 422, "grants.bad_scope"),
    ],
)
def test_mint_needs_a_read_or_full_scope(cap_api: Api, data_dir: Path, body: bytes, status: int, code: str) -> None:
    owner = cap_api.init()["token"]
    before = grant_rows(data_dir, user_of(owner))
    assert_error(cap_api.post("/grants", owner, content=body), status, code)
    assert grant_rows(data_dir, user_of(owner)) == before
    assert [g["scope"] for g in cap_api.get("/grants", owner).json()["grants"]] == ["owner"]


# ---------------------------------------------------------------- DELETE /grants/{id}


def test_revoking_destroys_the_wrapped_key_and_keeps_the_row(cap_api: Api, data_dir: Path) -> None:
    api = cap_api
    owner = api.init()["token"]
    uid = user_of(owner)
    read = mint(api, owner, "read")
    full = mint(api, owner, "full")
    tag, _, _, _, _, wrapped = grant_rows(data_dir, uid)[read["id"]]
    assert wrapped is not None and any(wrapped in data for data in every_file(data_dir).values())
    assert api.get("/wake", read["token"]).status_code == 200

    start = now()
    resp = api.delete(f"/grants/{read['id']}", owner)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert (answer["id"], answer["scope"], answer["already"]) == (read["id"], "read", False)
    assert start <= stamp(answer["revoked"]) <= now()

    for method, url, body in (("GET", "/wake", None), ("GET", "/config", None), ("POST", "/recall", {"q": "x"})):
        kw = {} if body is None else {"json": body}
        assert_error(api.request(method, url, read["token"], **kw), 401, "auth.invalid")
    # The listing keeps the row, with its date of revocation.
    row = next(g for g in api.get("/grants", owner).json()["grants"] if g["id"] == read["id"])
    assert (row["scope"], row["created"], row["revoked"]) == ("read", read["created"], answer["revoked"])
    # On disk the key is gone from the row, and from every file (WAL included).
    _, scope, created, revoked_at, kdf_after, wrapped_after = grant_rows(data_dir, uid)[read["id"]]
    assert (scope, created, revoked_at) == ("read", read["created"], answer["revoked"])
    assert wrapped_after is None and kdf_after is None
    for name, data in every_file(data_dir).items():
        assert wrapped not in data, name
        assert tag not in data, name

    # Nothing was rekeyed: every other capability works as before.
    assert api.post("/note", full["token"], json={"text": "still writing"}).status_code == 200
    assert api.get("/wake", owner).json()["lines"][0].endswith(" still writing")
    again = api.delete(f"/grants/{read['id']}", owner)
    assert again.status_code == 200 and again.json()["already"] is True
    assert again.json()["revoked"] == answer["revoked"]


def test_the_owner_capability_cannot_be_revoked(cap_api: Api) -> None:
    api = cap_api
    owner = api.init()["token"]
    own = next(g for g in api.get("/grants", owner).json()["grants"] if g["scope"] == "owner")
    assert_error(api.delete(f"/grants/{own['id']}", owner), 409, "grants.owner")
    assert api.get("/grants", owner).json()["grants"] == [own]
    assert api.post("/note", owner, json={"text": "owner still here"}).status_code == 200


def test_revoking_an_unknown_grant_or_another_memorys_grant_is_404(cap_api: Api) -> None:
    api = cap_api
    owner = api.init()["token"]
    other = api.init()["token"]
    ours = mint(api, owner, "full")
    # Grant ids are per memory: the other owner cannot reach ours by number.
    for url in (f"/grants/{ours['id']}", "/grants/999", "/grants/abc", "/grants/-1", f"/grants/{'9' * 19}"):
        assert_error(api.delete(url, other), 404, "grants.unknown")
    assert_error(api.delete("/grants/999", owner), 404, "grants.unknown")
    assert api.post("/note", ours["token"], json={"text": "untouched"}).status_code == 200
    assert all(g["revoked"] is None for g in api.get("/grants", owner).json()["grants"])


# ---------------------------------------------------------------- POST /erase, GET /erasures


def path_of(i: int, T: int) -> list[str]:
    """docs/DESIGN.md, "Erase": erasing #i drops the complete blocks that contain it, one
    per level, smallest first (which is also the order they are due in)."""
    out, size = [], 2
    while size <= T:
        lo = i - i % size
        if lo + size <= T:
            out.append(bid(lo, lo + size))
        size *= 2
    return out


def test_erase_shreds_a_memory_everywhere_and_drops_what_was_built_on_it(cap_api: Api, data_dir: Path) -> None:
    api = cap_api
    owner = api.init()["token"]
    words = [f"w{i}x{os.urandom(5).hex()}" for i in range(10)]
    dates = [f"2021-03-{d:02d}" for d in (1, 1, 2, 3, 5, 8, 13, 13, 21, 22)]
    entries = [{"date": d, "text": f"memory {i} {w}"} for i, (d, w) in enumerate(zip(dates, words))]
    assert api.post("/import", owner, json={"entries": entries}).status_code == 200

    def quoting(block: str) -> str:
        lo, last = map(int, block.split("-"))
        return "holds " + " ".join(words[lo : last + 1])

    settle(api, owner, quoting)
    line = {i: f"#{i} {dates[i]} memory {i} {words[i]}" for i in range(10)}
    rows_before = log_rows(api, data_dir, owner)

    start = now()
    resp = api.post("/erase", owner, json={"ids": [5]})
    assert resp.status_code == 200, resp.text
    receipt = resp.json()
    assert {k: receipt[k] for k in ("ids", "erased", "dropped")} == {
        "ids": [5],
        "erased": [5],
        "dropped": len(path_of(5, 10)),
    }
    assert isinstance(receipt["receipt"], int) and start <= stamp(receipt["at"]) <= now()
    erased = f"#5 {dates[5]} [erased]"
    line[5] = erased

    # The log row is where it was, byte for byte; only its key is gone.
    assert log_rows(api, data_dir, owner) == rows_before
    # Wake, zoom, recall, the nap source and the export all show it erased.
    wake = api.get("/wake", owner).json()
    assert wake["lines"] == [line[i] for i in range(10)]
    assert wake["nap"]["block"] == "4-5" and wake["nap"]["source"] == [line[4], erased]
    assert api.get("/zoom", owner, params={"block": "4-5"}).json()["lines"] == [line[4], erased]
    # Only the blocks over #5 went: 6-7 keeps its summary.
    assert api.get("/zoom", owner, params={"block": "4-7"}).json()["lines"] == [
        "#4-5 not compressed yet",
        f"#6-7 {quoting('6-7')}",
    ]
    assert api.get("/zoom", owner, params={"block": "0-7"}).json()["lines"] == [
        f"#0-3 {quoting('0-3')}",
        "#4-7 not compressed yet",
    ]
    assert api.post("/recall", owner, json={"q": words[5]}).json() == {
        "matches": [],
        "total": 0,
        "more": None,
        "message": "No match.",
        "run": [],
    }
    assert api.post("/recall", owner, json={"q": r"\[erased\]"}).json() == {
        "matches": [erased],
        "total": 1,
        "more": None,
        "message": "1 match.",
        "run": [],
    }
    assert api.post("/recall", owner, json={"q": "memory"}).json()["total"] == 9
    members = export_members(api, owner)
    log = members["memory/LOG.txt"]
    assert [log[k : k + 320].decode().rstrip() for k in range(0, len(log), 320)] == [line[i] for i in range(10)]
    for name, blob in members.items():
        assert words[5].encode() not in blob, name

    # The agent writes the dropped summaries again, in the settling order, and they no
    # longer quote what was erased.
    nap = api.post("/nap", owner, json={}).json()["nap"]
    assert nap["remaining"] == len(path_of(5, 10)) - 1
    rebuilt = settle(api, owner, lambda b: f"again {b}")
    assert rebuilt == path_of(5, 10)
    assert api.get("/zoom", owner, params={"block": "0-7"}).json()["lines"] == [
        f"#0-3 {quoting('0-3')}",
        "#4-7 again 4-7",
    ]

    # A second erasure: 5 again is skipped, 2 is new; its receipt follows the first.
    second = api.post("/erase", owner, json={"ids": [5, 2, 2]}).json()
    assert (second["ids"], second["erased"]) == ([2, 5], [2])
    assert second["dropped"] == len(path_of(2, 10))
    assert second["receipt"] > receipt["receipt"]
    listed = api.get("/erasures", owner)
    assert listed.status_code == 200
    assert all(r.pop("flushed") is True for r in (receipt, second))  # nothing else held the file
    assert listed.json() == {"erasures": [receipt, second]}
    for w in words:
        assert w not in listed.text
    assert log_rows(api, data_dir, owner) == rows_before


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"ids": []}, 422, "erase.bad_ids"),
        ({"ids": 3}, 422, "erase.bad_ids"),
        ({"ids": ["1"]}, 422, "erase.bad_ids"),
        ({"ids": [1.5]}, 422, "erase.bad_ids"),
        ({"ids": [True]}, 422, "erase.bad_ids"),
        ({"ids": [0, 4]}, 422, "erase.unknown_id"),
        ({"ids": [-1]}, 422, "erase.unknown_id"),
        ({}, 400, "request.missing_field"),
        (None, 400, "request.empty_body"),
    ],
)
def test_a_refused_erasure_erases_nothing(cap_api: Api, body, status: int, code: str) -> None:
    api = cap_api
    owner = api.init()["token"]
    for i in range(4):
        api.post("/note", owner, json={"text": f"kept {i}"})
    before = api.get("/wake", owner).json()
    kw = {} if body is None else {"json": body}
    assert_error(api.post("/erase", owner, **kw), status, code)
    assert api.get("/wake", owner).json() == before
    assert api.get("/erasures", owner).json() == {"erasures": []}


# ---------------------------------------------------------------- DELETE /store


def test_destroying_the_store_kills_every_token_and_leaves_nothing(
    cap_api: Api, data_dir: Path, tmp_path: Path, memory: Memory
) -> None:
    """Every memory of the identity goes, each key ring overwritten before it
    is removed: a hard link to it made beforehand (a thief's, or a backup
    tool's) holds only zeros afterwards."""
    api = cap_api
    owner = api.init()["token"]
    uid = user_of(owner)
    memory.create(api, owner)
    marker = "kestrel-" + os.urandom(6).hex()
    for i in range(3):
        api.post(memory.at("/note"), owner, json={"text": f"{marker} {i}"})
    read, full, gone = (mint(api, owner, scope, memory) for scope in ("read", "full", "read"))
    api.delete(f"/grants/{gone['id']}", owner)
    wrapped = [r[5] for r in grant_rows(data_dir, uid, memory).values() if r[5] is not None]
    other = api.init()["token"]
    api.post("/note", other, json={"text": "the neighbour's memory"})
    other_files = every_file(data_dir / "users" / user_of(other))
    folder = memory.folder(data_dir / "users" / uid)
    links = tmp_path / "links"
    links.mkdir()
    for path in folder.glob("keyring.db*"):  # its -shm is SQLite's index of the WAL: page numbers, no row
        if not path.name.endswith("-shm"):
            os.link(path, links / path.name)
    assert (links / "keyring.db").stat().st_size > 0

    start = now()
    resp = api.delete("/store", owner)
    assert resp.status_code == 200, resp.text
    receipt = resp.json()
    assert {k: receipt[k] for k in ("user_id", "destroyed")} == {"user_id": uid, "destroyed": True}
    assert receipt["memories"] == 3 or not memory.is_main  # main's count
    for path in links.iterdir():
        assert not path.read_bytes().strip(b"\0"), f"{path.name} was removed without being overwritten"
    assert start <= stamp(receipt["at"]) <= now()

    answers = set()
    for token in (owner, read["token"], full["token"], gone["token"]):
        for method, url, body in (
            ("GET", "/wake", None),
            ("POST", "/note", {"text": "x"}),
            ("GET", "/grants", None),
            ("GET", "/export", None),
            ("DELETE", "/store", None),
        ):
            kw = {} if body is None else {"json": body}
            r = api.request(method, url, token, **kw)
            assert_error(r, 401, "auth.invalid")
            answers.add(r.content)
    assert len(answers) == 1

    # Nothing of it on disk: no path, and no byte that names or opens it.
    assert not (data_dir / "users" / uid).exists()
    for path in data_dir.rglob("*"):
        assert uid not in str(path.relative_to(data_dir))
    for name, data in every_file(data_dir).items():
        assert uid.encode() not in data and marker.encode() not in data, name
        assert not any(w in data for w in wrapped), name
    # The neighbour is untouched and keeps working.
    assert every_file(data_dir / "users" / user_of(other)) == other_files
    wake = api.get("/wake", other).json()
    assert wake["lines"][0].endswith(" the neighbour's memory")
    assert api.post("/note", other, json={"text": "after the neighbour left"}).json()["id"] == 1
