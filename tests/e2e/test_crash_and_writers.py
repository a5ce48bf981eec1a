"""A real ``stash serve`` (one worker and two) killed with SIGKILL while client
processes note, nap and read as fast as they can; and client processes racing
each other on one memory.

What must hold, whatever the interleaving and wherever the kill lands:

- every acknowledged note is stored once, at the id it was acknowledged with,
  with its exact text; a note that got no answer is stored at most once, with
  its exact text; nothing else is stored, and ids are dense from 0;
- every acknowledged summary is stored; every level of the tree is a dense
  prefix and every summary was written from its own block's lines;
- no answer is ever a 5xx or shows a line that is not whole;
- after the naps still due are answered, the wake is exactly what docs/DESIGN.md, "Memory model",
  derives from the stored log and tree (tests/support/oracle.py).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest

from stash.core.sizes import DEFAULTS
from stash.service.access import Vault
from tests.support import oracle
from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.server import REPO, Http, Server, start_server

pytestmark = pytest.mark.slow

KILLS = 3
NOTERS = 3
ACKS_BETWEEN_KILLS = 25
WAIT_S = 90.0
TOKEN_ENV = "STASH_TEST_TOKEN"

workers = pytest.mark.parametrize("n_workers", [1, 2], ids=["1-worker", "2-workers"])


def spawn(mode: str, *args: str, token: str, stdin: bool = False) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.e2e._http_clients", mode, *args],
        cwd=REPO,
        env={**os.environ, TOKEN_ENV: token, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def pipe(stream: IO[str] | None) -> IO[str]:
    """A stream spawn piped."""
    assert stream is not None, "not piped"
    return stream


def records(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    # A line is whole once its newline is written; a line still being written is read next time.
    text = path.read_text(encoding="utf-8")
    return [line.split(" ") for line in text.splitlines(keepends=True) if line.endswith("\n")]


def wait_for(cond, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def finish(procs: list[subprocess.Popen], outs: list[Path]) -> None:
    for out in outs:
        Path(str(out) + ".stop").touch()
    for p in procs:
        try:
            assert p.wait(timeout=60) == 0, pipe(p.stderr).read()
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def new_server(tmp: Path, n_workers: int) -> tuple[Server, str]:
    server = start_server(tmp, "--workers", str(n_workers), *CHEAP_KDF_FLAGS)
    http = Http(server.url)
    try:
        token = http.init()["token"]
    finally:
        http.close()
    return server, token


def stored_model(data: Path, token: str) -> oracle.Model:
    """The store read straight from its files: ids dense, every row opens,
    every level a dense prefix (oracle.load_model checks those on the way)."""
    with Vault(data).session(token, "read") as s:
        return oracle.load_model(s.open_memory())


@workers
def test_sigkill_the_server_mid_stream_loses_nothing_acknowledged(tmp_path: Path, n_workers: int):
    rng = random.Random(f"server-crash-{n_workers}")
    server, token = new_server(tmp_path, n_workers)
    outs = [tmp_path / f"c{k}.out" for k in range(NOTERS)]
    read_out = tmp_path / "reader.out"
    procs = [
        spawn("noter", server.url, str(out), f"c{k}", "1" if k % 2 == 0 else "0", token=token)
        for k, out in enumerate(outs)
    ]
    procs.append(spawn("reader", server.url, str(read_out), token=token))
    try:

        def acked() -> int:
            return sum(r[0] == "a" for out in outs for r in records(out))

        for _ in range(KILLS):
            goal = acked() + ACKS_BETWEEN_KILLS
            wait_for(lambda goal=goal: acked() >= goal, f"{goal} acknowledged notes")
            # a random moment of the write cycle, not a fixed delay after an answer
            time.sleep(rng.uniform(0, 0.03))
            server.kill9()
            server.start(same_port=True)
        goal = acked() + ACKS_BETWEEN_KILLS
        wait_for(lambda: acked() >= goal, "notes after the last restart")
        wait_for(lambda: any(r == ["r\n"] for r in records(read_out)), "a whole read")
    finally:
        finish(procs, [*outs, read_out])
        server.stop()

    # What the clients were told, and what they were not.
    acked_notes: dict[int, str] = {}
    unknown: set[str] = set()
    saved: set[tuple[int, int]] = set()
    for k, out in enumerate(outs):
        for rec in records(out):
            kind, args = rec[0].strip(), [a.strip() for a in rec[1:]]
            assert kind != "e", f"client c{k} got a forbidden answer: {rec}"
            if kind == "a":
                assert int(args[0]) not in acked_notes, f"#{args[0]} acknowledged twice"
                acked_notes[int(args[0])] = f"c{k} note {args[1]}"
            elif kind == "u":
                unknown.add(f"c{k} note {args[0]}")
            elif kind == "s":
                saved.add(oracle.parse_bid(args[0]))
    assert not [r for r in records(read_out) if r[0] == "e"], "the reader saw a 5xx or a torn line"
    assert unknown, "no request was cut by a kill: the test did not test a crash"
    assert saved, "no client settled a nap"

    model = stored_model(server.data, token)
    texts = [text for _, text in model.notes]
    for i, text in acked_notes.items():
        assert model.notes[i][1] == text, (i, model.notes[i], text)
    assert len(texts) == len(set(texts)), "a note is stored twice"
    assert set(texts) <= set(acked_notes.values()) | unknown, "a stored note nobody wrote"
    assert saved <= set(model.summaries), "an acknowledged summary is gone"
    oracle.check_summaries_match_sources(model)

    # The store goes on: what is due is answered, then the wake (over HTTP,
    # from the restarted server) is exactly the oracle's.
    with Vault(server.data).session(token, "full") as s:
        oracle.answer_all(s.open_memory(), model)
        oracle.check_log_triggers(s.open_memory().mf.conn)
    server.start()
    http = Http(server.url)
    try:
        first = http.ok("GET", "/wake", token)
        parts = [first] + [
            http.ok("GET", "/wake", token, params={"part": p, "T": first["T"]}) for p in range(2, first["parts"] + 1)
        ]
    finally:
        http.close()
        server.stop()
    doc = oracle.check_parts(parts, model.T, dict(DEFAULTS))
    want, _ = oracle.expected_doc(model, dict(DEFAULTS), doc)
    assert doc == want
    oracle.check_nap(parts[-1]["nap"], model)


# ---------------------------------------------------------------- parallel writers


@workers
def test_processes_noting_at_once_get_unique_contiguous_ids(tmp_path: Path, n_workers: int):
    server, token = new_server(tmp_path, n_workers)
    count = 30
    outs = [tmp_path / f"c{k}.out" for k in range(4)]
    procs = [spawn("noter", server.url, str(out), f"c{k}", "0", str(count), token=token) for k, out in enumerate(outs)]
    try:
        for p in procs:
            assert p.wait(timeout=WAIT_S) == 0, pipe(p.stderr).read()
        ids: dict[int, str] = {}
        for k, out in enumerate(outs):
            recs = records(out)
            assert all(r[0] == "a" for r in recs), recs
            assert len(recs) == count
            for _, i, n in recs:
                assert int(i) not in ids, f"#{i} given twice"
                ids[int(i)] = f"c{k} note {n.strip()}"
        assert sorted(ids) == list(range(4 * count))
        model = stored_model(server.data, token)
        assert {i: text for i, (_, text) in enumerate(model.notes)} == ids
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        server.stop()


class Racers:
    """Client processes, each with its connection open, released at once."""

    def __init__(self, url: str, token: str, n: int) -> None:
        self.procs = [spawn("oneshot", url, token=token, stdin=True) for _ in range(n)]
        for p in self.procs:
            assert pipe(p.stdout).readline().strip() == "ready", pipe(p.stderr).read()

    def race(self, requests: list[dict]) -> list[dict]:
        lines = [json.dumps(r) + "\n" for r in requests]
        for p, line in zip(self.procs, lines):
            pipe(p.stdin).write(line)
        for p in self.procs:
            pipe(p.stdin).flush()
        return [json.loads(pipe(p.stdout).readline()) for p in self.procs]

    def close(self) -> None:
        for p in self.procs:
            pipe(p.stdin).close()
            try:
                p.wait(timeout=30)
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=10)


@workers
def test_two_clients_settling_the_same_nap_write_one_summary(tmp_path: Path, n_workers: int):
    server, token = new_server(tmp_path, n_workers)
    http = Http(server.url)
    racers = Racers(server.url, token, 2)
    try:
        for n in range(16):
            nap = http.ok("POST", "/note", token, json={"text": f"c0 note {n}"})["nap"]
            while nap is not None:
                block = nap["block"]
                answers = racers.race(
                    [
                        {"method": "POST", "path": "/nap", "json": {"block": block, "text": f"{block} by {who}"}}
                        for who in ("A", "B")
                    ]
                )
                assert [a["status"] for a in answers] == [200, 200], answers
                won = [a for a in answers if a["body"]["saved"] == block]
                lost = [a for a in answers if a["body"]["saved"] is None]
                assert len(won) == 1 and len(lost) == 1, answers
                assert "already settled" in lost[0]["body"]["message"], lost
                zoomed = http.ok("GET", "/zoom", token, params={"block": block})
                assert zoomed["block"] == block
                winner = "A" if won[0] is answers[0] else "B"
                lo, hi = oracle.parse_bid(block)
                with Vault(server.data).session(token, "read") as s:
                    assert s.open_memory().mf.summary(lo, hi) == f"{block} by {winner}"
                nap = won[0]["body"]["nap"]
        model = stored_model(server.data, token)
        assert model.first_pending() is None and len(model.summaries) == 15
    finally:
        racers.close()
        http.close()
        server.stop()


@workers
def test_a_forget_racing_a_nap_leaves_every_level_a_dense_prefix(tmp_path: Path, n_workers: int):
    server, token = new_server(tmp_path, n_workers)
    http = Http(server.url)
    racers = Racers(server.url, token, 2)
    rng = random.Random(f"forget-race-{n_workers}")
    try:
        for n in range(16):
            http.ok("POST", "/note", token, json={"text": f"c0 note {n}"})
        for _ in range(8):
            # settle the bottom level, so a block above it is due
            nap = http.ok("POST", "/nap", token, json={})["nap"]
            while nap is not None and nap["block"] != "0-3":
                block = nap["block"]
                nap = http.ok("POST", "/nap", token, json={"block": block, "text": f"{block} x"})["nap"]
            assert nap is not None and nap["block"] == "0-3", nap
            forget = rng.choice(["0-1", "2-3"])
            answers = racers.race(
                [
                    {"method": "POST", "path": "/forget", "json": {"block": forget}},
                    {"method": "POST", "path": "/nap", "json": {"block": "0-3", "text": "0-3 x"}},
                ]
            )
            assert answers[0]["status"] == 200, answers
            assert answers[1]["status"] in (200, 409), answers
            if answers[1]["status"] == 409:
                assert answers[1]["body"]["error"] == "nap.wrong_block"
            model = stored_model(server.data, token)  # every level a dense prefix
            for lo, hi in model.summaries:
                if hi - lo > 2:
                    mid = (lo + hi) // 2
                    assert (lo, mid) in model.summaries and (mid, hi) in model.summaries, (lo, hi)
            # whichever came first, the forget has the last word: the pair is
            # gone, and so is anything built over it
            assert oracle.parse_bid(forget) not in model.summaries
            assert (0, 4) not in model.summaries
    finally:
        racers.close()
        http.close()
        server.stop()
