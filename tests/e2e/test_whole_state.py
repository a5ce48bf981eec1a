"""The whole state is authenticated (docs/DESIGN.md, "Whole-state authentication"; issue 10 item 3): with the
server stopped, rows of a real memory file are put back from an older copy,
deleted, spliced in from another history of the same user, or a trigger is
dropped — by someone holding the file key, as a revoked token's holder with an
old key ring would — and the restarted server refuses (store.damaged /
store.rolled_back) or, for an erasure undone by a key chunk put back, still
shows the memory erased. Never the old or erased text."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import CHEAP_KDF_FLAGS, assert_error, wal_folded
from tests.live import Http, Server, start_server
from tests.state_kit import base_key, raw, rows

pytestmark = pytest.mark.slow

REFUSED = ("store.damaged", "store.rolled_back")


@pytest.fixture
def server(tmp_path: Path):
    with start_server(tmp_path / "srv", *CHEAP_KDF_FLAGS) as srv:
        yield srv


class Store:
    def __init__(self, server: Server, tmp: Path) -> None:
        self.server, self.tmp = server, tmp
        self.http = Http(server.url)
        self.token = self.http.init()["token"]
        self.uid = self.token[7:23]
        self.folder = server.data / "users" / self.uid
        self.base = base_key(server, self.token)

    def settle(self, text: str = "summary") -> None:
        while (nap := self.http.ok("POST", "/nap", self.token, json={})["nap"]) is not None:
            self.http.ok("POST", "/nap", self.token, json={"block": nap["block"], "text": f"{text} {nap['block']}"})

    def copy(self, name: str) -> Path:
        """A stopped-server copy of the user's folder (a backup)."""
        self.server.stop()
        dest = self.tmp / name
        shutil.copytree(self.folder, dest)
        self.server.start(same_port=True)
        return dest

    @contextlib.contextmanager
    def edit(self, restore: bool = True):
        self.server.stop()
        try:
            with raw(self.folder, self.base, restore) as conn:
                yield conn
        finally:
            self.server.start(same_port=True)

    def refused(self, *requests: tuple[str, str, dict | None], secret: str | None = None) -> None:
        for method, url, body in requests:
            resp = self.http.request(method, url, self.token, **({"json": body} if body is not None else {}))
            err = assert_error(resp, resp.status_code)
            assert resp.status_code == 500 and err["error"] in REFUSED, (url, resp.status_code, resp.text)
            if secret:
                assert secret not in resp.text


def test_an_erasure_is_not_undone_by_putting_back_its_key_chunk_or_its_records(server: Server, tmp_path: Path):
    s = Store(server, tmp_path)
    secret = f"secret-{os.urandom(5).hex()}"
    for i in range(8):
        s.http.ok("POST", "/note", s.token, json={"text": f"{secret} {i}" if i == 3 else f"plain {i}"})
    s.settle(f"quotes {secret}")
    before = s.copy("before")
    s.http.ok("POST", "/erase", s.token, json={"ids": [3]})
    s.settle("rewritten")
    (chunk,) = rows(before, s.base, "SELECT sealed FROM memory_keys WHERE chunk = 0")[0]
    # 1. The key chunk from before the erasure put back: the erasure record wins.
    with s.edit() as conn:
        conn.execute("UPDATE memory_keys SET sealed = ? WHERE chunk = 0", (chunk,))
    wake = s.http.ok("GET", "/wake", s.token)
    assert secret not in str(wake) and wake["lines"][3].endswith(" [erased]")
    assert s.http.ok("POST", "/recall", s.token, json={"q": secret})["total"] == 0
    assert secret not in s.http.get("/export", s.token).text
    # 2. And the erasure's records deleted as well (its date row, its receipt): refused.
    with s.edit() as conn:
        conn.execute("DELETE FROM erased")
    s.refused(("GET", "/wake", None), ("POST", "/recall", {"q": secret}), secret=secret)
    # 3. A summary that quoted it, from the copy before, put back at its block.
    fresh = Store(server, tmp_path / "second")
    for i in range(4):
        fresh.http.ok("POST", "/note", fresh.token, json={"text": f"{secret} {i}"})
    fresh.settle(f"quotes {secret}")
    old = fresh.copy("old")
    fresh.http.ok("POST", "/erase", fresh.token, json={"ids": [1]})
    fresh.settle("rewritten without it")
    quoted = rows(old, fresh.base, "SELECT sealed FROM summaries WHERE size = 2 AND idx = 0")[0][0]
    with fresh.edit() as conn:
        conn.execute("UPDATE summaries SET sealed = ? WHERE size = 2 AND idx = 0", (quoted,))
    fresh.refused(("GET", "/zoom?block=0-3", None), ("GET", "/export", None), secret=secret)


def test_older_summaries_config_receipts_triggers_and_spliced_rows_are_refused(server: Server, tmp_path: Path):
    s = Store(server, tmp_path)
    for i in range(8):
        s.http.ok("POST", "/note", s.token, json={"text": f"memory {i}"})
    s.settle("first")
    s.http.ok("POST", "/config", s.token, json={"WAKE_LINES": 5})
    s.http.ok("POST", "/erase", s.token, json={"ids": [7]})
    s.settle("after the erasure")
    old = s.copy("old")
    s.http.ok("POST", "/forget", s.token, json={"block": "0-1"})
    s.settle("second")

    def restored(edit, restore_triggers: bool = True) -> None:
        """Apply ``edit`` to the live folder, check the server refuses it,
        then put the live folder back as it was."""
        keep = s.copy(f"keep-{os.urandom(3).hex()}")
        with s.edit(restore_triggers) as conn:
            edit(conn)
        s.refused(("POST", "/zoom", {"block": "0-3"}), ("GET", "/export", None))
        s.server.stop()
        shutil.rmtree(s.folder)
        shutil.copytree(keep, s.folder)
        s.server.start(same_port=True)
        assert s.http.get("/wake", s.token).status_code == 200

    (first,) = rows(old, s.base, "SELECT sealed FROM summaries WHERE size = 2 AND idx = 0")[0]
    restored(lambda c: c.execute("UPDATE summaries SET sealed = ? WHERE size = 2 AND idx = 0", (first,)))
    restored(lambda c: c.execute("DELETE FROM config"))
    restored(lambda c: c.execute("DELETE FROM erasures"))
    restored(lambda c: c.execute("DELETE FROM summaries WHERE size = 8"))
    restored(lambda c: None, restore_triggers=False)  # the edit dropped the log's triggers and left them so

    # A middle log row from another history of this user: the old copy served
    # by a second server grows its own #8, which is spliced into this file.
    for k in range(3):
        s.http.ok("POST", "/note", s.token, json={"text": f"ours {k}"})
    other = start_server(tmp_path / "fork", *CHEAP_KDF_FLAGS)
    try:
        other.stop()
        shutil.rmtree(other.data / "users", ignore_errors=True)
        (other.data / "users").mkdir(parents=True)
        shutil.copytree(old, other.data / "users" / s.uid)
        other.start(same_port=True)
        Http(other.url).ok("POST", "/note", s.token, json={"text": "theirs 0"})
        other.stop()
        (spliced,) = rows(other.data / "users" / s.uid, s.base, "SELECT sealed FROM log WHERE id = 8")[0]
    finally:
        other.stop()
    with s.edit() as conn:
        conn.execute("UPDATE log SET sealed = ? WHERE id = 8", (spliced,))
    s.refused(("POST", "/recall", {"q": "theirs"}), ("POST", "/zoom", {"block": "8-9"}), secret="theirs")


def test_a_whole_memory_file_put_back_is_refused_even_when_only_state_changed(server: Server, tmp_path: Path):
    s = Store(server, tmp_path)
    for i in range(4):
        s.http.ok("POST", "/note", s.token, json={"text": f"memory {i}"})
    old = s.copy("old")
    # No memory was added: only the config changed, which the log head does not see.
    s.http.ok("POST", "/config", s.token, json={"WAKE_LINES": 3})
    s.server.stop()
    for name in ("memory.db", "memory.db-wal", "memory.db-shm"):
        (s.folder / name).unlink(missing_ok=True)
    shutil.copy2(old / "memory.db", s.folder / "memory.db")
    s.server.start(same_port=True)
    resp = s.http.get("/config", s.token)
    assert_error(resp, 500, "store.rolled_back")


@pytest.mark.parametrize("moment", ["folded", "still in its WAL"])
def test_an_older_memory_file_put_back_while_the_server_keeps_it_open_is_refused(server: Server, tmp_path: Path,
                                                                                  moment: str):
    """The server keeps a user's files open for a few seconds after each
    request (--keep-open, storage/pool.py). A file copied over in place
    meanwhile — the same inode, older bytes — must not be read through the
    connection kept open, whose cache still holds the newer pages. Put back
    before the pool folded the newer writes, the WAL beside it still holds
    them: SQLite reads them over the older pages, so what is served, if
    anything, is the newest state, never the older one."""
    s = Store(server, tmp_path)
    for i in range(4):
        s.http.ok("POST", "/note", s.token, json={"text": f"before {i}"})
    s.settle()
    older = s.copy("older") / "memory.db"
    secret = f"later-{os.urandom(5).hex()}"
    for i in range(3):
        s.http.ok("POST", "/note", s.token, json={"text": f"{secret} {i}"})
    assert s.http.ok("GET", "/wake", s.token)["T"] == 7  # the files are open in the server now
    if moment == "folded":
        assert wal_folded(s.folder / "memory.db")
        shutil.copyfile(older, s.folder / "memory.db")
        s.refused(("GET", "/wake", None), ("POST", "/note", {"text": "after the put-back"}), secret=secret)
        return
    assert (s.folder / "memory.db-wal").stat().st_size > 0
    shutil.copyfile(older, s.folder / "memory.db")
    resp = s.http.request("GET", "/wake", s.token)
    if resp.status_code == 200:
        assert resp.json()["T"] == 7 and secret in resp.text
    else:
        err = assert_error(resp, resp.status_code)
        assert resp.status_code == 500 and err["error"] in REFUSED and secret not in resp.text
