"""``stash verify`` names what it does not know, never materialises a sparse
or oversized file, and fails a backup that is not whole (storage/layout.py,
service/ops/verify.py, service/ops/backup.py), on real stores."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stash.service.ops.backup import MANIFEST, backup
from tests.support.ops.verify import Store, line_of, run


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "data", "none")


@pytest.mark.parametrize("dropped", ["kitten.db", "memory.db.evil.db", "nested/memory.db"])
def test_a_file_dropped_into_a_user_folder_is_named(capsys, store: Store, dropped: str):
    path = store.folder / dropped
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"SQLite format 3\x00" + b"\x00" * 84)
    code, text = run(capsys, store.data)
    assert code == 1
    line = line_of(text, store.user_id)
    shown = dropped.split("/")[0] + ("/" if "/" in dropped else "")
    assert "FAIL" in line and "not Stash's" in line and repr(shown) in line


def test_a_folder_that_is_no_user_is_named(capsys, store: Store):
    stray = store.data / "users" / "not-a-user"
    stray.mkdir()
    (stray / "keyring.db").write_bytes(b"x")
    code, text = run(capsys, store.data)
    assert code == 1 and "users/  FAIL" in text and "'not-a-user/'" in text
    assert f"{store.user_id}  ok" in text


def test_a_sparse_wal_is_copied_as_holes_and_an_oversized_one_is_refused(
    capsys, store: Store, tmp_path: Path, monkeypatch
):
    wal = store.folder / "memory.db-wal"
    with open(wal, "wb") as f:
        f.truncate(3 << 30)  # 3 GiB that use no block
    seen: list[int] = []
    import stash.service.ops.verify as verify

    real = verify.copy_allocated

    def watched(src: Path, dst: Path) -> None:
        real(src, dst)
        seen.append(os.stat(dst).st_blocks * 512)

    monkeypatch.setattr(verify, "copy_allocated", watched)
    monkeypatch.setenv("STASH_QUOTA_BYTES", str(4 << 30))
    code, text = run(capsys, store.data)
    assert seen and max(seen) < 1 << 20  # the copy took no more disk than the source's data
    assert "memory.db-wal is not a SQLite write-ahead log" in line_of(text, store.user_id)
    monkeypatch.setenv("STASH_QUOTA_BYTES", str(1 << 20))
    code, text = run(capsys, store.data)
    assert code == 1
    assert "memory.db-wal is 3,221,225,472 bytes, more than any store's file can be" in line_of(text, store.user_id)


def test_a_backup_is_whole_or_verify_says_what_is_missing(capsys, tmp_path: Path):
    data = tmp_path / "data"
    stores = [Store(data, "none", n=2) for _ in range(3)]
    dest = tmp_path / "backup"
    results = backup(data, dest)
    assert all(c.copied for c, _ in results)
    manifest = json.loads((dest / MANIFEST).read_text())
    assert manifest["complete"] is True and set(manifest["users"]) == {s.user_id for s in stores}
    assert run(capsys, dest)[0] == 0
    assert run(capsys, dest, backup=True)[0] == 0
    # A user removed from the finished backup, or a file cut: named.
    gone = dest / "users" / stores[1].user_id
    (gone / "memory.db").rename(tmp_path / "kept.db")
    code, text = run(capsys, dest)
    assert code == 1 and f"{stores[1].user_id}'s memory.db is missing (backup.json lists it)" in text
    (tmp_path / "kept.db").rename(gone / "memory.db")
    # As a killed backup leaves it: the manifest still incomplete.
    manifest["complete"] = False
    (dest / MANIFEST).write_text(json.dumps(manifest))
    code, text = run(capsys, dest)
    assert code == 1 and "the backup never finished" in text
    # Unmarked: only --backup can tell it from a data folder.
    (dest / MANIFEST).unlink()
    assert run(capsys, dest)[0] == 0
    code, text = run(capsys, dest, backup=True)
    assert code == 1 and "it has no backup.json" in text


def test_the_users_lock_is_free_while_verify_copies(capsys, store: Store, monkeypatch):
    """The copy is taken between two moments under the lock, not under it:
    a request (here, the lock taken exclusive from another open file) gets
    the lock while the copy runs."""
    import stash.service.ops.verify as verify
    from stash.storage import userlock

    real = verify.copy_allocated
    free: list[bool] = []

    def watched(src: Path, dst: Path) -> None:
        with userlock.exclusive_within(store.folder, 0.5) as held:
            free.append(held)
        real(src, dst)

    monkeypatch.setattr(verify, "copy_allocated", watched)
    code, text = run(capsys, store.data)
    assert code == 0, text
    assert free and all(free)


def test_a_side_file_gone_between_the_listing_and_its_look_is_not_named(monkeypatch, tmp_path: Path):
    """A live server with files kept closed removes a key ring's -wal and
    -shm at its last close, which can fall between verify's listing of the
    folder and its look at each name (found by the migrate-beside-a-server
    test): a name that is gone by then is nothing to report. A file that is
    there and not Stash's still is."""
    from stash.storage import layout

    folder = tmp_path / "user"
    folder.mkdir()
    for name in ("keyring.db", "memory.db", "kitten.db"):
        (folder / name).write_bytes(b"")
    listed = Path.iterdir

    def listing_then_gone(self: Path):
        yield from listed(self)
        if self == folder:
            yield folder / "keyring.db-wal"  # listed, then removed before it was looked at
            yield folder / "keyring.db-shm"

    monkeypatch.setattr(Path, "iterdir", listing_then_gone)
    assert layout.unknown_in_user(folder) == ["kitten.db"]


def test_a_user_written_to_during_every_copy_is_verified_under_the_lock(capsys, store: Store, monkeypatch):
    """Agents noting without a pause change the files during each copy made
    between the two moments; verify then makes its last copy with the lock
    held throughout (as stash backup copies), rather than fail the user.
    Here a real note lands whenever the lock is free while a file is copied."""
    import stash.service.ops.verify as verify
    from stash.storage import userlock

    real = verify.copy_allocated
    wrote: list[bool] = []

    def written_meanwhile(src: Path, dst: Path) -> None:
        with userlock.exclusive_within(store.folder, 0.05) as free:
            pass
        if free:
            store.note(1)
        wrote.append(free)
        real(src, dst)

    monkeypatch.setattr(verify, "copy_allocated", written_meanwhile)
    code, text = run(capsys, store.data)
    assert code == 0, text
    assert "memory file ok" in line_of(text, store.user_id)
    assert any(wrote) and not wrote[-1]  # written to during the first copies; the last made under the lock
