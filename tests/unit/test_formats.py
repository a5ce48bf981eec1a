"""The registry of on-disk formats (stash/storage/formats.py): in release
order, each handler real, every format a new store and the release fixtures
are at named by it, the older stores opening through its upgrade steps, and
`stash verify` naming each user's formats. What a store is at is read from
its files with SQLite (page size, row lengths, format marks), never taken
from the code under test."""

from __future__ import annotations

import importlib
import shutil
import sqlite3
from pathlib import Path

from stash.crypto import aead, tokens
from stash.service.access import Vault
from stash.storage import formats
from stash.storage.keyring import Keyring
from stash.storage.memfile import MemoryFile
from tests.fixtures import make_release1, make_release2
from tests.support.api import CHEAP_KDF
from tests.support.ops.verify import line_of, run

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def named(text: str, user_id: str) -> tuple[set[str], set[str]]:
    """The key ring's and the memory file's format names in a verify report."""
    fact = line_of(text, user_id).split("formats: ", 1)[1]
    ring, memory = fact.removeprefix("key ring: ").split("; memory file: ")
    return set(ring.split(", ")), set(memory.split(" (the memory file's")[0].split(", "))


def keyring_facts(folder: Path) -> tuple[str, set[str]]:
    conn = sqlite3.connect(folder / "keyring.db")
    try:
        mark = conn.execute("SELECT value FROM keyring_meta WHERE name = 'format'").fetchone()[0]
        return mark, {r[1] for r in conn.execute("PRAGMA table_info(grants)")}
    finally:
        conn.close()


def memory_facts(vault: Vault, token: str) -> tuple[int, set[int], set[int], str]:
    """The memory file's page size, memory plaintext lengths, summary sealed
    lengths and format mark, read through the connection a session opens."""
    with vault.session(token, "read") as s:
        conn = s.open_memory().mf.conn
        page = int(conn.execute("PRAGMA page_size").fetchone()[0])
        made = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        # A table not made yet (the summaries of a memory never napped) holds none.
        rows = (
            {r[0] - aead.OVERHEAD for r in conn.execute("SELECT length(sealed) FROM log")} if "log" in made else set()
        )
        sums = {r[0] for r in conn.execute("SELECT length(sealed) FROM summaries")} if "summaries" in made else set()
        mark = conn.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()[0]
    return page, rows, sums, mark


def by_mark(file: str, mark: str) -> formats.Format:
    (found,) = [f for f in formats.of_file(file) if f.mark == mark]
    return found


def assert_memory_named(memory: set[str], page: int, rows: set[int], mark: str) -> None:
    assert formats.PAGE_FORMATS[page].name in memory
    assert {f.name for f in formats.PAGE_FORMATS.values()} & memory == {formats.PAGE_FORMATS[page].name}
    assert {formats.ROW_FORMATS[n].name for n in rows} == {f.name for f in formats.ROW_FORMATS.values()} & memory
    assert by_mark(formats.MEMORY_FILE, mark).name in memory


def test_the_registry_is_in_release_order_and_each_handler_exists() -> None:
    classes = {formats.KEY_RING: Keyring, formats.MEMORY_FILE: MemoryFile}
    for file in (formats.KEY_RING, formats.MEMORY_FILE):
        entries = formats.of_file(file)
        ages = [formats.RELEASES.index(f.release) for f in entries]
        assert ages == sorted(ages), file
        marks = [int(f.mark) for f in entries if f.mark is not None]
        assert marks == sorted(marks) and len(set(marks)) == len(marks), file
        assert len({f.name for f in entries}) == len(entries), file
        for f in entries:
            module, _, attr = f.handler.rpartition(".")
            try:
                target = importlib.import_module(f"stash.{module}")
            except ModuleNotFoundError:  # a method: module.Class.method
                module, _, cls = module.rpartition(".")
                target = getattr(importlib.import_module(f"stash.{module}"), cls)
            assert callable(getattr(target, attr)), f.handler
            if f.upgrade is not None:
                assert callable(getattr(classes[file], f.upgrade)), f.upgrade
        # The step of each mark but the newest brings a file to the next one.
        assert all(formats.upgrade_of(file, f.mark) for f in entries if f.mark and f.mark != str(marks[-1]))
        assert formats.upgrade_of(file, formats.current_mark(file)) is None


def test_a_new_store_is_at_the_newest_formats_and_verify_names_them(capsys, tmp_path: Path, file_cipher: str):
    data = tmp_path / "data"
    vault = Vault(data, kdf=CHEAP_KDF, file_cipher=file_cipher)
    ident = vault.create_identity()
    with vault.session(ident.token, "full") as s:
        for k in range(3):
            s.open_memory().note(f"osprey memory {k}")
    folder = data / "users" / ident.user_id
    ring_mark, columns = keyring_facts(folder)
    page, rows, _, mark = memory_facts(vault, ident.token)
    assert ring_mark == formats.current_mark(formats.KEY_RING) and {"pub", "box"} <= columns
    assert mark == formats.current_mark(formats.MEMORY_FILE)
    code, text = run(capsys, data, ident.token)
    assert code == 0, text
    ring, memory = named(text, ident.user_id)
    assert by_mark(formats.KEY_RING, ring_mark).name in ring
    assert {"memory page size recorded", "owner-sealed labels"} <= ring
    assert_memory_named(memory, page, rows, mark)
    assert "log made on use" in memory  # noted, never napped: no summaries table
    assert ("SQLCipher" if file_cipher == "sqlcipher" else "plain SQLite") in memory


def test_a_release2_store_opens_and_verify_names_its_formats(capsys, tmp_path: Path):
    data = tmp_path / "release2"
    shutil.copytree(FIXTURES / "release2", data)
    folder = data / "users" / make_release2.USER_ID
    ring_mark, _ = keyring_facts(folder)
    owner = make_release2.token_of("owner")
    code, text = run(capsys, data, owner)
    assert code == 0, text
    assert "authenticated format" not in named(text, make_release2.USER_ID)[1]  # verify changes nothing
    # A session moves the memory file to the authenticated format, once its
    # key ring's copies are sealed; verify then names it.
    page, rows, sums, mark = memory_facts(Vault(data), owner)
    assert mark == formats.current_mark(formats.MEMORY_FILE)
    code, text = run(capsys, data, owner)
    assert code == 0, text
    ring, memory = named(text, make_release2.USER_ID)
    assert "sealed copies" in ring
    assert by_mark(formats.KEY_RING, ring_mark).name in ring
    assert_memory_named(memory, page, rows, mark)
    versioned = formats.SUMMARY_VERSION_BYTES + formats.SUMMARY_PLAINTEXT_BYTES + aead.OVERHEAD
    assert sums and sums <= {versioned, formats.SUMMARY_PLAINTEXT_BYTES + aead.OVERHEAD}
    assert ("versioned summaries" in memory) == (versioned in sums)
    assert ("unversioned summaries" in memory) == (versioned - formats.SUMMARY_VERSION_BYTES in sums)


def test_a_release1_store_moves_up_through_the_registry(capsys, tmp_path: Path):
    data = tmp_path / "release1"
    shutil.copytree(FIXTURES / "release1", data)
    folder = data / "users" / make_release1.USER_ID
    ring_mark, columns = keyring_facts(folder)
    assert formats.upgrade_of(formats.KEY_RING, ring_mark) is not None
    code, text = run(capsys, data)
    assert code == 0, text
    assert by_mark(formats.KEY_RING, ring_mark).name in named(text, make_release1.USER_ID)[0]
    body = f"stash1_{make_release1.USER_ID}_{tokens._b62(int.from_bytes(make_release1.secret_of('owner'), 'big'), 43)}"
    owner = body + tokens._checksum(body)
    vault = Vault(data)
    with vault.session(owner, "read") as s:
        assert s.open_memory().mf.count() == make_release1.T
        assert s.open_memory().mf.memory(0)[2] == make_release1.memory_text(0)
    page, rows, _, mark = memory_facts(vault, owner)
    after, columns_after = keyring_facts(folder)
    assert after == formats.current_mark(formats.KEY_RING) and {"pub", "box"} <= columns_after - columns
    code, text = run(capsys, data, owner)
    assert code == 0, text
    assert_memory_named(named(text, make_release1.USER_ID)[1], page, rows, mark)
