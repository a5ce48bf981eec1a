"""The 4 KiB layout (schema.sql, "Pages"; issue 13, goal 3, and issue 27's
"an empty identity stays at most 40 KB"): an empty identity is the six
pages schema.sql lists; the tables it leaves out (the log, its keys and
summaries among them) are made by their first write and, once holding rows,
are covered by the whole-state head like any other: dropping one is refused
as deleting its rows would be, after a restart; the memory file's page size
is read from the key ring, and an edited record only makes the file fail to
open, as damage, and leaves it whole. Real files, built through the service,
edited by hand the way someone holding them would."""

from __future__ import annotations

import contextlib
import io
import sqlite3
from pathlib import Path

import pytest

from stash.cli.main import main as stash_main
from stash.core.errors import Damaged
from stash.service.access import Vault
from stash.storage.formats import LEGACY_PAGE_BYTES, PAGE_BYTES
from stash.storage.keyring import MEMORY_PAGES
from tests.support.api import CHEAP_KDF
from tests.support.files.raw import file_key, open_raw

GOAL_BYTES = 40_000  # "an empty identity stays at most 40 KB" (issue 27), read strictly (40 × 1000)
FOLDER_BYTES = 4096  # the user's folder itself, counted as one block


def new_identity(tmp_path: Path, cipher: str) -> tuple[Vault, str, Path]:
    vault = Vault(tmp_path / "data", kdf=CHEAP_KDF, file_cipher=cipher)
    ident = vault.create_identity()
    return vault, ident.token, vault.data_dir / "users" / ident.user_id


def tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'index')")}


def edit_keyring(folder: Path, sql: str, args: tuple[object, ...] = ()) -> None:
    conn = sqlite3.connect(folder / "keyring.db", isolation_level=None)
    try:
        conn.execute(sql, args)
    finally:
        conn.close()


@pytest.mark.parametrize("cipher", ["sqlcipher", "none"])
def test_an_empty_identity_is_the_six_pages_schema_sql_lists(tmp_path: Path, cipher: str):
    vault, token, folder = new_identity(tmp_path, cipher)
    ring, memory = folder / "keyring.db", folder / "memory.db"
    # Measured before any request: a request records the grant's last use.
    assert ring.stat().st_size == 4 * PAGE_BYTES
    assert memory.stat().st_size == 2 * PAGE_BYTES
    assert sum(p.stat().st_size for p in folder.iterdir()) + FOLDER_BYTES <= GOAL_BYTES
    conn = sqlite3.connect(ring)
    try:
        assert tables(conn) == {"keyring_meta", "grants", "sqlite_autoindex_grants_1"}
        assert conn.execute("PRAGMA page_size").fetchone()[0] == PAGE_BYTES
        assert conn.execute("SELECT value FROM keyring_meta WHERE name = ?", (MEMORY_PAGES,)).fetchone() == (
            str(PAGE_BYTES),
        )
    finally:
        conn.close()
    with vault.session(token, "owner") as s:
        conn = s.open_memory().mf.conn
        assert tables(conn) == {"meta"}
        assert conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger'").fetchone()[0] == 0
        # An empty store answers every read that touches a table it does not have yet.
        assert s.open_memory().config()["sizes"] == s.open_memory().config()["defaults"]
        assert s.open_memory().erasures() == {"erasures": []}
        assert s.open_memory().wake()["T"] == 0
        assert s.open_memory().mf.memories(0, 0) == [] and list(s.open_memory().mf.scan(0)) == []
        assert s.open_memory().mf.level_sizes() == [] and s.open_memory().mf.summary(0, 2) is None
    # Reads made nothing: the file is still its two pages.
    assert memory.stat().st_size == 2 * PAGE_BYTES
    with vault.session(token, "full") as s:
        s.open_memory().note("the first memory")
        conn = s.open_memory().mf.conn
        # The first note makes the log with its guard triggers, and its key chunk; no summary yet.
        assert tables(conn) == {"meta", "log", "memory_keys"}
        triggers = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        assert triggers == {"log_no_update", "log_no_delete", "log_no_replace"}
        with pytest.raises(Exception, match="append-only"):
            conn.execute("DELETE FROM log")


def test_a_table_is_made_by_its_first_write_and_then_covered_by_the_state_head(tmp_path: Path):
    vault, token, folder = new_identity(tmp_path, "sqlcipher")
    with vault.session(token, "owner") as s:
        master = bytes(s.master)
        for i in range(6):
            nap = s.open_memory().note(f"memory {i}")["nap"]
            while nap is not None:
                nap = s.open_memory().nap(nap["block"], f"summary of {nap['block']}", None, None)["nap"]
        assert not {"config", "erased", "erasures"} & tables(s.open_memory().mf.conn)
        s.open_memory().set_config({"WAKE_LINES": 40})
        s.open_memory().erase([1], "2026-12-01T00:00:00Z")
        assert {"config", "erased", "erasures", "log", "memory_keys", "summaries"} <= tables(s.open_memory().mf.conn)
    with vault.session(token, "read") as s:
        assert s.open_memory().config()["sizes"]["WAKE_LINES"] == 40
        assert [line for _, _, line in s.open_memory().mf.memories(0, 6)][1] == "[erased]"
        assert len(s.open_memory().erasures()["erasures"]) == 1
        assert s.open_memory().mf.summary(2, 4) == "summary of 2-3"  # the erasure dropped 0-1 and 0-3 only
    # Dropping a table that holds rows (its triggers go with it) is refused as
    # their deletion would be, by a server started afresh (a new vault: no
    # connection or cache kept): a missing table reads as empty, which is not
    # what the heads cover. The log's head names 6 rows; the state head covers
    # each level's frontier; a memory without its key chunk is damage, read
    # or written after.
    for table in ("config", "erasures", "erased", "log", "memory_keys", "summaries"):
        with contextlib.closing(open_raw(folder / "memory.db", file_key(master), isolation_level=None)) as conn:
            rows = conn.execute(f"SELECT * FROM {table}").fetchall()
            assert rows, table
            made = [
                r[0]
                for r in conn.execute(
                    "SELECT sql FROM sqlite_master WHERE tbl_name = ? AND sql IS NOT NULL "
                    "ORDER BY type = 'trigger', name",
                    (table,),
                )
            ]
            conn.execute(f"DROP TABLE {table}")
        restarted = Vault(vault.data_dir, kdf=CHEAP_KDF, file_cipher="sqlcipher")
        with pytest.raises(Damaged):
            with restarted.session(token, "read") as s:
                s.open_memory().wake()
        if table == "memory_keys":  # nor does a write pass the chunk off as new, with fresh keys
            with pytest.raises(Damaged):
                with restarted.session(token, "full") as s:
                    s.open_memory().note("written over a lost key chunk")
            with pytest.raises(Damaged):  # the log's own append, without the note's check of the newest date
                with restarted.session(token, "full") as s:
                    s.open_memory().mf.append([("2026-12-02", "written over a lost key chunk")])
        with contextlib.closing(open_raw(folder / "memory.db", file_key(master), isolation_level=None)) as conn:
            conn.execute(made[0])  # the table, then its rows, then its triggers
            conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
            for sql in made[1:]:
                conn.execute(sql)
        with Vault(vault.data_dir, kdf=CHEAP_KDF, file_cipher="sqlcipher").session(token, "read") as s:
            assert s.open_memory().wake()["T"] == 6, table


@pytest.mark.parametrize("record", [str(LEGACY_PAGE_BYTES), "8192", "four", None])
def test_an_edited_page_size_record_is_damage_and_leaves_the_file_whole(tmp_path: Path, record: str | None):
    vault, token, folder = new_identity(tmp_path, "sqlcipher")
    with vault.session(token, "full") as s:
        for i in range(3):
            s.open_memory().note(f"kept {i}")
    before = (folder / "memory.db").read_bytes()
    if record is None:  # no record: a key ring from before the change, whose file has 16 KiB pages
        edit_keyring(folder, "DELETE FROM keyring_meta WHERE name = ?", (MEMORY_PAGES,))
    else:
        edit_keyring(folder, "UPDATE keyring_meta SET value = ? WHERE name = ?", (record, MEMORY_PAGES))
    with pytest.raises(Damaged):
        with vault.session(token, "read") as s:
            s.open_memory().wake()
    # The refused open changed nothing: put the record back and all is served.
    assert (folder / "memory.db").read_bytes() == before
    edit_keyring(
        folder,
        "INSERT INTO keyring_meta(name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value",
        (MEMORY_PAGES, str(PAGE_BYTES)),
    )
    with vault.session(token, "read") as s:
        assert [text for _, _, text in s.open_memory().mf.memories(0, 3)] == ["kept 0", "kept 1", "kept 2"]


def run_verify(data: Path) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = stash_main(["verify", str(data)])
    return code, out.getvalue()


def test_verify_reads_the_page_size_from_the_key_ring(tmp_path: Path):
    vault, _, folder = new_identity(tmp_path, "sqlcipher")
    code, text = run_verify(vault.data_dir)
    assert code == 0 and "2 encrypted pages of 4 KiB" in text
    edit_keyring(folder, "UPDATE keyring_meta SET value = '7' WHERE name = ?", (MEMORY_PAGES,))
    code, text = run_verify(vault.data_dir)
    assert code == 1 and "no known page size" in text


@pytest.mark.parametrize(
    "crafted",
    [
        (
            "CREATE VIEW log AS WITH RECURSIVE r(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM r) "
            "SELECT n AS id, x'00' AS sealed FROM r",
        ),
        (
            "CREATE TABLE summaries (size INTEGER NOT NULL, idx INTEGER NOT NULL, sealed BLOB NOT NULL, "
            "PRIMARY KEY (size, idx)) WITHOUT ROWID",
            "CREATE TRIGGER summaries_spin BEFORE INSERT ON summaries BEGIN SELECT 1; END",
        ),
    ],
    ids=["a view in the log's place", "a trigger on a table made before its time"],
)
def test_a_table_not_made_yet_cannot_be_stood_in_for(tmp_path: Path, crafted: tuple[str, ...]):
    """A new memory file lacks its log and summaries until written: whoever
    holds a plain one may put a view in a missing table's place, or make the
    table themselves with a trigger of their own. Either is refused as a
    schema Stash does not make (storage/safeopen.py) before any of it runs."""
    vault, token, folder = new_identity(tmp_path, "none")
    conn = sqlite3.connect(folder / "memory.db", isolation_level=None)
    try:
        for sql in crafted:
            conn.execute(sql)
    finally:
        conn.close()
    with pytest.raises(Damaged):
        with vault.session(token, "full") as s:
            s.open_memory().note("a first memory")
