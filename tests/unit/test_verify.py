"""``stash verify`` on real stores, good and damaged by hand: it passes good
ones, fails the damaged user by id (never a path or a secret), and says
which check failed; without a token it catches what needs no key, with one
everything — in main and in a second memory alike."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from stash.storage.formats import PAGE_BYTES
from tests.support.memories import Memory
from tests.support.ops.verify import Store, line_of, run


@pytest.fixture
def pair(tmp_path: Path, file_cipher: str, memory: Memory) -> tuple[Store, Store]:
    """Two identities whose ``memory`` holds six notes each."""
    data = tmp_path / "data"
    return Store(data, file_cipher, memory=memory), Store(data, file_cipher, memory=memory)


def test_good_stores_pass_with_and_without_a_token(capsys, pair):
    a, b = pair
    code, text = run(capsys, a.data)
    assert code == 0, text
    assert "ok" in line_of(text, a.user_id) and "ok" in line_of(text, b.user_id)
    # The owner, and a capability of the memory: each checks the memory whole.
    for token in (a.token, a.reader):
        code, text = run(capsys, a.data, token)
        assert code == 0, text
        assert "with the token: 6 notes and" in line_of(text, a.user_id)


def test_a_log_cut_short_fails(capsys, pair):
    a, b = pair
    with a.raw() as conn:
        conn.execute("DELETE FROM log WHERE id >= 4")
    if a.cipher == "none":  # a plain file shows it without a key
        code, text = run(capsys, a.data)
        assert code == 1
        assert "FAIL" in line_of(text, a.user_id) and "cut short" in line_of(text, a.user_id)
        assert "ok" in line_of(text, b.user_id)
    code, text = run(capsys, a.data, a.token)
    assert code == 1
    assert "FAIL" in line_of(text, a.user_id)
    assert "FAIL" not in line_of(text, b.user_id)


def test_a_flipped_byte_in_the_memory_file_fails_with_the_token(capsys, pair):
    a, _ = pair
    path = a.folder / "memory.db"
    data = bytearray(path.read_bytes())
    if a.cipher == "sqlcipher":
        pos = 2 * PAGE_BYTES + 500  # inside page 3, the log's (schema.sql, "Pages")
    else:
        with a.raw() as conn:
            (sealed,) = conn.execute("SELECT sealed FROM log WHERE id = 2").fetchone()
        pos = bytes(data).index(sealed) + 60
    data[pos] ^= 0x01
    path.write_bytes(bytes(data))
    code, text = run(capsys, a.data, a.token)
    assert code == 1
    assert "FAIL" in line_of(text, a.user_id)


def test_an_encrypted_file_cut_mid_page_fails_without_a_token(capsys, tmp_path: Path, memory: Memory):
    a = Store(tmp_path / "data", "sqlcipher", memory=memory)
    path = a.folder / "memory.db"
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)
    code, text = run(capsys, a.data)
    assert code == 1
    assert "pages" in line_of(text, a.user_id) and "FAIL" in line_of(text, a.user_id)


def test_a_rolled_back_memory_file_fails(capsys, pair, tmp_path: Path):
    a, b = pair
    old = tmp_path / "old-memory.db"
    shutil.copyfile(a.folder / "memory.db", old)
    a.note(4)
    for suffix in ("-wal", "-shm"):
        (a.folder / f"memory.db{suffix}").unlink(missing_ok=True)
    shutil.copyfile(old, a.folder / "memory.db")
    if a.cipher == "none":
        code, text = run(capsys, a.data)
        assert code == 1
        assert "rolled back" in line_of(text, a.user_id)
    code, text = run(capsys, a.data, a.token)
    assert code == 1
    assert "FAIL" in line_of(text, a.user_id)
    assert "FAIL" not in line_of(text, b.user_id)


def test_a_missing_memory_file_fails(capsys, pair):
    a, _ = pair
    (a.folder / "memory.db").unlink()
    code, text = run(capsys, a.data)
    assert code == 1
    assert "memory.db is missing" in line_of(text, a.user_id)


def test_a_folder_that_is_not_a_data_folder_is_a_usage_error(capsys, tmp_path: Path):
    code, text = run(capsys, tmp_path)
    assert code == 2
    assert "users folder" in text


def _files(data: Path) -> dict[str, bytes]:
    return {str(p.relative_to(data)): p.read_bytes() for p in sorted(data.rglob("*")) if p.is_file()}


def test_verify_with_a_token_leaves_every_file_as_it_was(capsys, tmp_path: Path) -> None:
    """Opening a store with its key may upgrade an older format, record the
    grant's use, and closing a connection checkpoints and deletes the WAL:
    verify does all that to a copy. A release1 store (whose key ring its
    first open upgrades), a current one and one with a WAL left by a crash
    keep every byte, with and without a token, and no file appears beside
    them."""
    from stash.crypto import tokens
    from tests.fixtures import make_release1 as release1

    old = tmp_path / "old"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "release1", old)
    body = f"stash1_{release1.USER_ID}_{tokens._b62(int.from_bytes(release1.secret_of('owner'), 'big'), 43)}"
    current = Store(tmp_path / "new", "none")
    # A store as a crash leaves it: its memory file's WAL holds committed notes no checkpoint moved yet.
    crashed = tmp_path / "crashed" / "users" / current.user_id
    crashed.mkdir(parents=True)
    with current.vault.session(current.token, "full") as s:
        s.open_memory().note("after the last checkpoint")
        for name in ("keyring.db", "memory.db", "memory.db-wal"):
            shutil.copyfile(current.folder / name, crashed / name)
    assert (crashed / "memory.db-wal").stat().st_size > 0
    for data, token in (
        (old, body + tokens._checksum(body)),
        (current.data, current.token),
        (crashed.parent.parent, current.token),
    ):
        before = _files(data)
        for given in (None, token):
            code, text = run(capsys, data, given)
            assert code == 0, text
            assert _files(data) == before
        assert "all authenticate" in text
    # The formats said are those of the files as they are, not of what an open makes of them: release1
    # predates the authenticated state that its first open writes.
    code, text = run(capsys, old, body + tokens._checksum(body))
    assert "memory file: SQLCipher, format 2" in text and "authenticated state" not in text
