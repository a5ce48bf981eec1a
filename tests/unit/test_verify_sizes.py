"""``stash verify`` sees what the server sees: every recorded copy of the
state against its file, every size it can check, on real stores damaged by
hand (cut to 0 bytes, cut in half, a WAL that is not one, the key ring's copy
of the state version put ahead of or behind the file's). And verify itself
never writes into a file it finds damaged."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from stash.core.errors import Damaged
from stash.storage.keyring import STATE_COPY, state_copies
from stash.storage.sqlite.transactions import write_transaction
from tests.support.ops.verify import Store, line_of, run

MANY = 300  # enough sealed rows that a quarter of the file cannot hold them


def imported(data: Path, cipher: str, n: int = MANY) -> Store:
    store = Store(data, cipher, n=0)
    today = datetime.now(UTC).date().isoformat()
    with store.vault.session(store.token, "full") as s:
        s.open_memory().import_entries([{"date": today, "text": f"godwit {k} " + "w" * 100} for k in range(n)])
    return store


def state_copy(store: Store) -> int:
    conn = sqlite3.connect(store.folder / "keyring.db")
    try:
        return int(conn.execute("SELECT value FROM keyring_meta WHERE name = ?", (STATE_COPY,)).fetchone()[0])
    finally:
        conn.close()


def set_state_copy(store: Store, value: int) -> None:
    """The copy set to ``value`` and sealed, as a server holding the key
    would leave it (a copy edited by hand fails its MAC: storage/keyring/state_copies.py)."""
    with store.vault.session(store.token, "read") as s:
        chain = s.keys
    conn = sqlite3.connect(store.folder / "keyring.db", isolation_level=None)
    try:
        with write_transaction(conn):
            state_copies.put(conn, store.user_id, chain, {STATE_COPY: str(value)})
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def test_a_memory_file_cut_to_0_bytes_fails_and_stays_0_bytes(capsys, tmp_path: Path, file_cipher: str) -> None:
    a, b = Store(tmp_path / "data", file_cipher), Store(tmp_path / "data", file_cipher)
    path = a.folder / "memory.db"
    path.write_bytes(b"")
    for token in (None, a.token, None):
        code, text = run(capsys, a.data, token)
        assert code == 1
        assert "FAIL" in line_of(text, a.user_id)
        assert path.stat().st_size == 0  # the check with the token opened nothing that wrote into it
    assert "FAIL" not in line_of(text, b.user_id)


def test_a_memory_file_cut_to_a_quarter_fails_without_a_token(capsys, tmp_path: Path, file_cipher: str) -> None:
    """Without the key, verify counts each memory at the smallest bucket a
    sealed row can have (deploy/README.md, "stash verify"): these rows are
    about three times that, so a cut to a quarter is below the floor."""
    a = imported(tmp_path / "data", file_cipher)
    path = a.folder / "memory.db"
    code, text = run(capsys, a.data)
    assert code == 0, text
    pages = path.stat().st_size // 4096
    with open(path, "r+b") as f:
        f.truncate(pages // 4 * 4096)  # still a whole number of pages
    code, text = run(capsys, a.data)
    assert code == 1
    assert "cut short" in line_of(text, a.user_id), text
    code, text = run(capsys, a.data, a.token)
    assert code == 1 and "FAIL" in line_of(text, a.user_id)


def test_a_key_ring_cut_to_its_first_pages_fails(capsys, tmp_path: Path) -> None:
    a = Store(tmp_path / "data", "none")
    path = a.folder / "keyring.db"
    size = path.stat().st_size
    assert size > 4096
    with open(path, "r+b") as f:
        f.truncate(size - 4096)
    code, text = run(capsys, a.data)
    assert code == 1
    assert "keyring.db" in line_of(text, a.user_id) and "FAIL" in line_of(text, a.user_id)


def test_a_wal_that_is_not_one_fails(capsys, tmp_path: Path, file_cipher: str) -> None:
    a = Store(tmp_path / "data", file_cipher)
    (a.folder / "memory.db-wal").write_bytes(b"\x00" * 4000)
    code, text = run(capsys, a.data)
    assert code == 1
    assert "write-ahead log" in line_of(text, a.user_id)


def test_the_key_rings_state_copy_ahead_of_the_file_fails_as_the_server_refuses_it(
    capsys, tmp_path: Path, file_cipher: str
) -> None:
    a, b = Store(tmp_path / "data", file_cipher), Store(tmp_path / "data", file_cipher)
    set_state_copy(a, state_copy(a) + 1)
    if file_cipher == "none":
        code, text = run(capsys, a.data)
        assert code == 1
        assert "state version" in line_of(text, a.user_id)
    code, text = run(capsys, a.data, a.token)
    assert code == 1
    line = line_of(text, a.user_id)
    assert "FAIL" in line and ("older copy" in line or "rolled back" in line), text
    assert "FAIL" not in line_of(text, b.user_id)


def test_the_key_rings_state_copy_behind_the_file_passes_and_is_said(capsys, tmp_path: Path, file_cipher: str) -> None:
    a = Store(tmp_path / "data", file_cipher)
    set_state_copy(a, state_copy(a) - 1)
    code, text = run(capsys, a.data)
    assert code == 0, text
    if file_cipher == "none":
        assert "behind" in line_of(text, a.user_id)
    code, text = run(capsys, a.data, a.token)
    assert code == 0, text


@pytest.mark.parametrize("row", ["state", "log_head"])
def test_a_deleted_head_is_refused_and_not_written_again(capsys, tmp_path: Path, file_cipher: str, row: str) -> None:
    """A file whose authenticated head (state) or running digest (log_head)
    was deleted was once taken for one written before they existed, and got
    a new one written into it: the damage was both served and erased."""
    a = Store(tmp_path / "data", file_cipher)
    with a.raw() as conn:
        conn.execute("DELETE FROM meta WHERE name = ?", (row,))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    path = a.folder / "memory.db"
    evidence = path.read_bytes()
    with pytest.raises(Damaged), a.vault.session(a.token, "read") as s:
        s.open_memory().wake()
    assert path.read_bytes() == evidence
    code, text = run(capsys, a.data, a.token)
    assert code == 1 and "FAIL" in line_of(text, a.user_id)
    assert path.read_bytes() == evidence
