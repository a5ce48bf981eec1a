"""``stash migrate --file-cipher none``: every memory of every user moves from
SQLCipher files to plain ones with nothing lost and every row still sealed,
checked as ``stash verify`` checks; a memory no given token opens, or one a
running server keeps open, is left whole and reported; a move stopped after
its commit is finished by the next open (storage/cipher_swap.py)."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from stash.cli.main import main
from stash.cli.operate import INCOMPLETE
from stash.service import memories as memory_routes
from stash.service.access import Vault
from stash.service.ops import replica
from stash.service.ops.migrate import migrate
from stash.service.ops.replica import file_cipher
from stash.storage import cipher_swap, userlock
from stash.storage.memfile import FileKeys
from stash.storage.sqlite.connections import available_file_cipher
from stash.web.app import create_app
from tests.support.api import CHEAP_KDF, Api, make_settings

pytestmark = pytest.mark.skipif(available_file_cipher() != "sqlcipher", reason="needs SQLCipher to make old stores")

PLAIN_HEADER = b"SQLite format 3\x00"


def header(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(16)


def identity(vault: Vault, notes: int = 4, others: tuple[str, ...] = ("work", "home")) -> tuple[str, str]:
    """A SQLCipher identity with notes in main and in each other memory."""
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        for k in range(notes):
            s.open_memory().note(f"main osprey {k}")
        for name in others:
            memory_routes.create(vault, s, name)
    for name in others:
        with vault.session(ident.token, "full", memory=name) as s:
            for k in range(notes):
                s.open_memory().note(f"{name} heron {k}")
    return ident.user_id, ident.token


def folders(data: Path, user_id: str) -> list[Path]:
    user = data / "users" / user_id
    return [user, *sorted(p for p in (user / "m").iterdir())]


@pytest.fixture
def vault(tmp_path: Path) -> Vault:
    return Vault(tmp_path / "data", kdf=CHEAP_KDF, file_cipher="sqlcipher")


def run(
    capsys, argv: list[str], token: str | None = None, stdin: str | None = None, monkeypatch=None
) -> tuple[int, str]:
    if token is not None:
        monkeypatch.setenv("STASH_TOKEN", token)
    else:
        monkeypatch.delenv("STASH_TOKEN", raising=False)
    if stdin is not None:
        import io

        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(["migrate", *argv])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_every_memory_of_an_identity_moves_to_plain_files_with_nothing_lost(vault, capsys, monkeypatch):
    data = vault.data_dir
    user_id, token = identity(vault)
    before = {name: _read(vault, token, name) for name in ("main", "work", "home")}
    assert all(header(f / "memory.db") != PLAIN_HEADER for f in folders(data, user_id))
    code, out = run(capsys, ["--data", str(data), "--file-cipher", "none"], token, monkeypatch=monkeypatch)
    assert code == 0, out
    assert token.split("_")[2] not in out and str(data) not in out
    assert out.count("  converted") == 3 and f"{user_id}  ok" in out, out
    assert "with the token: 4 notes and" in out and "memory work: files ok" in out, out
    for f in folders(data, user_id):
        assert header(f / "memory.db") == PLAIN_HEADER, f
        assert stat.S_IMODE(os.stat(f / "memory.db").st_mode) == 0o600
        assert not (f / cipher_swap.NEXT).exists()
        ring = sqlite3.connect(f / "keyring.db")
        assert ring.execute("SELECT value FROM keyring_meta WHERE name = 'file_cipher'").fetchone() == ("none",)
        ring.close()
    assert file_cipher(data / "users" / user_id) == "none"  # what stash replicate reads: streamed now
    assert {name: _read(vault, token, name) for name in before} == before
    # The rows are still sealed: no note's text is in the plain file.
    assert b"osprey" not in (data / "users" / user_id / "memory.db").read_bytes()
    # Writes go on, on the plain files; a second run finds nothing to do.
    with vault.session(token, "full", memory="work") as s:
        s.open_memory().note("after the move")
    code, out = run(capsys, ["--data", str(data), "--file-cipher", "none"], monkeypatch=monkeypatch)
    assert code == 0 and out.count("  plain") == 3 and "0 converted, 3 already plain" in out, out
    assert main(["verify", str(data)]) == 0


def _read(vault: Vault, token: str, name: str) -> list[str]:
    """Every memory's text, each row opened and authenticated."""
    with vault.session(token, "read", memory=name) as s:
        mf = s.open_memory().mf
        return [line.split(" ", 2)[2] for batch in mf.scan(mf.head.count) for line in batch]


def test_without_a_token_that_opens_it_a_memory_is_left_whole_and_the_run_fails(vault, capsys, monkeypatch):
    data = vault.data_dir
    mine, token = identity(vault, notes=2, others=("work",))
    theirs, their_token = identity(vault, notes=2, others=())
    # Only the first identity's token is given, on standard input (never on the command line).
    code, out = run(
        capsys,
        ["--data", str(data), "--file-cipher", "none", "--tokens", "-"],
        stdin=f"{token}\n",
        monkeypatch=monkeypatch,
    )
    assert code == INCOMPLETE, out
    assert f"{theirs}  main  left  no token given opens it" in out, out
    assert "1 left as SQLCipher" in out and "2 converted" in out, out
    assert header(data / "users" / theirs / "memory.db") != PLAIN_HEADER
    assert _read(vault, their_token, "main") == ["main osprey 0", "main osprey 1"]
    assert [header(f / "memory.db") == PLAIN_HEADER for f in folders(data, mine)] == [True, True]


def test_a_capability_bound_to_one_memory_converts_that_memory_only(vault, capsys, monkeypatch):
    data = vault.data_dir
    user_id, owner = identity(vault, notes=2, others=("work",))
    with vault.session(owner, "owner", memory="work") as s:
        _, reader = vault.mint_grant(s, "read")
    code, out = run(capsys, ["--data", str(data), "--file-cipher", "none"], reader, monkeypatch=monkeypatch)
    assert code == INCOMPLETE, out
    assert f"{user_id}  work  converted" in out and f"{user_id}  main  left" in out, out
    assert header(data / "users" / user_id / "m" / "work" / "memory.db") == PLAIN_HEADER
    assert header(data / "users" / user_id / "memory.db") != PLAIN_HEADER
    assert _read(vault, owner, "work") == ["work heron 0", "work heron 1"]
    assert _read(vault, owner, "main") == ["main osprey 0", "main osprey 1"]


def test_a_file_a_running_server_keeps_open_is_left_until_it_lets_go(tmp_path, capsys, monkeypatch):
    data = tmp_path / "data"
    api = Api(create_app(make_settings(data, file_cipher="sqlcipher", kdf=CHEAP_KDF, keep_open=60.0)))
    try:
        token = api.init()["token"]
        assert api.post("/note", token, json={"text": "kept open by the server"}).status_code == 200
        user = data / "users" / token.split("_")[1]
        assert (user / "memory.db-shm").exists()  # the server's worker holds the file between requests
        (result,) = migrate(data, [token], wait=0.3)
        assert [m.outcome for m in result.memories] == ["left"], result
        assert "keeps its files open" in result.memories[0].note
        assert header(user / "memory.db") != PLAIN_HEADER and not (user / cipher_swap.NEXT).exists()
        assert api.post("/note", token, json={"text": "still served"}).status_code == 200
    finally:
        api.close()  # the server stops: its files close
    (result,) = migrate(data, [token], wait=0.3)
    assert [m.outcome for m in result.memories] == ["converted"] and result.report and result.report.ok
    api = Api(create_app(make_settings(data, kdf=CHEAP_KDF, keep_open=60.0)))
    try:
        wake = api.get("/wake", token)
        assert wake.status_code == 200 and "still served" in wake.text and "kept open" in wake.text
        assert api.post("/note", token, json={"text": "on plain files"}).status_code == 200
        found = api.post("/recall", token, json={"q": "served"})
        assert found.status_code == 200 and "still served" in found.text, found.text
    finally:
        api.close()


def test_a_move_stopped_after_its_commit_is_finished_by_the_next_open(vault):
    """The state a kill leaves between the key ring's commit and the rename:
    the key ring says none, memory.db is still the SQLCipher file, the plain
    copy waits beside it. The next request opens the plain one."""
    data = vault.data_dir
    user_id, token = identity(vault, notes=3, others=())
    folder = data / "users" / user_id
    before = _read(vault, token, "main")
    with vault.session(token, "read") as s:
        fk = FileKeys.derive(s.files.memory, user_id, s.keys, "sqlcipher", s.page_bytes)
        with userlock.exclusive(folder):
            assert fk.file_key is not None
            cipher_swap._export(folder / "memory.db", folder / cipher_swap.NEXT, fk.file_key, s.page_bytes)
            s.keyring.conn.execute("UPDATE keyring_meta SET value = 'none' WHERE name = 'file_cipher'")
    assert header(folder / "memory.db") != PLAIN_HEADER and cipher_swap.pending(folder)
    assert _read(vault, token, "main") == before
    assert header(folder / "memory.db") == PLAIN_HEADER and not cipher_swap.pending(folder)
    with vault.session(token, "full") as s:
        s.open_memory().note("after")
    assert main(["verify", str(data)]) == 0


def test_a_copy_left_before_the_commit_is_discarded_and_the_move_redone(vault, capsys, monkeypatch):
    data = vault.data_dir
    user_id, token = identity(vault, notes=2, others=())
    folder = data / "users" / user_id
    (folder / cipher_swap.NEXT).write_bytes(b"half a copy")  # a kill during the export
    assert _read(vault, token, "main") == ["main osprey 0", "main osprey 1"]  # served from the old file
    code, out = run(capsys, ["--data", str(data), "--file-cipher", "none"], token, monkeypatch=monkeypatch)
    assert code == 0, out
    assert header(folder / "memory.db") == PLAIN_HEADER and not cipher_swap.pending(folder)
    assert _read(vault, token, "main") == ["main osprey 0", "main osprey 1"]


def test_the_replica_roster_lists_a_migrated_store_as_plain(vault, capsys, monkeypatch):
    """stash replicate's roster (what stash restore reads) follows the move
    at its next start, instead of keeping the first cipher it saw."""
    data = vault.data_dir
    user_id, token = identity(vault, notes=1, others=())
    assert replica.update_roster(data, set()) == [(user_id, "sqlcipher")]
    assert run(capsys, ["--data", str(data), "--file-cipher", "none"], token, monkeypatch=monkeypatch)[0] == 0
    assert replica.update_roster(data, set()) == [(user_id, "none")]
    assert replica.roster_users(data / replica.ROSTER) == [(user_id, "none")]


def test_a_revoked_token_given_first_does_not_stop_the_owners(vault, capsys, monkeypatch):
    data = vault.data_dir
    user_id, owner = identity(vault, notes=1, others=())
    with vault.session(owner, "owner") as s:
        grant_id, revoked = vault.mint_grant(s, "read")
        vault.revoke_grant(s, grant_id)
    code, out = run(
        capsys,
        ["--data", str(data), "--file-cipher", "none", "--tokens", "-"],
        stdin=f"{revoked}\n{owner}\n",
        monkeypatch=monkeypatch,
    )
    assert code == 0 and f"{user_id}  main  converted" in out, out
