"""Memories are isolated by keys, not by checks: each attack is done for real
on the files, between two runs of the app over the same data folder
(docs/DESIGN.md, "Memories"; SECURITY.md, "Memories")."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from stash.crypto import tokens
from stash.web.app import create_app
from tests.fixtures import make_release1, make_release2
from tests.support.api import CHEAP_KDF, Api, make_settings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def app(data: Path, **kw) -> Api:
    return Api(create_app(make_settings(data, kdf=CHEAP_KDF, **kw)))


def mint(api: Api, owner: str, scope: str, memory: str) -> str:
    resp = api.post("/grants", owner, json={"scope": scope, "memory": memory})
    assert resp.status_code == 201, resp.text
    return resp.json()["token"]


def identity(data: Path, **kw) -> tuple[str, Path, dict[str, str]]:
    """An identity with memories a and b, each holding a marker line, and a
    read capability of each; the app is stopped when this returns."""
    api = app(data, **kw)
    try:
        made = api.init()
        owner = made["token"]
        for name in ("a", "b"):
            assert api.post("/memories", owner, json={"name": name}).status_code == 201
            assert api.post(f"/m/{name}/note", owner, json={"text": f"marker-{name} lives here"}).status_code == 200
        toks = {"owner": owner, "a": mint(api, owner, "read", "a"), "b": mint(api, owner, "read", "b")}
        for name in ("a", "b"):  # each read capability works, bound to its memory
            assert f"marker-{name}" in api.get("/wake", toks[name]).text
    finally:
        api.close()
    return owner, data / "users" / made["user_id"], toks


def no_b(resp) -> None:
    assert "marker-b" not in resp.text, resp.text


def test_swapping_b_files_into_a_place_opens_nothing_of_b(tmp_path: Path) -> None:
    data = tmp_path / "data"
    owner, folder, toks = identity(data)
    m = folder / "m"
    shutil.rmtree(m / "a")
    shutil.copytree(m / "b", m / "a")
    api = app(data)
    try:
        for tok in (toks["a"], owner):
            for path in ("/m/a/wake", "/m/a/recall?q=marker", "/wake"):
                no_b(api.get(path, tok))
            # A's name now holds B's files: the owner's key for A does not open them, A's token is not in them.
            assert api.get("/m/a/wake", tok).status_code in (401, 500)
        # B itself still answers its own token and the owner.
        assert "marker-b" in api.get("/m/b/wake", owner).text
    finally:
        api.close()


def test_splicing_b_rows_into_a_file_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    owner, folder, toks = identity(data, file_cipher="none")
    a, b = (sqlite3.connect(folder / "m" / n / "memory.db") for n in ("a", "b"))
    row = b.execute("SELECT sealed FROM log WHERE id = 0").fetchone()[0]
    a.execute("INSERT INTO log(id, sealed) VALUES (1, ?)", (row,))  # B's memory #0 as A's #1
    a.commit()
    a.close()
    b.close()
    api = app(data, file_cipher="none")
    try:
        for tok in (toks["a"], owner):
            resp = api.get("/m/a/wake", tok)
            assert resp.status_code >= 400 and resp.json()["error"].startswith("store."), resp.text
            no_b(resp)
            no_b(api.post("/m/a/recall", tok, json={"q": "marker"}))
    finally:
        api.close()


def test_a_token_against_b_key_material_opens_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _, folder, toks = identity(data)
    tag = tokens.lookup_tag(*((t := tokens.parse(toks["a"])).user_id, t.secret))  # type: ignore[union-attr]
    ra, rb = (sqlite3.connect(folder / "m" / n / "keyring.db") for n in ("a", "b"))
    cols = "tag, scope, created, revoked, kdf, wrapped, pub, box"
    grant = ra.execute(f"SELECT id, {cols} FROM grants WHERE tag = ?", (tag,)).fetchone()
    rb.execute(f"INSERT INTO grants(id, {cols}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", grant)  # A's row in B's ring
    rb.commit()
    main = sqlite3.connect(folder / "keyring.db")
    main.execute("UPDATE memory_tags SET memory = 'b' WHERE tag = ?", (tag,))  # and pointed at B
    main.commit()
    for c in (ra, rb, main):
        c.close()
    api = app(data)
    try:
        for path in ("/wake", "/m/b/wake", "/m/a/wake"):
            resp = api.get(path, toks["a"])
            assert resp.status_code >= 400, resp.text
            no_b(resp)
    finally:
        api.close()


def test_the_append_token_with_every_file_recovers_no_plaintext(tmp_path: Path) -> None:
    from nacl.exceptions import CryptoError
    from nacl.public import PrivateKey, SealedBox

    from stash.crypto import inbox_seal

    data = tmp_path / "data"
    api = app(data, file_cipher="none")
    try:
        made = api.init()
        owner = made["token"]
        api.post("/memories", owner, json={"name": "ci"})
        api.post("/m/ci/note", owner, json={"text": "zq-before the reporter"})
        rep = mint(api, owner, "append", "ci")
        assert api.post("/note", rep, json={"text": "zq-reported"}).json() == {"id": 1, "nap": None}
    finally:
        api.close()
    folder = data / "users" / made["user_id"]
    blob = b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file())
    assert b"zq-" not in blob
    secret = tokens.parse(rep).secret  # type: ignore[union-attr]
    ring = sqlite3.connect(folder / "m" / "ci" / "keyring.db")
    sealed = ring.execute("SELECT sealed FROM inbox").fetchone()[0]
    boxes = [r[0] for r in ring.execute("SELECT box FROM grants WHERE box IS NOT NULL")]
    ring.close()
    # Every key the token's secret could stand for opens neither its own note nor any box.
    for seed in (secret, tokens.lookup_tag(made["user_id"], secret).ljust(32, b"\0")):
        key = PrivateKey(seed)
        for box in (sealed, *boxes):
            with pytest.raises(CryptoError):
                SealedBox(key).decrypt(box)
        with pytest.raises(CryptoError):
            SealedBox(inbox_seal.private_key(seed)).decrypt(sealed)
    api = app(data, file_cipher="none")
    try:  # and a read-capable request sees it at once, at the id it was given
        assert "#1 " in api.get("/m/ci/wake", owner).text and "zq-reported" in api.get("/m/ci/wake", owner).text
    finally:
        api.close()


def test_after_deleting_b_nothing_of_b_opens_with_tokens_or_files_kept(tmp_path: Path) -> None:
    data = tmp_path / "data"
    owner, folder, toks = identity(data)
    kept = tmp_path / "kept-b"
    shutil.copytree(folder / "m" / "b", kept)
    api = app(data)
    try:
        assert api.delete("/memories/b", owner).status_code == 200
        assert not (folder / "m" / "b").exists()
        shutil.copytree(kept, folder / "m" / "b")  # put every file of B back
        for tok in (owner, toks["b"]):
            for path in ("/m/b/wake", "/wake"):
                no_b(api.get(path, tok))
        assert api.get("/m/b/wake", owner).json()["error"] == "memory.unknown"
        assert api.get("/wake", toks["b"]).status_code == 401
        assert "marker-a" in api.get("/m/a/wake", owner).text
    finally:
        api.close()


def test_a_delete_cut_after_its_rename_still_ends_the_salt(tmp_path: Path) -> None:
    """kill -9 between the delete's rename and the end of its salt, done by
    hand: the rename alone, then the app started again. The next owner action
    on memories finishes the delete, salt, name and B's capabilities' tags
    included, so B's files put back open with no token."""
    from stash.storage import memories

    data = tmp_path / "data"
    owner, folder, toks = identity(data)
    kept = tmp_path / "kept-b"
    shutil.copytree(folder / "m" / "b", kept)
    main = sqlite3.connect(folder / "keyring.db")
    assert memories.named(main) == ["a", "b"]  # what `stash restore` reads
    ring = sqlite3.connect(folder / "m" / "b" / "keyring.db")
    number = memories.number_of(ring)
    ring.close()
    memories.retire(memories.MemoryFiles(data, folder.name, "b"), number)  # the crash comes here
    main.close()
    api = app(data)
    try:
        listed = {m["name"] for m in api.get("/memories", owner).json()["memories"]}
        assert listed == {"main", "a"}
        main = sqlite3.connect(folder / "keyring.db")
        assert memories.named(main) == ["a"] and memories.salt_of(main, number) is None
        main.close()
        shutil.copytree(kept, folder / "m" / "b")
        no_b(api.get("/m/b/wake", owner))
        assert api.get("/wake", toks["b"]).status_code == 401  # its own capabilities lost their tags too
        assert "marker-a" in api.get("/m/a/wake", owner).text
    finally:
        api.close()


def test_a_delete_cut_after_its_commit_opens_nothing_before_any_sweep(tmp_path: Path) -> None:
    """kill -9 right after a delete's commit (salt, name and tags ended in
    main's key ring, memories.end) and before its rename, done by hand: B's
    folder is still in place. Before any owner action on memories, no token
    opens B, nor any copy of its files (main's key ring keeps no salt to
    derive the owner's way in); the next listing shreds the folder, and the
    name can be taken again."""
    from stash.storage import memories

    data = tmp_path / "data"
    owner, folder, toks = identity(data)
    kept = tmp_path / "kept-b"
    shutil.copytree(folder / "m" / "b", kept)
    ring = sqlite3.connect(folder / "m" / "b" / "keyring.db")
    number = memories.number_of(ring)
    ring.close()
    main = sqlite3.connect(folder / "keyring.db", isolation_level=None)
    memories.end(main, number, "b")  # the crash comes here, before the rename
    assert memories.salt_of(main, number) is None and memories.named(main) == ["a"]
    main.close()
    api = app(data)
    try:
        for tok in (owner, toks["b"]):  # first requests after the restart: no sweep has run
            for path in ("/m/b/wake", "/wake"):
                no_b(api.get(path, tok))
        assert api.get("/m/b/wake", owner).json()["error"] == "memory.unknown"
        assert api.get("/wake", toks["b"]).status_code == 401
        assert (folder / "m" / "b").is_dir()  # nothing swept it yet
        listed = {m["name"] for m in api.get("/memories", owner).json()["memories"]}
        assert listed == {"main", "a"} and not (folder / "m" / "b").exists()
        shutil.copytree(kept, folder / "m" / "b")  # every file of B put back after the sweep
        no_b(api.get("/m/b/wake", owner))
        assert api.post("/memories", owner, json={"name": "b"}).status_code == 201  # its copy shredded, a new b
        no_b(api.get("/m/b/wake", owner))
        assert "marker-a" in api.get("/m/a/wake", owner).text
    finally:
        api.close()


def test_a_fork_opens_with_none_of_the_source_grants(tmp_path: Path) -> None:
    data = tmp_path / "data"
    owner, folder, toks = identity(data)
    api = app(data)
    try:
        assert api.post("/memories/b/fork", owner, json={"name": "b2"}).status_code == 201
        assert "marker-b" in api.get("/m/b2/wake", owner).text
        resp = api.get("/m/b2/wake", toks["b"])
        assert resp.json()["error"] == "memory.unknown"
    finally:
        api.close()
    ring = sqlite3.connect(folder / "m" / "b2" / "keyring.db")
    scopes = [r[0] for r in ring.execute("SELECT scope FROM grants WHERE tag IS NOT NULL")]
    ring.close()
    assert scopes == ["owner"]  # only the owner's enrolment: no source grant was carried over


@pytest.mark.parametrize("fixture", ["release1", "release2"])
def test_every_earlier_release_upgrades_and_its_tokens_stay_bound_to_main(tmp_path: Path, fixture: str) -> None:
    data = tmp_path / "data"
    shutil.copytree(FIXTURES / fixture, data)
    if fixture == "release1":
        f1 = make_release1
        body = f"stash1_{f1.USER_ID}_{tokens._b62(int.from_bytes(f1.secret_of('owner'), 'big'), 43)}"
        owner, read = body + tokens._checksum(body), None
        rbody = f"stash1_{f1.USER_ID}_{tokens._b62(int.from_bytes(f1.secret_of('read'), 'big'), 43)}"
        read = rbody + tokens._checksum(rbody)
    else:
        owner, read = make_release2.token_of("owner"), make_release2.token_of("laptop")
    api = app(data)
    try:
        root = api.get("/wake", owner)
        assert root.status_code in (200, 409), root.text
        assert api.get("/m/main/wake", owner).text == root.text
        assert api.get("/m/main/wake", read).status_code == api.get("/wake", read).status_code
        assert api.get("/memories", owner).json()["memories"][0]["name"] == "main"
        assert api.post("/memories", owner, json={"name": "new"}).status_code == 201
        assert api.post("/m/new/note", owner, json={"text": "in the new memory"}).status_code == 200
        assert api.get("/m/new/wake", read).json()["error"] == "memory.unknown"
        assert "in the new memory" not in api.get("/wake", read).text
    finally:
        api.close()
