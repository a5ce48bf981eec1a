"""``stash compact`` beside a live ``stash serve --workers 2`` while two
agents note without a pause: a real compact process killed with SIGKILL at
a random instant, then run again to the end. Every note acknowledged is in
the log with its text, no answer was a 5xx, every summary kept what it said
and none of the one-size layout is left, and ``stash verify`` agrees."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from stash.service.access import Vault
from tests.support import loopback
from tests.support.api import CHEAP_KDF, CHEAP_KDF_FLAGS
from tests.support.installed import OUTSIDE
from tests.support.ops.compact import ONE_SIZE, old_store, summaries
from tests.support.ops.verify import run
from tests.support.server import Server

pytestmark = pytest.mark.slow


def test_compact_killed_and_run_again_beside_two_workers_and_two_writers(capsys, monkeypatch, tmp_path: Path) -> None:
    rng = random.Random(2712)
    data = tmp_path / "data"
    T = 20_000
    _, token = old_store(monkeypatch, data, "sqlcipher", T, napped=False)
    vault = Vault(data, kdf=CHEAP_KDF)
    want = summaries(vault, token)
    srv = Server(data=data, log=tmp_path / "server.log", extra=["--workers", "2", *CHEAP_KDF_FLAGS]).start()
    acked: list[list[tuple[int, str]]] = [[], []]
    answers: Counter[int] = Counter()
    stop = threading.Event()

    def note(j: int) -> None:
        with loopback.client(base_url=srv.url, timeout=60.0) as client:
            k = 0
            while not stop.is_set():
                text = f"writer {j} note {k}"
                resp = client.post("/note", json={"text": text}, headers={"Authorization": f"Bearer {token}"})
                answers[resp.status_code] += 1
                if resp.status_code == 200:
                    acked[j].append((resp.json()["id"], text))
                k += 1

    writers = [threading.Thread(target=note, args=(j,), daemon=True) for j in range(2)]
    env = {**os.environ, "STASH_TOKEN": token}
    command = [sys.executable, "-m", "stash", "compact", "--data", str(data)]
    try:
        for w in writers:
            w.start()
        time.sleep(0.5)
        proc = subprocess.Popen(command, cwd=OUTSIDE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.5, 2.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        again = subprocess.run(command, cwd=OUTSIDE, env=env, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stdout + again.stderr
        assert " compacted" in again.stdout, again.stdout
        time.sleep(0.5)  # the writers go on past the compact's end
    finally:
        stop.set()
        for w in writers:
            w.join(timeout=60)
        srv.stop()
    assert all(code < 500 for code in answers), answers
    assert all(acked), answers  # both agents were served throughout
    notes = sorted(pair for writer in acked for pair in writer)
    with vault.session(token, "read") as s:
        assert s.open_memory().mf.count() == T + len(notes)  # nothing lost, nothing written twice
        stored = {i: text for i, _, text in s.open_memory().mf.memories_at([i for i, _ in notes])}
    assert stored == dict(notes)
    now = summaries(vault, token)
    assert {b: v[:3] for b, v in want.items()} == {b: now[b][:3] for b in want}
    assert not any(v[3] in ONE_SIZE for v in now.values())
    code, text = run(capsys, data, token)
    assert code == 0, text
