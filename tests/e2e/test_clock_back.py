"""A clock set forward and then back (Debian's ``faketime``), on a real
server: the notes written after the clock went back carry the newest date
already in the log, never an earlier one (docs/DESIGN.md, "Memory model";
tests/unit/test_note_dates.py imports such a log's export again)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.server import Http, Server, stop_group


@pytest.mark.slow
def test_notes_under_a_clock_set_forward_then_back_never_go_backwards(tmp_path: Path):
    data, log = tmp_path / "data", tmp_path / "server.log"
    ahead = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    srv = Server(
        data=data, log=log, extra=list(CHEAP_KDF_FLAGS), prefix=["faketime", ahead.strftime("%Y-%m-%d %H:%M:%S")]
    ).start()
    try:
        http = Http(srv.url)
        owner = http.init()["token"]
        http.ok("POST", "/note", owner, json={"text": "a day ahead"})
    finally:
        stop_group(srv)
    srv = Server(data=data, log=log, extra=list(CHEAP_KDF_FLAGS), port=srv.port).start(same_port=True)
    try:
        http = Http(srv.url)
        http.ok("POST", "/note", owner, json={"text": "back on the real clock"})
        lines = http.ok("GET", "/wake", owner)["lines"]
        dates = [line.split(" ")[1] for line in lines]
        assert dates == [ahead.date().isoformat()] * 2, lines
    finally:
        srv.stop()
