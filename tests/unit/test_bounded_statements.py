"""Every statement over a file is bounded, and the server's shutdown ends
what still runs (storage/safeopen.py; docs/DESIGN.md, "Formats" and
"Shutdown"): on real files, both ciphers, the connections the server opens
(connections.connect) and those the tools open."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from stash.storage import disk_errors, safeopen
from stash.storage.formats import PAGE_BYTES
from stash.storage.sqlite import connections
from stash.web.app import create_app
from tests.support.api import Api, make_settings

ENDLESS = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"
ROWS = 40_000  # about 16 steps a row: 640,000 steps, under BOUND, and two of them over it
COUNTED = f"WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r LIMIT {ROWS}) SELECT count(*) FROM r"
BOUND = 100 * safeopen.PROGRESS_STEPS
JOIN_S = 60.0  # what a thread is given to end once stopped; it runs without end otherwise


@pytest.fixture
def resumed() -> Iterator[None]:
    """The process-wide stop is lifted again whatever the test did."""
    try:
        yield
    finally:
        safeopen.resume_all()


def key_for(cipher: str) -> bytes | None:
    return os.urandom(32) if cipher == "sqlcipher" else None


def open_file(path: Path, cipher: str, key: bytes | None, steps: int):
    return safeopen.open_file(path, cipher=cipher, key=key, page=PAGE_BYTES, steps=steps, check_same_thread=False)


def test_a_statement_past_its_bound_ends_and_is_reported_as_damage(tmp_path: Path, file_cipher: str):
    conn = open_file(tmp_path / "memory.db", file_cipher, key_for(file_cipher), BOUND)
    try:
        # The bound is per statement: each of these alone is under it, all of them together far over.
        for _ in range(3):
            assert conn.execute(COUNTED).fetchone() == (ROWS,)
            assert conn.cursor().execute(COUNTED).fetchone() == (ROWS,)
        with pytest.raises(disk_errors.DB_ERRORS) as ended:
            conn.execute(ENDLESS).fetchone()
        assert safeopen.interrupted(ended.value)
        err = disk_errors.storage_error(ended.value)
        assert err is not None and err.code == "store.damaged"
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the connection goes on
    finally:
        safeopen.close(conn)


def _run_in_thread(conn) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def spin() -> None:
        try:
            out["row"] = conn.execute(ENDLESS).fetchone()
        except Exception as exc:
            out["error"] = exc

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    return thread, out


def test_the_stop_ends_a_statement_running_in_another_thread(tmp_path: Path, file_cipher: str, resumed: None):
    """A connection as the server opens it, caught in a statement with no
    bound of its own: the stop ends it, as ``server.stopping``; a short
    statement (a fold, a close) still runs while stopping."""
    path, key = tmp_path / "memory.db", key_for(file_cipher)
    connections.close_now(path, connections.connect(path, file_key=key, cipher=file_cipher, create=True))
    conn = open_file(path, file_cipher, key, 2**62)
    try:
        thread, out = _run_in_thread(conn)
        safeopen.stop_all()
        thread.join(JOIN_S)
        assert not thread.is_alive(), "the stop did not end the statement"
        assert "error" in out and safeopen.interrupted(out["error"]), out
        err = disk_errors.storage_error(out["error"])
        assert err is not None and (err.status, err.code) == (503, "server.stopping")
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone() is not None
    finally:
        safeopen.close(conn)


@pytest.mark.parametrize("owns_process", [True, False])
def test_a_servers_shutdown_stops_the_work_of_its_process(tmp_path: Path, owns_process: bool, resumed: None):
    """A ``stash serve`` worker's app (owns_process) ends what still runs in
    its files when it shuts down; an app that is one of several in a process
    (the tests') leaves the others' work alone."""
    api = Api(create_app(make_settings(tmp_path / "data"), owns_process=owns_process))
    path = tmp_path / "keyring.db"
    connections.close_now(path, connections.connect(path, file_key=None, cipher="none", create=True))
    conn = connections.connect(path, file_key=None, cipher="none")
    try:
        thread, out = _run_in_thread(conn)
        api.close()
        assert safeopen.stopping() is owns_process
        if not owns_process:
            safeopen.stop_all()  # what ends it here
        thread.join(JOIN_S)
        assert not thread.is_alive() and safeopen.interrupted(out["error"]), out
    finally:
        safeopen.close(conn)
