"""Scopes shape the instructions (issue 12 item 6): a read capability is never
handed a nap, and a wake refused because summaries are owed tells it who owes
them, with no command it cannot run."""

from __future__ import annotations

import re

from tests.api.support import Mem, mint
from tests.support.api import assert_error


def commands(text: str) -> list[str]:
    return re.findall(r"curl [^\n]*", text)


def test_a_read_capability_never_receives_a_nap(mem: Mem) -> None:
    reader = mint(mem.api, mem.token, "read")
    mem.import_(["a", "b", "c"])  # 0-1 is due, and the wake of 3 memories does not need it
    assert mem.ok(mem.api.get("/wake", mem.token))["nap"]["block"] == "0-1"
    woke = mem.ok(mem.api.get("/wake", reader))
    assert woke["awake"] and woke["nap"] is None
    assert woke["lines"] == [mem.memory_line(i) for i in range(3)]


def test_a_read_capability_refused_a_wake_is_told_the_writer_owes_it(mem: Mem) -> None:
    reader = mint(mem.api, mem.token, "read")
    mem.set_config(WAKE_LINES=2)
    mem.import_(["a", "b", "c", "d"])
    owner_refusal = assert_error(mem.api.get("/wake", mem.token), 409, "wake.needs_nap")
    assert owner_refusal["nap"] is not None
    refusal = assert_error(mem.api.get("/wake", reader), 409, "wake.needs_nap")
    assert refusal["nap"] is None and refusal["needs"] == owner_refusal["needs"]
    assert "writer" in refusal["message"] and "3 compressions" in refusal["message"]
    assert commands(refusal["message"]) == []
    # What it would be told to run, it cannot: the owner's refusal names a nap, a write.
    assert mem.api.post("/nap", reader, json={}).status_code == 403


def test_an_empty_memory_does_not_tell_a_reader_to_note(mem: Mem) -> None:
    reader = mint(mem.api, mem.token, "read")
    assert [s["path"] for s in mem.ok(mem.api.get("/wake", mem.token))["run"]] == ["/note"]
    woke = mem.ok(mem.api.get("/wake", reader))
    assert woke["message"].startswith("No memories yet.\nThis capability is read-only")
    assert woke["message"].endswith("\nYou are awake.") and commands(woke["message"]) == []
    assert woke["run"] == []


def test_a_full_capability_still_gets_its_naps(mem: Mem) -> None:
    writer = mint(mem.api, mem.token, "full")
    mem.import_(["a", "b"])
    assert mem.ok(mem.api.get("/wake", writer))["nap"]["block"] == "0-1"
