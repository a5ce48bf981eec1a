"""Erasure and batch naps compose, through the ``stash`` client against a real
server: after an erasure the batch the server prints is accepted as printed,
holes and all, and the wake returns once it is written; a nap that saved
nothing exits non-zero with a message."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.support.docs.printed import tail_command
from tests.support.server import Cli, Http, cli_env, path_with


@pytest.fixture
def cli(base_url: str, token: str, client_file: Path) -> Cli:
    """The client file as served at ``GET /client`` (both forms are run by
    test_batch_clients.py; the exit status does not depend on the form)."""
    return Cli([sys.executable, str(client_file)], cli_env(base_url, token, path_with(client_file.parent)))


def answer_batches(cli: Cli) -> int:
    """Follow ``nap --batch`` as printed until nothing is due; how many rounds."""
    for rounds in range(1, 20):
        listed = cli.ok("nap", "--batch", "64")
        if listed.startswith("Nothing left"):
            return rounds
        blocks = re.findall(r"^#(\d+-\d+):$", listed, re.M)
        command = tail_command(listed)
        for b in blocks:
            command = command.replace(f"<your line for {b}>", f"again {b}")
        done = cli.shell(command)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        assert done.stdout.startswith(f"{len(blocks)} summar"), done.stdout
    raise AssertionError("the batches never ended")


@pytest.mark.slow
def test_after_an_erasure_the_printed_batch_fills_the_holes_and_wakes(cli: Cli, http: Http, token: str) -> None:
    entries = [{"date": "2024-05-06", "text": f"m{i}"} for i in range(40)]
    http.ok("POST", "/import", token, json={"entries": entries})
    answer_batches(cli)
    erased = http.ok("POST", "/erase", token, json={"ids": [3, 17, 38]})
    assert erased["erased"] == [3, 17, 38] and erased["dropped"] > 3
    http.ok("POST", "/note", token, json={"text": "after the erasure"})
    http.ok("POST", "/note", token, json={"text": "and one more"})
    # The first batch holds the erasure's holes and the blocks past the frontiers.
    assert answer_batches(cli) >= 2
    woken = cli.run("wake")
    assert woken.returncode == 0, woken.stderr
    assert "You are awake." in woken.stdout and "Cannot wake" not in woken.stdout
    assert http.ok("POST", "/nap", token, json={})["nap"] is None


def test_a_nap_that_saved_nothing_exits_non_zero(cli: Cli, http: Http, token: str) -> None:
    http.ok("POST", "/import", token, json={"entries": [{"date": "2024-05-06", "text": f"m{i}"} for i in range(4)]})
    first = cli.run("nap", "0-1", "the first pair")
    assert first.returncode == 0, first.stderr
    # A resend of a settled block is done, not a failure: its summary stands (issue 30 item 10).
    again = cli.run("nap", "0-1", "the first pair, again")
    assert again.returncode == 0 and "nothing was saved" not in again.stderr, (again.stdout, again.stderr)
    assert "already settled" in again.stdout
    summaries = cli.run("nap", "--summaries", "-", stdin="0-1 once more\n")
    assert summaries.returncode == 1 and "nothing was saved" in summaries.stderr, summaries
    asked = cli.run("nap")
    assert asked.returncode == 0, asked.stderr  # asking what is due saves nothing and means to
