"""Backup, verify (with and without a token), restore from a backup, the
replication config and metrics cover every memory of an identity."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from stash.crypto import tokens
from stash.service.ops.backup import backup
from stash.service.ops.replica import REPLICATED
from stash.service.ops.verify import verify
from stash.web.metrics import memory_count
from tests.support.api import CHEAP_KDF, Api, make_settings


def _world(data: Path) -> tuple[str, str, str]:
    from stash.web.app import create_app

    api = Api(create_app(make_settings(data, kdf=CHEAP_KDF)))
    try:
        made = api.init()
        owner = made["token"]
        for name in ("a", "b"):
            api.post("/memories", owner, json={"name": name})
            api.post(f"/m/{name}/note", owner, json={"text": f"kept in {name}"})
        bound = api.post("/grants", owner, json={"scope": "read", "memory": "a"}).json()["token"]
        assert api.post("/grants", owner, json={"scope": "append", "memory": "b"}).status_code == 201
    finally:
        api.close()
    return made["user_id"], owner, bound


def test_backup_verify_and_restore_cover_every_memory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    user, owner, bound = _world(data)
    results = backup(data, tmp_path / "backup")
    assert all(c.copied for c, _ in results)
    copied = tmp_path / "backup" / "users" / user / "m"
    assert sorted(p.name for p in copied.iterdir()) == ["a", "b"]
    (report,) = verify(tmp_path / "backup")
    assert report.ok, report.problems
    # The owner's enrolment and one capability each: an append capability holds no key, and counts all the same.
    assert any(f.startswith("memory a: files ok; key ring ok (2 live capabilities") for f in report.facts), report.facts
    assert any(f.startswith("memory b: files ok; key ring ok (2 live capabilities") for f in report.facts), report.facts
    (with_owner,) = verify(tmp_path / "backup", owner)
    assert with_owner.ok and any(
        "memory b: files ok" in f and "with the token: 1 note and" in f for f in with_owner.facts
    ), with_owner.facts
    (with_bound,) = verify(tmp_path / "backup", bound)
    # Another identity's token checks this one as no token would, every memory included (found by the chaos).
    (with_stranger,) = verify(tmp_path / "backup", tokens.mint("0123456789abcdef")[0])
    assert with_stranger.ok, with_stranger.problems
    assert any("memory b" in f and "bound to another memory" in f for f in with_bound.facts)
    # The manifest lists each memory's files: a backup that lost one memory fails verify --backup, naming it.
    from stash.service.ops.backup import check_manifest

    assert check_manifest(tmp_path / "backup", required=True) == []
    lost = tmp_path / "lost"
    shutil.copytree(tmp_path / "backup", lost)
    shutil.rmtree(lost / "users" / user / "m" / "b")
    assert any("m/b/keyring.db is missing" in p for p in check_manifest(lost, required=True))
    # A restore is the backup copied back: every memory answers again.
    shutil.rmtree(data)
    shutil.copytree(tmp_path / "backup", data)
    from stash.web.app import create_app

    api = Api(create_app(make_settings(data, kdf=CHEAP_KDF)))
    try:
        for name in ("a", "b"):
            assert f"kept in {name}" in api.get(f"/m/{name}/wake", owner).text
        assert "kept in a" in api.get("/wake", bound).text
    finally:
        api.close()
    # Damage in one memory is named by verify.
    ring = sqlite3.connect(data / "users" / user / "m" / "b" / "keyring.db")
    ring.execute("UPDATE keyring_meta SET value = 'someone-else' WHERE name = 'user_id'")
    ring.commit()
    ring.close()
    (bad,) = verify(data)
    assert not bad.ok and any(p.startswith("memory b:") for p in bad.problems)


def test_replication_and_metrics_cover_every_memory(tmp_path: Path) -> None:
    import fnmatch

    data = tmp_path / "data"
    user, _, _ = _world(data)
    # The replicated pattern is matched recursively under users/, so each memory's two files are in it.
    files = [
        p for p in (data / "users" / user).rglob("*.db") if any(fnmatch.fnmatch(p.name, name) for name in REPLICATED)
    ]
    assert {p.relative_to(data / "users" / user).as_posix() for p in files} >= {
        "keyring.db",
        "memory.db",
        "m/a/keyring.db",
        "m/a/memory.db",
        "m/b/keyring.db",
        "m/b/memory.db",
    }
    assert memory_count(data) == 3


def test_a_sweep_leaves_a_create_still_building_and_removes_a_crashed_one(tmp_path: Path) -> None:
    """A sweep (every owner action on memories runs one) must not remove the
    staging folder of a create or fork another request is still building;
    one left by a crash, an hour old, goes."""
    import os

    from stash.storage import memories

    data = tmp_path / "data"
    user, owner, _ = _world(data)
    building = memories.staging(data, user, "c")
    from stash.web.app import create_app

    api = Api(create_app(make_settings(data, kdf=CHEAP_KDF)))
    try:
        assert api.get("/memories", owner).status_code == 200  # sweeps
        assert building.folder.is_dir()
        os.utime(building.folder, (0, 0))  # as a crash would leave it, long ago
        assert api.get("/memories", owner).status_code == 200
        assert not building.folder.exists()
    finally:
        api.close()


def test_an_extra_empty_memory_costs_at_most_32_kib_once_used(tmp_path: Path) -> None:
    """Issue 28's cost: every extra empty memory, the first included,
    created, listed and woken by its owner, adds at most 32 KiB to its
    identity's files (a folder counted as one 4 KiB block). The first also
    makes the m/ folder and main's key ring's table of salts and names, and
    its `create` event is the identity's first audit row (docs/DESIGN.md,
    "Memories"); its memory file is two pages, its tables made by their first
    write (schema.sql, "Pages"). Measured from an identity whose owner token
    has been used once: that first request records the token's last use
    (main's grant_notes table, one page), whatever it asks for."""
    from stash.web.app import create_app

    data = tmp_path / "data"
    api = Api(create_app(make_settings(data, kdf=CHEAP_KDF)))

    def cost(folder: Path) -> int:
        return sum(p.stat().st_size if p.is_file() else 4096 for p in folder.rglob("*"))

    try:
        made = api.init()
        owner, folder = made["token"], data / "users" / made["user_id"]
        assert api.get("/wake", owner).status_code == 200  # the owner's first use, before any memory
        sizes = []
        for name in ("first", "second", "third"):
            before = cost(folder)
            assert api.post("/memories", owner, json={"name": name}).status_code == 201
            assert api.get("/memories", owner).status_code == 200
            assert api.get(f"/m/{name}/wake", owner).status_code == 200
            sizes.append(cost(folder) - before)
    finally:
        api.close()
    assert max(sizes) <= 32 * 1024, sizes


def test_restore_reads_only_valid_names_with_a_salt_from_main(tmp_path: Path) -> None:
    """What `stash restore` brings back is what main's key ring names: a
    crafted name (a path, main, a reserved word) or a name whose salt is
    gone (a deleted memory) is passed over, never turned into a folder."""
    from stash.storage import memories

    data = tmp_path / "data"
    user, _, _ = _world(data)
    ring = sqlite3.connect(data / "users" / user / "keyring.db")
    assert memories.named(ring) == ["a", "b"]
    top = ring.execute("SELECT max(number) FROM memory_salts").fetchone()[0]
    for k, name in enumerate(("../../x", "main", "erase", "UPPER", "a"), start=top + 1):
        ring.execute("INSERT INTO memory_salts(number, salt, name) VALUES (?, ?, ?)", (k, b"\0" * 32, name))
    # A salt cut short is no salt (salt_of refuses it): its name is passed over too.
    ring.execute("INSERT INTO memory_salts(number, salt, name) VALUES (?, x'00', 'shortsalt')", (top + 99,))
    ring.commit()
    assert memories.named(ring) == ["a", "b"]
    ring.close()


def test_verify_without_a_token_names_a_memory_file_put_back_from_before(tmp_path: Path) -> None:
    """On a plain-file host, a memory's memory.db put back from before its
    last note is named by verify without a token, as main's would be (the
    key ring's copy of the head is ahead of the file)."""
    from stash.web.app import create_app

    data = tmp_path / "data"
    api = Api(create_app(make_settings(data, kdf=CHEAP_KDF, file_cipher="none")))
    try:
        made = api.init()
        owner = made["token"]
        api.post("/memories", owner, json={"name": "a"})
        api.post("/m/a/note", owner, json={"text": "a first line"})
        folder = data / "users" / made["user_id"] / "m" / "a"
        before = (folder / "memory.db").read_bytes()
        assert api.post("/m/a/note", owner, json={"text": "a later line"}).status_code == 200
    finally:
        api.close()
    (fine,) = verify(data)
    assert fine.ok, fine.problems
    (folder / "memory.db").write_bytes(before)
    for side in ("-wal", "-shm"):
        (folder / f"memory.db{side}").unlink(missing_ok=True)
    (rolled,) = verify(data)
    assert any(p.startswith("memory a: ") and "rolled back" in p for p in rolled.problems), rolled


def test_a_create_cut_before_its_rename_leaves_no_name_a_restore_would_take(tmp_path: Path) -> None:
    """kill -9 of a create after main's key ring took its salt and before
    the rename, done by hand: main's key ring names nothing for it (a
    restore would otherwise look for a memory no replica holds, and say the
    identity came back incomplete). The create made afterwards is named
    once; deleted, it is named no more."""
    from stash.storage import memories
    from stash.web.app import create_app

    data = tmp_path / "data"
    user, owner, _ = _world(data)
    ring = sqlite3.connect(data / "users" / user / "keyring.db")
    memories.new_salt(ring, memories.next_number(ring))  # the crash comes here
    assert memories.named(ring) == ["a", "b"]
    ring.close()
    api = Api(create_app(make_settings(data, kdf=CHEAP_KDF)))
    try:
        assert api.post("/memories", owner, json={"name": "x"}).status_code == 201
        ring = sqlite3.connect(data / "users" / user / "keyring.db")
        assert ring.execute("SELECT count(*) FROM memory_salts WHERE name = 'x'").fetchone()[0] == 1
        assert api.delete("/memories/x", owner).status_code == 200
        assert memories.named(ring) == ["a", "b"]
        ring.close()
    finally:
        api.close()


def test_a_create_cut_after_its_rename_is_named_when_resent(tmp_path: Path) -> None:
    """kill -9 of a create between its rename and its name in main's key
    ring, done by hand (the name row removed): the resend, answered 409
    memory.exists, names it, so a restore brings it back."""
    from stash.storage import memories
    from stash.web.app import create_app

    data = tmp_path / "data"
    user, owner, _ = _world(data)
    ring = sqlite3.connect(data / "users" / user / "keyring.db")
    ring.execute("UPDATE memory_salts SET name = NULL WHERE name = 'b'")  # the crash came before the naming
    ring.commit()
    assert memories.named(ring) == ["a"]
    api = Api(create_app(make_settings(data, kdf=CHEAP_KDF)))
    try:
        assert api.post("/memories", owner, json={"name": "b"}).json()["error"] == "memory.exists"
    finally:
        api.close()
    assert memories.named(ring) == ["a", "b"]
    ring.close()
