"""The whole state is authenticated (docs/DESIGN.md, "Whole-state authentication"; issue 10 item 3, issue 40
item 3): with the server stopped, rows of a real memory file are put back from an older copy, deleted,
spliced in from another history of the same user, or a trigger is dropped — by someone holding the file
key, as a revoked token's holder with an old key ring would — and every page of another history is put
in, one chunk at a time; the restarted server refuses (store.damaged / store.rolled_back) or answers
exactly what the live history holds. Never the old, erased or other history's text."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tarfile
import time
from pathlib import Path

import httpx
import pytest

from tests.support.api import CHEAP_KDF_FLAGS, assert_error, member_bytes, wal_folded
from tests.support.files.whole_state import base_key, raw, rows
from tests.support.server import Http, Server, live_group_members, start_server

pytestmark = pytest.mark.slow

REFUSED = ("store.damaged", "store.rolled_back")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """One server for the tests that stop it to edit a user's files: each test edits a user of its own."""
    with start_server(tmp_path_factory.mktemp("srv"), *CHEAP_KDF_FLAGS) as srv:
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
    def edit(self, restore: bool = True, keep: Path | None = None):
        """The stopped server's file open for a raw edit; ``keep``: a copy
        of the folder as it was before, taken in the same stop."""
        self.server.stop()
        try:
            if keep is not None:
                shutil.copytree(self.folder, keep)
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
    # 1. The key chunk from before the erasure put back: not the chunk the
    # state holds (and the erasure record would win over it).
    with s.edit() as conn:
        conn.execute("UPDATE memory_keys SET sealed = ? WHERE chunk = 0", (chunk,))
    s.refused(("GET", "/wake", None), ("POST", "/recall", {"q": secret}), ("GET", "/export", None), secret=secret)
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
        keep = tmp_path / f"keep-{os.urandom(3).hex()}"
        with s.edit(restore_triggers, keep) as conn:
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
def test_an_older_memory_file_put_back_while_the_server_keeps_it_open_is_refused(
    server: Server, tmp_path: Path, moment: str
):
    """The server keeps a user's files open for a few seconds after each
    request (--keep-open, storage/sqlite/pool.py). A file copied over in place
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


# Pages of another history of the same user (issue 40, finding 2). Two
# histories grow from one copy of a memory of 30 notes: then 20 notes each,
# and every summary (of the shared notes too) written by each. Every 4 KiB and every
# 16 KiB chunk of the other history's memory file is put, in turn, into the
# live one; whatever the chunk holds — log rows with the key chunk that opens
# them, summaries, erasure rows, pages of either cipher, which both
# histories encrypt under the same key — each read is refused or answers
# exactly what the live history answers.

SHARED, EACH = 30, 20
SPLICE_CHUNKS = {"main": (16384,), "alpha": (4096, 16384)}
"""The chunk sizes spliced in each memory: the reported 16 KiB chunks in
both, and every single page in the second memory too (the rows are checked
in one place for every memory, and a page at a time is four times the
requests of the reported case)."""
PAD = "x" * 20  # rows of this size put a key chunk and the rows it opens in one 16 KiB chunk


def _settle(http: Http, token: str, prefix: str, word: str) -> None:
    while (nap := http.ok("POST", f"{prefix}/nap", token, json={})["nap"]) is not None:
        http.ok("POST", f"{prefix}/nap", token, json={"block": nap["block"], "text": f"{word} {nap['block']}"})


def _grow(server: Server, token: str, prefix: str, word: str, first: int, n: int, settle: bool = True) -> None:
    """``n`` notes from #first, each holding ``word``, and (``settle``)
    every summary due, each holding it too: the same lengths in both
    histories, so their files have the same layout and a chunk of one falls
    where it would in the other."""
    http = Http(server.url)
    for i in range(first, first + n):
        http.ok("POST", f"{prefix}/note", token, json={"text": f"{word} {i:02d} {PAD}"})
    if settle:
        _settle(http, token, prefix, word)
    http.close()


def _released(server: Server, path: Path) -> None:
    """Wait until no process of ``server`` holds ``path`` (or its WAL) open:
    with ``--keep-open 0`` a request's files close once its answer has left."""
    assert server.proc is not None
    names = {str(path), f"{path}-wal", f"{path}-shm"}
    deadline = time.monotonic() + 30
    while True:
        held = []
        for pid in live_group_members(server.proc.pid):
            with contextlib.suppress(OSError):
                for fd in Path(f"/proc/{pid}/fd").iterdir():
                    with contextlib.suppress(OSError):
                        if os.readlink(fd) in names:
                            held.append(fd)
        if not held:
            return
        assert time.monotonic() < deadline, f"the server still holds {path.name} open"
        time.sleep(0.01)


def _blocks(T: int) -> list[str]:
    """Every block of every level in a log of ``T``: zooming each shows every
    memory and every summary once."""
    out, size = [], 2
    while size <= T:
        out += [f"{lo}-{lo + size - 1}" for lo in range(0, T - size + 1, size)]
        size *= 2
    return out


def _answers(http: Http, token: str, prefix: str, theirs: str) -> dict[str, httpx.Response]:
    """Every memory and summary read one block at a time, the wake, a recall
    of the other history's word (a scan of every memory) and the export."""
    T = SHARED + EACH
    got = {f"zoom {b}": http.get(f"{prefix}/zoom?block={b}", token) for b in _blocks(T)}
    got["wake"] = http.get(f"{prefix}/wake", token)
    got["recall"] = http.request("POST", f"{prefix}/recall", token, json={"q": theirs})
    got["export"] = http.get(f"{prefix}/export", token)
    return got


def _text(resp: httpx.Response) -> str:
    """What an answer says: an export's members (not their times)."""
    if resp.status_code != 200 or not resp.headers.get("content-type", "").startswith("application/gzip"):
        return resp.text
    with tarfile.open(fileobj=io.BytesIO(resp.content), mode="r:gz") as tar:
        return "\n".join(
            f"{m.name}\n{member_bytes(tar, m).decode()}"
            for m in tar.getmembers()
            if m.isfile() and m.name != "manifest.json"
        )


@pytest.mark.parametrize("memory", ["main", "alpha"])
def test_no_chunk_of_another_history_of_the_same_user_is_served(file_cipher: str, memory: str, tmp_path: Path):
    ours, theirs = f"ours{os.urandom(4).hex()}", f"them{os.urandom(4).hex()}"
    # --keep-open 0: between two requests the server holds no file of the
    # memory, so each chunk is put in as with the server stopped.
    server = start_server(
        tmp_path / "live", *CHEAP_KDF_FLAGS, "--file-cipher", file_cipher, "--keep-open", "0", "--workers", "1"
    )
    try:
        http = Http(server.url)
        token = http.init()["token"]
        prefix = "" if memory == "main" else f"/m/{memory}"
        if memory != "main":
            http.ok("POST", "/memories", token, json={"name": memory})
        inside = Path("users", token[7:23], *(() if memory == "main" else ("m", memory)), "memory.db")
        _grow(server, token, prefix, "shared", 0, SHARED, settle=False)
        server.stop()  # the snapshot both histories grow from
        fork = Server(data=tmp_path / "fork" / "data", log=tmp_path / "fork" / "server.log", extra=list(server.extra))
        shutil.copytree(server.data, fork.data)
        with fork.start():
            _grow(fork, token, prefix, theirs, SHARED, EACH)
        server.start(same_port=True)
        _grow(server, token, prefix, ours, SHARED, EACH)
        http = Http(server.url)
        own = {k: (r.status_code, _text(r)) for k, r in _answers(http, token, prefix, theirs).items()}
        assert all(status == 200 for status, _ in own.values()), own
        assert ours in own["export"][1] and theirs not in own["export"][1]
        path = server.data / inside
        _released(server, path)  # its last close folded the WAL into the file
        live, other = path.read_bytes(), (fork.data / inside).read_bytes()
        assert not Path(f"{path}-wal").exists() and len(live) == len(other)
        served: list[str] = []
        spliced = 0
        for size in SPLICE_CHUNKS[memory]:
            for at in range(0, len(live), size):
                variant = live[:at] + other[at : at + size] + live[at + size :]
                if variant == live:
                    continue
                spliced += 1
                _released(server, path)
                path.write_bytes(variant)
                for name, resp in _answers(http, token, prefix, theirs).items():
                    text = _text(resp)
                    if theirs in text:
                        served.append(f"{size // 1024} KiB chunk #{at // size}: {name} served {text[:200]!r}")
                    elif resp.status_code == 200:
                        assert (200, text) == own[name], (size, at, name, text[:300])
                    else:
                        err = assert_error(resp, 500)
                        assert err["error"] in REFUSED, (size, at, name, resp.text)
        assert spliced >= 3 * len(SPLICE_CHUNKS[memory]), spliced  # the two histories differ in several chunks
        assert not served, "\n".join(served)
        _released(server, path)
        path.write_bytes(live)
        again = _answers(http, token, prefix, theirs)
        assert {k: (r.status_code, _text(r)) for k, r in again.items()} == own
    finally:
        server.stop()
