"""What the `stash` command says, in the words a person reads: a revocation
of a revoked capability says it was revoked already, an empty receipt list
says so, a read token's change of a size is told about sizes, counts agree
with their nouns, `--help` names every scope and never shows a line quoted
on the command line (the skill sends lines on standard input)."""

from __future__ import annotations

import re

import pytest

from tests.support.api import matched
from tests.support.server import Cli, Http

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("cli", ["file"], indirect=True)]


def _as(cli: Cli, token: str) -> Cli:
    return Cli(cli.argv0, {**cli.env, "STASH_TOKEN": token})


def test_what_the_command_says(cli: Cli, http: Http, token: str) -> None:
    assert cli.ok("erasures").strip() == "No erasure receipts: nothing has been erased in this memory."
    minted = cli.ok("grants", "read").splitlines()
    gid = matched(re.search(r"Minted #(\d+)", "\n".join(minted))).group(1)
    assert cli.ok("grants", "revoke", gid).startswith(f"Revoked #{gid}")
    again = cli.run("grants", "revoke", gid)
    assert again.returncode == 0 and "was revoked already" in again.stdout and "Revoked" not in again.stdout
    reader = _as(cli, cli.ok("grants", "read").splitlines()[-1])
    refused = reader.run("config", "WAKE_LINES=10")
    assert refused.returncode != 0 and "/config" in refused.stderr, refused.stderr
    assert "what should be remembered" not in refused.stderr
    assert "what should be remembered" in reader.run("note", "a line").stderr  # a note's refusal keeps its advice
    # Counts agree with their nouns.
    for k in range(2):
        cli.ok("note", f"osprey {k}")
    one = cli.ok("nap", "--batch", "1")
    assert one.startswith("Compress this block into one line") and "these 1" not in one
    dry = cli.ok("memories", "erase", "--words", "osprey 1", "--dry-run")
    assert "memory main: 1 note matches" in dry, dry
    dry = cli.ok("memories", "erase", "--words", "nowhere", "--dry-run")
    assert "memory main: 0 notes match" in dry, dry
    # Help: every scope, and no line quoted on the command line.
    assert "read|append|full" in cli.ok("grants", "--help")
    top = cli.ok("--help")
    assert '"<line>"' not in top and "nap <block> -" in top
