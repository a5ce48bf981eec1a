"""Honest chaos never locks anyone out (tests/invariants/_chaos.py): two
workers with kept-open files, writers, a batch napper, a reader and an owner
rotating, revoking, erasing, forgetting and backing up, and creating,
forking and deleting memories while an agent writes to another, for a few seconds
per seed; bench/chaos.py runs the same for minutes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.invariants import _chaos
from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.server import start_server

SECONDS = 2.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("chaos"), "--workers", "2", "--keep-open", "5", *CHEAP_KDF_FLAGS)
    yield srv
    srv.stop()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_honest_chaos_keeps_every_promise(server, tmp_path: Path, seed: int):
    tally, fulls = _chaos.run(server, seed, SECONDS, tmp_path, pause=(0.05, 0.3), preload=300)
    problems = _chaos.check(server, tally, fulls)
    assert tally.acked and tally.side, "no note was acknowledged"
    assert set(tally.memory_steps) == {"create", "fork", "delete"}, tally.memory_steps
    assert not problems, "\n".join(problems[:20]) + f"\n{tally.statuses}\n" + server.log_text()[-3000:]
