"""An append capability's note takes the memory's lock before it begins its
transaction on the key ring, the order every read-capable request takes
them in (it holds the lock shared while it writes the key ring: the fold of
waiting notes, the copy of the head, an audit event). In the other order the
two waited on each other until SQLite's busy timeout (30 s): an owner's
erasure under append traffic hung so (service/append.py, ``noting``)."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from pathlib import Path

import httpx

from stash.storage import userlock
from stash.web.app import create_app
from tests.support.api import Api, make_settings


def gate_held_exclusive(folder: Path) -> bool:
    """Someone holds the user's gate exclusive: a request queued for the lock exclusive (userlock.py)."""
    fd = os.open(folder / userlock.GATE_NAME, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_a_waiting_append_note_holds_no_write_lock_of_the_key_ring(data_dir: Path) -> None:
    api = Api(create_app(make_settings(data_dir, file_cipher="none")))
    other = Api(create_app(make_settings(data_dir, file_cipher="none")))  # as a second worker
    try:
        ident = api.init()
        owner, folder = ident["token"], data_dir / "users" / ident["user_id"]
        append = api.post("/grants", owner, json={"scope": "append"}).json()["token"]
        assert api.get("/wake", owner).status_code == 200  # an open records the inbox key notes are sealed to
        answers: list[httpx.Response] = []
        held = userlock.UserLock(folder)
        held.acquire_shared()  # as a read-capable request holds it
        try:
            note = threading.Thread(
                target=lambda: answers.append(other.post("/note", append, json={"text": "noted while a reader works"}))
            )
            note.start()
            deadline = time.monotonic() + 30
            while not gate_held_exclusive(folder):  # the note now waits for the lock exclusive
                assert time.monotonic() < deadline and note.is_alive(), "the note never queued for the lock"
                time.sleep(0.01)
            # What the reader does next: write the key ring. Before the fix the waiting note held its write lock.
            ring = sqlite3.connect(folder / "keyring.db", timeout=1.0, isolation_level=None)
            try:
                ring.execute("BEGIN IMMEDIATE")
                ring.execute("ROLLBACK")
            finally:
                ring.close()
        finally:
            held.release()
        note.join(timeout=60)
        assert answers and answers[0].status_code == 200, answers and answers[0].text
    finally:
        other.close()
        api.close()
