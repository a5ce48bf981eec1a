"""kill -9 of a real ``stash migrate --file-cipher none`` at a random instant
(a few seeded trials, each on a fresh copy of the same SQLCipher folder):
every memory of every user is afterwards whole in its old form or whole in
its new one — it opens with its token and holds every memory it held — and
running migrate again finishes the move, checked as ``stash verify`` checks."""

from __future__ import annotations

import random
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stash.service import memories as memory_routes
from stash.service.access import Vault
from stash.service.ops.migrate import migrate
from stash.storage import cipher_swap
from stash.storage.sqlite.connections import available_file_cipher
from tests.support.api import CHEAP_KDF
from tests.support.server import REPO

pytestmark = pytest.mark.skipif(available_file_cipher() != "sqlcipher", reason="needs SQLCipher to make old stores")

CHILD = """
import sys
from pathlib import Path
from stash.service.ops.migrate import migrate
print("ready", flush=True)
tokens = sys.stdin.read().split()
migrate(Path(sys.argv[1]), tokens, wait=5.0)
print("done", flush=True)
"""
USERS, NOTES, TRIALS = 3, 3, 3


def read_all(vault: Vault, token: str, name: str) -> list[str]:
    with vault.session(token, "read", memory=name) as s:
        mf = s.open_memory().mf
        return [line for batch in mf.scan(mf.head.count) for line in batch]


def state(folder: Path) -> str:
    """What one memory's files are: 'old' or 'new' (a pending rename counts
    as new: the next open finishes it), or what is wrong."""
    ring = sqlite3.connect(folder / "keyring.db")
    try:
        cipher = ring.execute("SELECT value FROM keyring_meta WHERE name = 'file_cipher'").fetchone()[0]
    finally:
        ring.close()
    with open(folder / "memory.db", "rb") as f:
        plain = f.read(16) == b"SQLite format 3\x00"
    if cipher == "sqlcipher" and not plain:
        return "old"
    if cipher == "none" and (plain or cipher_swap.pending(folder)):
        return "new"
    return f"mixed: key ring says {cipher}, memory.db {'plain' if plain else 'encrypted'}"


@pytest.mark.slow
def test_kill9_mid_migration_leaves_every_memory_old_or_new(tmp_path: Path) -> None:
    rng = random.Random("migrate-kill9")
    made = tmp_path / "made"
    vault = Vault(made, kdf=CHEAP_KDF, file_cipher="sqlcipher")
    owners: dict[str, str] = {}
    for _ in range(USERS):
        ident = vault.create_identity()
        with vault.session(ident.token, "owner") as s:
            for k in range(NOTES):
                s.open_memory().note(f"main {k}")
            memory_routes.create(vault, s, "work")
        with vault.session(ident.token, "full", memory="work") as s:
            for k in range(NOTES):
                s.open_memory().note(f"work {k}")
        owners[ident.user_id] = ident.token
    expected = {(u, n): read_all(vault, t, n) for u, t in owners.items() for n in ("main", "work")}
    seen: set[str] = set()
    # The trials run side by side, each on its own copy, each killed at its own instant.
    datas = [tmp_path / f"trial{trial}" for trial in range(TRIALS)]
    children = []
    for data in datas:
        shutil.copytree(made, data)
        children.append(
            subprocess.Popen(
                [sys.executable, "-c", CHILD, str(data)],
                cwd=REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    for child in children:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    started = time.monotonic()
    for child in children:
        assert child.stdin is not None
        child.stdin.write("\n".join(owners.values()))
        child.stdin.close()
    for at, child in sorted(((rng.uniform(0.0, 0.15), c) for c in children), key=lambda x: x[0]):
        time.sleep(max(0.0, started + at - time.monotonic()))
        child.kill()
    for child, data in zip(children, datas, strict=True):
        child.wait(timeout=30)
        states = {(u, n): state(data / "users" / u / ("m/work" if n == "work" else "")) for u, n in expected}
        assert all(s in ("old", "new") for s in states.values()), states
        seen |= set(states.values())
        after = Vault(data, kdf=CHEAP_KDF)
        for (user_id, name), lines in expected.items():
            assert read_all(after, owners[user_id], name) == lines, (data.name, user_id, name, states)
        results = migrate(data, list(owners.values()), wait=5.0)
        assert all(m.outcome in ("converted", "plain") for r in results for m in r.memories), results
        assert all(r.report is None or r.report.ok for r in results), results
        assert {state(data / "users" / u / ("m/work" if n == "work" else "")) for u, n in expected} == {"new"}
        for (user_id, name), lines in expected.items():
            assert read_all(after, owners[user_id], name) == lines
    print(f"states seen after the kills: {sorted(seen)}")
