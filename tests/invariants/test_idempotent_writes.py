"""Idempotency under real processes: concurrent requests with one key write
once, and a writer killed at any moment leaves each keyed write either
recorded with its memory or absent with it, so retrying every key afterwards
yields each memory exactly once."""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from stash.service.access import Vault
from stash.service.idempotency import memory_write

pytestmark = pytest.mark.slow

TOKEN_ENV = "STASH_TEST_TOKEN"
WAIT = 60.0
REPO = Path(__file__).resolve().parents[2]

# One keyed note per process, after a "go" line on stdin so that they all
# start together.
RACER = """
import json, os, sys
from pathlib import Path
from stash.service.access import Vault
from stash.service.idempotency import memory_write
vault = Vault(Path(sys.argv[1]))
print("ready", flush=True)
sys.stdin.readline()
with vault.session(os.environ["STASH_TEST_TOKEN"], "full") as s:
    a = memory_write(s, "race", "POST /note", {"text": "once"}, lambda: s.open_memory().note("once"))
print(json.dumps({"body": a.body, "replayed": a.replayed}), flush=True)
"""

# Keyed notes k0, k1, ... until killed; "k" is printed once each is acknowledged.
WRITER = """
import os, sys
from pathlib import Path
from stash.service.access import Vault
from stash.service.idempotency import memory_write
vault = Vault(Path(sys.argv[1]))
token = os.environ["STASH_TEST_TOKEN"]
k = 0
while True:
    with vault.session(token, "full") as s:
        text = f"n{k}"
        memory_write(s, f"k{k}", "POST /note", {"text": text}, lambda: s.open_memory().note(text))
    print(k, flush=True)
    k += 1
"""


def spawn(code: str, data: Path, token: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code, str(data)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, TOKEN_ENV: token},
    )


def texts(vault: Vault, token: str) -> list[str]:
    with vault.session(token, "read") as s:
        return [t for _, _, t in s.open_memory().mf.memories(0, s.open_memory().mf.count())]


@pytest.fixture
def vault(tmp_path: Path) -> Vault:
    return Vault(tmp_path / "data")


def test_concurrent_processes_with_one_key_write_once(vault: Vault):
    token = vault.create_identity().token
    procs = [spawn(RACER, vault.data_dir, token) for _ in range(6)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdin is not None  # piped by spawn
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=WAIT) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=WAIT)
    answers = [json.loads(out) for out, err in outs]
    assert [p.returncode for p in procs] == [0] * 6, [err for _, err in outs]
    assert sum(not a["replayed"] for a in answers) == 1
    assert all({k: v for k, v in a["body"].items() if k != "head"} == {"id": 0, "nap": None} for a in answers)
    assert len({json.dumps(a["body"].get("head"), sort_keys=True) for a in answers}) == 1  # one write, one head
    assert texts(vault, token) == ["once"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_writer_killed_mid_write_leaves_nothing_a_retry_duplicates(vault: Vault, seed: int):
    token = vault.create_identity().token
    rng = random.Random(seed)
    writer = spawn(WRITER, vault.data_dir, token)
    assert writer.stdout is not None and writer.stderr is not None  # piped by spawn
    try:
        acked = -1
        stop_after = rng.randrange(3, 25)
        while acked < stop_after:
            line = writer.stdout.readline()
            assert line, writer.stderr.read()
            acked = int(line)
        writer.send_signal(signal.SIGKILL)  # somewhere inside a write after stop_after
        writer.wait(timeout=WAIT)
        # Acknowledgements it printed before dying that were not read yet.
        acked = max([acked, *(int(line) for line in writer.stdout.read().split())])
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait(timeout=WAIT)
    # The client retries every key it may have sent, and one more.
    last = acked + 2
    for k in range(last + 1):
        with vault.session(token, "full") as s:
            text = f"n{k}"
            answer = memory_write(
                s, f"k{k}", "POST /note", {"text": text}, functools.partial(s.open_memory().note, text)
            )
            # Acknowledged writes replay; the one cut by the kill may go either way.
            assert (answer.replayed == (k <= acked)) or k == acked + 1
            assert s.open_memory().mf.memory(answer.body["id"])[2] == text
    log = texts(vault, token)
    assert sorted(log, key=lambda t: int(t[1:])) == [f"n{k}" for k in range(last + 1)]
