"""Crafted files fail fast, in every memory (docs/DESIGN.md, "Formats";
SECURITY.md): with a real server stopped, an attacker with the data folder
replaces a table of one user's ``keyring.db``, ``memory.db`` (plain stores:
a SQLCipher one cannot be written without its key) or ``recall.db`` by a
view over an endless ``WITH RECURSIVE`` query, in ``main`` or in a second
memory, using the sqlite3 module. Started again, the server answers every
request of that user (``store.damaged`` for the crafted memory, the log for
a crafted cache), the owner's note to main included; ``GET /memories``
lists the others and names the damaged one (so does ``stash memories``); a
grant of it is revoked or refused as damage, never a bare 500; another user
is untouched; the server stops on SIGTERM and logs no traceback. ``stash verify`` and ``stash backup`` (real
processes) finish, fail that user naming the memory and go on to the next,
which is still copied whole."""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from stash.storage.memories import MAIN, SUBFOLDER
from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.server import CLI_TIMEOUT, REPO, STOP_TIMEOUT, Http, Server

pytestmark = pytest.mark.slow

ENDLESS = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT {columns} FROM r"
# Rows whose name no reader asks for, and not a constant SQLite could fold into
# the reader's WHERE: every reader scans on for ever.
META = "printf('spin%d', n) AS name, CAST(n AS TEXT) AS value"
OTHER = "alpha"
CACHED = 4_200  # memories: more than one recall-cache piece (recallcache/rendered_log.py, PIECE): recall.db is read


def _replace_by_view(path: Path, table: str, columns: str, extra: tuple[str, ...] = ()) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"ALTER TABLE {table} RENAME TO {table}_kept")
    conn.execute(f"CREATE VIEW {table} AS {ENDLESS.format(columns=columns)}")
    for statement in extra:
        conn.execute(statement)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def craft_keyring(folder: Path) -> None:
    _replace_by_view(folder / "keyring.db", "keyring_meta", META)


def craft_memory(folder: Path) -> None:
    """``meta`` (the first table a reader asks) endless, and a trigger that
    would loop on the next note."""
    _replace_by_view(
        folder / "memory.db",
        "meta",
        META,
        ("CREATE TRIGGER log_spin BEFORE INSERT ON log BEGIN SELECT COUNT(*) FROM meta; END",),
    )


def craft_recall(folder: Path) -> None:
    """The recall cache, made by the attacker if the server has not made it yet."""
    conn = sqlite3.connect(folder / "recall.db", isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS scan_cache (piece INTEGER PRIMARY KEY, sealed BLOB NOT NULL)")
    conn.close()
    _replace_by_view(folder / "recall.db", "scan_cache", "n AS piece, zeroblob(16) AS sealed")


CRAFTS: dict[str, Callable[[Path], None]] = {
    "keyring.db": craft_keyring,
    "memory.db": craft_memory,
    "recall.db": craft_recall,
}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # Bounded: a tool that hangs on the crafted file fails here instead of stalling the suite.
    return subprocess.run(
        [sys.executable, "-m", "stash", *args], cwd=REPO, capture_output=True, text=True, timeout=CLI_TIMEOUT, env=env
    )


def report_lines(out: str) -> dict[str, str]:
    """Each user's line of a verify or backup report, by user id."""
    return {
        line.split()[0]: line
        for line in out.splitlines()
        if line[:1].isalnum() and "  " in line and line.split()[1] in ("ok", "FAIL")
    }


def answer(resp) -> tuple[int, str | None]:
    """A response's status and error code (None for a success)."""
    return resp.status_code, (resp.json().get("error") if resp.status_code >= 400 else None)


def make_user(http: Http, memory: str, file: str | None) -> dict:
    """An identity whose memory ``memory`` has notes (and, when its
    ``file`` is to be the cache, enough of them that a recall reads
    recall.db) and, outside main, a read grant bound to it."""
    ident = http.init()
    tok = ident["token"]
    grant = None
    if memory != MAIN:
        http.ok("POST", "/memories", tok, json={"name": memory})
        grant = http.ok("POST", "/grants", tok, json={"scope": "read", "memory": memory})["id"]
    prefix = "" if memory == MAIN else f"/m/{memory}"
    if file == "recall.db":
        today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
        body = "\n".join(f"{today} cached line {k}" for k in range(CACHED))
        resp = http.post(f"{prefix}/import", tok, content=body, headers={"Content-Type": "text/plain"})
        assert resp.status_code == 200, resp.text
        assert http.ok("POST", f"{prefix}/recall", tok, json={"q": "cached line 7$"})["total"] == 1
    for k in range(3):
        http.ok("POST", f"{prefix}/note", tok, json={"text": f"memory {k}"})
    http.ok("POST", "/note", tok, json={"text": "main's own"})
    return {**ident, "prefix": prefix, "grant": grant}


@pytest.mark.parametrize("memory", [MAIN, OTHER])
def test_a_crafted_file_in_any_memory_is_refused_and_everything_else_answers(
    tmp_path: Path, file_cipher: str, memory: str
):
    data = tmp_path / "data"
    # A SQLCipher memory file cannot be written without its key: crafted on plain stores only.
    files = [f for f in CRAFTS if file_cipher == "none" or f != "memory.db"]
    server = Server(
        data=data,
        log=tmp_path / "server.log",
        extra=[*CHEAP_KDF_FLAGS, "--file-cipher", file_cipher, "--shutdown-timeout", "3"],
    ).start()
    http = Http(server.url)
    try:
        users = {file: make_user(http, memory, file) for file in files}
        last_damaged = max(u["user_id"] for f, u in users.items() if f != "recall.db")
        clean = make_user(http, memory, None)
        while clean["user_id"] < last_damaged:  # verify and backup must go on past every damaged user to it
            clean = make_user(http, memory, None)
    finally:
        http.close()
        server.stop()

    for file, user in users.items():
        folder = data / "users" / user["user_id"]
        CRAFTS[file](folder if memory == MAIN else folder / SUBFOLDER / memory)

    server.start()
    http = Http(server.url)
    try:
        for file, user in users.items():
            tok, prefix = user["token"], user["prefix"]
            damaged = file != "recall.db"  # a crafted cache is not read: the log answers
            note = http.post("/note", tok, json={"text": "the owner writes to main"})  # bounded: HTTP_TIMEOUT
            if damaged and memory == MAIN:
                assert answer(note) == (500, "store.damaged"), (file, note.text)
            else:
                assert note.status_code == 200, (file, note.text)
            if damaged:
                wake = http.get(f"{prefix}/wake", tok)
                assert answer(wake) == (500, "store.damaged"), (file, wake.text)
            else:
                found = http.ok("POST", f"{prefix}/recall", tok, json={"q": f"cached line {CACHED - 1}$"})
                assert found["total"] == 1, (file, found)
            listed = http.get("/memories", tok)
            if memory == MAIN and file == "keyring.db":  # the owner's own key ring: nothing can be listed
                assert answer(listed) == (500, "store.damaged"), (file, listed.text)
                continue
            assert listed.status_code == 200, (file, listed.text)  # read from the key rings alone
            names = {m["name"] for m in listed.json()["memories"]}
            named = {(d["name"], d["error"]) for d in listed.json()["unopened"]}
            if file == "keyring.db":
                assert names == {MAIN} and named == {(memory, "store.damaged")}, (file, listed.json())
                # The owner's command says so too.
                shown = cli("memories", env={**os.environ, "STASH_URL": server.url, "STASH_TOKEN": tok})
                assert shown.returncode == 0, shown.stdout + shown.stderr
                assert f"{memory}: could not be opened (store.damaged)" in shown.stdout, shown.stdout
            else:
                assert names == {MAIN, memory} and not named, (file, listed.json())
            if user["grant"] is not None:  # a grant of that memory: found, and revoked or refused as damage
                revoked = http.delete(f"/grants/{user['grant']}", tok)
                assert answer(revoked) == ((500, "store.damaged") if file == "keyring.db" else (200, None)), (
                    file,
                    revoked.text,
                )
        assert http.get(f"{clean['prefix']}/wake", clean["token"]).status_code == 200
        assert http.post("/note", clean["token"], json={"text": "untouched"}).status_code == 200
        assert server.proc is not None
        server.proc.terminate()
        assert server.proc.wait(timeout=STOP_TIMEOUT) == 0
    finally:
        http.close()
        server.stop()
    log = server.log_text()
    for bad in ("graceful shutdown exceeded", "traceback", "unhandled"):
        assert bad not in log.lower(), log[-3000:]

    verify = cli("verify", str(data))
    dest = tmp_path / "backup"
    backup = cli("backup", "--data", str(data), str(dest))
    for done in (verify, backup):
        assert done.returncode == 1, done.stdout + done.stderr
        lines = report_lines(done.stdout)
        for file, user in users.items():
            line = lines[user["user_id"]]
            if file == "recall.db":  # a cache, rebuilt from the log: neither checked nor copied
                assert line.split()[1] == "ok", (file, line)
            else:
                assert line.split()[1] == "FAIL", (file, line)
                if memory != MAIN:
                    assert f"memory {memory}:" in line, (file, line)
        assert lines[clean["user_id"]].split()[1] == "ok", done.stdout
    assert (dest / "users" / clean["user_id"] / "memory.db").is_file()
