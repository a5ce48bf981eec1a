"""kill -9 at a random instant of an owner action, a batch nap, an import or a
backup, then the same request resent (same Idempotency-Key, same token): no
lockout, nothing half-applied, the resend completes, every acknowledged note
present (tests/invariants/_kill9.py). A rotation in particular is delivered
exactly once (SECURITY.md, "Rotation answers kept for a resend"), and one
sent without a key ends with a working owner token. One trial
per action here, the actions split between the two server setups, seeded
(a backup killed mid-copy only in bench/kill9.py, which runs every action in
both setups, many times)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.invariants import _kill9
from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.server import start_server

SPLIT = {
    "1-worker": ("rotate", "rotate-unkeyed", "forget", "import"),
    "2-workers-kept-open": ("rotate", "rotate-unkeyed", "revoke", "erase", "batch"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(SPLIT))
def test_kill9_then_resend_completes(tmp_path: Path, case: str) -> None:
    server = start_server(tmp_path, *_kill9.CASES[case], *CHEAP_KDF_FLAGS)
    memory = _kill9.Memory(server, random.Random(f"kill9-{case}"), tmp_path)
    try:
        for op in SPLIT[case]:
            memory.trial(op)
        memory.settled_and_whole()
    finally:
        memory.close()
        server.stop()
