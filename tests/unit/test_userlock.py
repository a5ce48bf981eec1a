"""The user lock that makes a keyless backup consistent: a backup waits for
the requests that have the files open, and requests that come after it wait
for the backup instead of starving it. Real flock on real files; each holder
opens its own file, as separate requests (or processes) do."""

from __future__ import annotations

import threading
from pathlib import Path

from stash.storage import userlock

WAIT_S = 10.0
SETTLE_S = 0.3  # how long a blocked holder is given to (wrongly) get in


def holder(fn, got: threading.Event, release: threading.Event) -> threading.Thread:
    def run() -> None:
        with fn():
            got.set()
            release.wait(WAIT_S)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_backup_waits_for_open_requests_and_later_requests_wait_for_it(tmp_path: Path):
    folder = tmp_path / "user"
    folder.mkdir()
    first_got, first_go = threading.Event(), threading.Event()
    backup_got, backup_go = threading.Event(), threading.Event()
    later_got, later_go = threading.Event(), threading.Event()

    first = holder(lambda: userlock.shared(folder), first_got, first_go)
    assert first_got.wait(WAIT_S)
    backup = holder(lambda: userlock.exclusive(folder), backup_got, backup_go)
    assert not backup_got.wait(SETTLE_S)  # a request has the files open
    later = holder(lambda: userlock.shared(folder), later_got, later_go)
    assert not later_got.wait(SETTLE_S)  # queued behind the backup, not ahead of it

    first_go.set()
    assert backup_got.wait(WAIT_S)
    assert not later_got.wait(SETTLE_S)  # still held off while the copy is taken
    backup_go.set()
    assert later_got.wait(WAIT_S)
    later_go.set()
    for t in (first, backup, later):
        t.join(WAIT_S)
        assert not t.is_alive()


def test_requests_share_the_lock(tmp_path: Path):
    folder = tmp_path / "user"
    folder.mkdir()
    events = [(threading.Event(), threading.Event()) for _ in range(3)]
    threads = [holder(lambda: userlock.shared(folder), got, go) for got, go in events]
    assert all(got.wait(WAIT_S) for got, _ in events)  # all three at once
    for _, go in events:
        go.set()
    for t in threads:
        t.join(WAIT_S)
