"""Finding 1 of issue 26 against a real server, as reported: three memories
and a full capability; memory.db kept; #1 erased, the capability revoked,
one more note; then, the server stopped, the old memory.db put back with its state row deleted, and the key ring's
copies deleted. The restarted server refuses (it served the erased memory
and lost the later note before), and `stash verify --token` fails too. The
same attack on both kinds of store, at the API level, is in
tests/api/test_format_downgrade.py."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from stash.crypto import tokens
from stash.storage.keyring import Keyring
from stash.web.app import create_app
from tests.support.api import CHEAP_KDF, CHEAP_KDF_FLAGS, Api, assert_error, make_settings, token_parts
from tests.support.files.raw import file_key, open_raw
from tests.support.installed import OUTSIDE
from tests.support.server import Http, start_server

pytestmark = pytest.mark.slow
SECRET = "BRAVO-SECRET memory to be erased"


def test_an_old_memory_file_without_its_state_row_is_refused_by_a_real_server(tmp_path: Path) -> None:
    # The history is written in-process (the API test shows it is the one a
    # server writes); the folder it leaves is then served by a real server.
    data = tmp_path / "srv" / "data"
    api = Api(create_app(make_settings(data, kdf=CHEAP_KDF)))
    owner = api.init()["token"]
    uid = token_parts(owner).user_id
    folder = data / "users" / uid
    for text in ("alpha memory", SECRET, "charlie memory"):
        assert api.post("/note", owner, json={"text": text}).status_code == 200
    full = api.post("/grants", owner, json={"scope": "full"}).json()
    api.close()
    old = tmp_path / "old.db"
    shutil.copy2(folder / "memory.db", old)
    api = Api(create_app(make_settings(data, kdf=CHEAP_KDF)))
    assert api.post("/erase", owner, json={"ids": [1]}).status_code == 200
    assert api.delete(f"/grants/{full['id']}", owner).status_code == 200
    assert api.post("/note", owner, json={"text": "the later note"}).status_code == 200
    api.close()

    with Keyring(folder / "keyring.db", uid) as ring:
        cipher = ring.meta("file_cipher")
        tok = token_parts(owner)
        grant = ring.find(tokens.lookup_tag(uid, tok.secret))
        assert grant is not None
        base = ring.open_grant(grant, tok.secret).chain.base
    for name in ("memory.db", "memory.db-wal", "memory.db-shm"):
        (folder / name).unlink(missing_ok=True)
    shutil.copy2(old, folder / "memory.db")
    conn = open_raw(folder / "memory.db", file_key(base) if cipher == "sqlcipher" else None, isolation_level=None)
    conn.execute("DELETE FROM meta WHERE name = 'state'")
    conn.close()
    with sqlite3.connect(folder / "keyring.db") as ring_conn:
        ring_conn.execute("DELETE FROM keyring_meta WHERE name IN ('state_version', 'log_head', 'copies_mac')")
    ring_conn.close()

    with start_server(tmp_path / "srv", *CHEAP_KDF_FLAGS) as server:
        http = Http(server.url)
        for method, url, body in (("GET", "/wake", None), ("POST", "/recall", {"q": "BRAVO"})):
            resp = http.request(method, url, owner, **({"json": body} if body else {}))
            assert SECRET not in resp.text
            assert assert_error(resp, 500)["error"] == "store.damaged", resp.text
        check = subprocess.run(
            [sys.executable, "-m", "stash", "verify", str(server.data), "--token"],
            capture_output=True,
            text=True,
            cwd=OUTSIDE,
            timeout=120,
            env={**os.environ, "STASH_TOKEN": owner},
        )
        assert check.returncode != 0, check.stdout + check.stderr
        assert SECRET not in check.stdout + check.stderr
