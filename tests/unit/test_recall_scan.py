"""Recall over a long log on two cores must answer exactly what one pass does."""

from __future__ import annotations

import random
import re
import sqlite3

import pytest

from stash.core.errors import Damaged
from stash.core.recall import compile_pattern
from stash.crypto.keys import KdfParams
from stash.service import recall_scan
from stash.service.access import Vault
from stash.storage.memfile import SCAN_BATCH
from tests.raw_files import restore_log_triggers

T = 3 * SCAN_BATCH + 77  # the worker takes [0, SCAN_BATCH), this process the rest
WORDS = ["heron", "Yılmaz", "İstanbul", "garden", "shed", "ferry", "kelp", "gato", "Straße"]


def one_pass(lines: list[str], pattern: str, part_bytes: int) -> tuple[list[str], int]:
    """SPEC §2.5 from its words: every matching line, then the newest that fit."""
    hits = [x for x in lines if re.search(pattern, x, re.IGNORECASE)]
    kept: list[str] = []
    size = 0
    for line in reversed(hits):
        cost = len(line.encode()) + 1
        if size + cost > part_bytes:
            break
        kept.insert(0, line)
        size += cost
    return kept, len(hits)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    data = tmp_path_factory.mktemp("recall")
    vault = Vault(data, kdf=KdfParams(1, 1024, 1))
    ident = vault.create_identity()
    rng = random.Random(11)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(T)]
    with vault.session(ident.token, "owner") as s:
        s.memory.mf.append([("2026-01-02", t) for t in texts])
        s.memory.erase([5, SCAN_BATCH + 9], "2026-01-03T00:00:00Z")
    lines = [f"#{i} 2026-01-02 {t}" for i, t in enumerate(texts)]
    for i in (5, SCAN_BATCH + 9):
        lines[i] = f"#{i} 2026-01-02 [erased]"
    return vault, ident.token, lines


@pytest.mark.parametrize("pattern", ["heron", "yilmaz", "ISTANBUL", "^#1", r"\d+ 2026", "erased", "x*", "kelp ferry"])
@pytest.mark.parametrize("part_bytes", [60, 2000, 20_000, 10**9])
def test_two_cores_answer_what_one_pass_does(store, monkeypatch, pattern, part_bytes):
    vault, token, lines = store
    monkeypatch.setattr(recall_scan, "PARALLEL_MIN", 1)
    with vault.session(token, "read") as s:
        got = recall_scan.recall(s.memory.mf, compile_pattern(pattern), pattern, part_bytes, deadline=1e18)
    assert got == one_pass(lines, pattern, part_bytes)


def test_merge_against_one_pass():
    rng = random.Random(3)
    for _ in range(2000):
        lines = [f"#{i} " + "x" * rng.randint(0, 12) for i in range(rng.randint(0, 30))]
        cut = rng.randint(0, len(lines))
        part = rng.randint(0, 120)
        older = one_pass(lines[:cut], "", part)
        newer = one_pass(lines[cut:], "", part)
        assert recall_scan.merge(older, newer, part) == one_pass(lines, "", part)


def test_damage_in_the_workers_half_is_reported(tmp_path, monkeypatch):
    vault = Vault(tmp_path, kdf=KdfParams(1, 1024, 1), file_cipher="none")
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        s.memory.mf.append([("2026-01-02", f"memory {i}") for i in range(2 * SCAN_BATCH + 1)])
    raw = sqlite3.connect(tmp_path / "users" / ident.user_id / "memory.db")
    raw.execute("DROP TRIGGER log_no_update")
    sealed = raw.execute("SELECT sealed FROM log WHERE id = 7").fetchone()[0]
    raw.execute("UPDATE log SET sealed = ? WHERE id = 7", (sealed[:-1] + bytes([sealed[-1] ^ 1]),))
    raw.commit()
    restore_log_triggers(raw)
    raw.close()
    monkeypatch.setattr(recall_scan, "PARALLEL_MIN", 1)
    with vault.session(ident.token, "read") as s, pytest.raises(Damaged):
        s.memory.recall("memory")
