"""Bad days for the disk, against a real ``stash serve``: a full filesystem, a
read-only data folder, a missing user file, a damaged page. Each failing
request gets the error of (docs/DESIGN.md, "HTTP surface") with a message that says what to do; nothing
acknowledged before is lost once the condition clears; another user on the
same server keeps working (or, when the whole disk is affected, keeps every
memory); the server process stays up throughout.

The full disk is a real 6 MiB tmpfs, filled to the last byte; the read-only
folder is a real read-only bind mount over the live data folder (tests run as
root, for whom permission bits do not make anything read-only)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from stash.service.access import Vault
from stash.storage.formats import PAGE_BYTES
from tests.support.api import assert_error, wal_folded
from tests.support.files.disk_space import fill
from tests.support.files.raw import file_key, open_raw
from tests.support.server import CLI_TIMEOUT, REPO, Http, Server

pytestmark = pytest.mark.slow

STORAGE_CODES = {"store.full", "store.read_only", "store.unreadable"}


def mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"mount {args}: {done.stderr} (these tests need root and mount)"


def umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


@contextlib.contextmanager
def serving(data: Path, log: Path, prefix: list[str] | None = None) -> Iterator[tuple[Server, Http]]:
    srv = Server(data=data, log=log, prefix=prefix or []).start()
    http = Http(srv.url)
    try:
        yield srv, http
    finally:
        http.close()
        srv.stop()


def alive(srv: Server, http: Http) -> None:
    assert srv.proc.poll() is None, srv.log_text()[-2000:]
    assert http.get("/health").status_code == 200


class User:
    def __init__(self, http: Http) -> None:
        self.http = http
        ident = http.init()
        self.token, self.user_id = ident["token"], ident["user_id"]
        self.acked: list[str] = []

    def note(self, text: str) -> httpx.Response:
        resp = self.http.post("/note", self.token, json={"text": text})
        if resp.status_code == 200:
            assert resp.json()["id"] == len(self.acked)
            self.acked.append(text)
        return resp

    def assert_all_there(self) -> None:
        """Every acknowledged memory, in order, with its text."""
        body = self.http.ok("GET", "/wake", self.token)
        assert body["T"] == len(self.acked), body
        got = [line.split(" ", 2)[2] for line in body["lines"]]
        assert got == self.acked


@contextlib.contextmanager
def sqlcipher_open(data: Path, token: str):
    """The memory file opened with its key, as its owner's token derives it."""
    vault = Vault(data)
    with vault.session(token, "read") as s:
        path, master = s.files.memory, bytes(s.master)
    conn = open_raw(path, file_key(master), isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


def test_a_full_disk_refuses_writes_clearly_and_loses_nothing(tmp_path: Path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mount("-t", "tmpfs", "-o", "size=6m", "tmpfs", str(disk))
    try:
        with serving(disk / "data", tmp_path / "server.log") as (srv, http):
            a, b = User(http), User(http)
            for k in range(6):
                assert a.note(f"heron before the flood {k}").status_code == 200
                assert b.note(f"ibis before the flood {k}").status_code == 200
            filler = fill(disk)
            answers = [a.note("heron in the flood"), b.note("ibis in the flood"), http.post("/init", json={})]
            for resp in answers:
                body = assert_error(resp, 507, "store.full")
                assert "free space" in body["message"]
            for u in (a, b):  # reads still answer: what is there, or a clear refusal
                resp = u.http.get("/wake", u.token)
                if resp.status_code != 200:
                    assert resp.json()["error"] in STORAGE_CODES, resp.text
            alive(srv, http)
            filler.unlink()
            for u in (a, b):
                u.assert_all_there()
                assert u.note("after the flood").status_code == 200
                u.assert_all_there()
            alive(srv, http)
            assert sorted(p.name for p in (disk / "data" / "users").iterdir()) == sorted([a.user_id, b.user_id])
    finally:
        umount(disk)


def test_a_read_only_data_folder_refuses_writes_and_still_reads(tmp_path: Path):
    data = tmp_path / "data"
    with serving(data, tmp_path / "server.log") as (srv, http):
        a, b = User(http), User(http)
        for k in range(5):
            assert a.note(f"wren {k}").status_code == 200
            assert b.note(f"finch {k}").status_code == 200
        mount("--bind", str(data), str(data))
        try:
            mount("-o", "remount,bind,ro", str(data))
            for resp in (
                a.note("wren on a read-only disk"),
                b.note("finch on a read-only disk"),
                http.post("/init", json={}),
            ):
                body = assert_error(resp, 503, "store.read_only")
                assert "writable" in body["message"]
            a.assert_all_there()
            b.assert_all_there()
            alive(srv, http)
        finally:
            umount(data)
        for u in (a, b):
            assert u.note("writable again").status_code == 200
            u.assert_all_there()
        alive(srv, http)


def test_a_missing_or_replaced_user_file_is_refused_and_others_keep_working(tmp_path: Path):
    data = tmp_path / "data"
    with serving(data, tmp_path / "server.log") as (srv, http):
        a, b = User(http), User(http)
        for k in range(4):
            assert a.note(f"plover {k}").status_code == 200
            assert b.note(f"curlew {k}").status_code == 200
        folder = data / "users" / a.user_id
        aside = tmp_path / "aside"
        aside.mkdir()
        for name, code, status in (("memory.db", "store.missing", 503), ("keyring.db", "store.missing", 503)):
            shutil.move(folder / name, aside / name)
            for resp in (http.get("/wake", a.token), a.note("while a file is gone")):
                body = assert_error(resp, status, code)
                assert "backup" in body["message"] and "stash verify" in body["message"]
            assert not (folder / name).exists()  # no empty stand-in was created
            assert b.note(f"curlew while {name} is gone").status_code == 200
            b.assert_all_there()
            alive(srv, http)
            shutil.move(aside / name, folder / name)
            a.assert_all_there()
        # A file that is there but is not a memory file at all.
        shutil.copyfile(folder / "memory.db", aside / "memory.db")
        (folder / "memory.db").write_bytes(os.urandom((aside / "memory.db").stat().st_size))
        assert_error(http.get("/wake", a.token), 500, "store.damaged")
        b.assert_all_there()
        alive(srv, http)
        shutil.copyfile(aside / "memory.db", folder / "memory.db")
        a.assert_all_there()
        assert a.note("back again").status_code == 200
        a.assert_all_there()


# Root reads any file whatever its mode; without these two capabilities (as a
# server run as an ordinary user would be) a file's mode applies.
WITHOUT_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


def test_an_unreadable_user_file_is_refused_and_others_keep_working(tmp_path: Path):
    data = tmp_path / "data"
    with serving(data, tmp_path / "server.log", WITHOUT_OVERRIDE) as (srv, http):
        a, b = User(http), User(http)
        for k in range(4):
            assert a.note(f"dunlin {k}").status_code == 200
            assert b.note(f"stint {k}").status_code == 200
        folder = data / "users" / a.user_id
        for name in ("memory.db", "keyring.db"):
            (folder / name).chmod(0)
            for resp in (http.get("/wake", a.token), a.note("while unreadable")):
                body = assert_error(resp, 503, "store.unreadable")
                assert "stash verify" in body["message"]
            b.assert_all_there()
            assert b.note(f"stint while {name} is unreadable").status_code == 200
            alive(srv, http)
            (folder / name).chmod(0o600)
            a.assert_all_there()
        assert a.note("readable again").status_code == 200
        a.assert_all_there()


def test_a_damaged_page_is_refused_and_a_restore_brings_everything_back(tmp_path: Path):
    data = tmp_path / "data"
    with serving(data, tmp_path / "server.log") as (srv, http):
        a, b = User(http), User(http)
        for k in range(30):
            assert a.note(f"godwit {k} " + "x" * 200).status_code == 200
        assert b.note("knot").status_code == 200
        backup = tmp_path / "backup"
        done = subprocess.run(
            [sys.executable, "-m", "stash", "backup", str(backup), "--data", str(data)],
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
            cwd=REPO,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        path = data / "users" / a.user_id / "memory.db"
        # 30 sealed rows fit one page: the log table's root page holds them all.
        with sqlcipher_open(data, a.token) as conn:
            (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'log'").fetchone()
            assert conn.execute("SELECT COUNT(*) FROM log").fetchone()[0] == 30
        assert wal_folded(path)  # the server's pool folds a quiet file: the page is in the file now
        raw = bytearray(path.read_bytes())
        raw[(root - 1) * PAGE_BYTES + PAGE_BYTES // 2] ^= 0x40  # one bit in the middle of that page
        path.write_bytes(bytes(raw))
        for resp in (
            http.get("/wake", a.token),
            http.post("/recall", a.token, json={"q": "godwit"}),
            a.note("on a damaged page"),
        ):
            body = assert_error(resp, 500)
            assert body["error"] in ("store.damaged", "store.rolled_back"), body
            assert "godwit" not in resp.text
        b.assert_all_there()
        assert b.note("knot again").status_code == 200
        alive(srv, http)
        # The operator restores this user's folder from the backup, as deploy/README.md says: the server stopped
        # (a running one keeps the files open, their newest writes perhaps still in a WAL beside them).
        srv.stop()
        live = data / "users" / a.user_id
        live.rename(tmp_path / "before-restore")
        shutil.copytree(backup / "users" / a.user_id, live)  # with any WAL beside a file: one state together
        srv.start(same_port=True)
        a.assert_all_there()
        b.assert_all_there()
        alive(srv, http)


@pytest.fixture(autouse=True)
def _no_leftover_mounts(tmp_path: Path) -> Iterator[None]:
    yield
    with open("/proc/self/mounts", encoding="utf-8") as f:
        assert str(tmp_path) not in f.read()
