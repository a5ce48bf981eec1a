"""Dates never go backwards (docs/DESIGN.md, "Memory model"): a note is dated
the later of today and the newest memory's date, so a clock set forward and
then back, or set years back, leaves a log whose dates never decrease, and
its export imports again. The clock is injected at the service's seam (the
``today`` it is built with); the files are real."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stash.service.memory import Memory
from stash.storage.memfile import MemoryFile

USER = "00112233aabbccdd"


@pytest.mark.parametrize("cipher", ["none", "sqlcipher"])
def test_a_clock_set_back_dates_notes_on_the_newest_date_and_the_log_imports_again(tmp_path: Path, cipher: str):
    clock = ["2026-12-02"]  # a server started one day ahead
    mf = MemoryFile(tmp_path / "memory.db", USER, os.urandom(32), cipher, create=True)
    copy = MemoryFile(tmp_path / "copy.db", USER, os.urandom(32), cipher, create=True)
    try:
        mem = Memory(mf, today=lambda: clock[0])
        mem.note("written a day ahead")
        mem.note("still ahead")
        clock[0] = "2026-12-01"  # then the real clock
        mem.note("on the real clock")
        clock[0] = "2001-01-01"  # then a clock years back
        mem.note("under a 2001 clock")
        clock[0] = "2026-12-03"  # and forward again
        mem.note("the next day")
        dates = [d for _, d, _ in mf.memories(0, mf.count())]
        assert dates == ["2026-12-02", "2026-12-02", "2026-12-02", "2026-12-02", "2026-12-03"]
        # Its export's lines import into a fresh memory whole, under the same rules.
        entries = [{"date": d, "text": t} for _, d, t in mf.memories(0, mf.count())]
        again = Memory(copy, today=lambda: "2026-12-03")
        assert again.import_entries(entries)["last"] == len(entries) - 1
    finally:
        mf.close()
        copy.close()
