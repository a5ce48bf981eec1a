"""kill -9 in the middle of writing.

A child process notes (and answers naps) as fast as it can and prints every
write the store acknowledged; the test SIGKILLs it at a random moment, several
times over on the same store, for both file ciphers. After each kill the store
must open without damage and hold:

- every acknowledged note, with its text, and every acknowledged summary;
- at most one note more than the last acknowledged one — the write that was
  committed but not yet reported — and then it is exactly the next note the
  child was writing;
- dense ids, every row readable (no partial row), triggers in place;
- room for new notes, naps that rebuild what is due, and a valid wake.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from stash.core.sizes import DEFAULTS
from stash.service.access import Vault
from tests.invariants._workers import Child
from tests.support import oracle
from tests.support.api import CHEAP_KDF

pytestmark = pytest.mark.slow

ROUNDS = 4


def test_sigkill_mid_write_loses_nothing_acknowledged(tmp_path: Path, file_cipher: str):
    rng = random.Random(f"crash-{file_cipher}")
    data = tmp_path / "data"
    vault = Vault(data, kdf=CHEAP_KDF, file_cipher=file_cipher)
    ident = vault.create_identity()
    assert ident.file_cipher == file_cipher
    token = ident.token
    acked: dict[int, str] = {}
    acked_blocks: set[tuple[int, int]] = set()

    for rnd in range(ROUNDS):
        with vault.session(token, "full") as s:
            start = s.open_memory().mf.count()
        kid = Child(["crasher", str(data), str(rnd)], token, tmp_path / f"crash{rnd}.err")
        try:
            lines = [kid.next(timeout=60)]
            # kill after a random number of acknowledged notes
            goal = rng.randint(5, 150)
            while sum(line.startswith("n ") for line in lines) < goal:
                lines.append(kid.next(timeout=30))
            # the child is a few writes further by now; a random pause moves
            # the kill to a random point of its write cycle, not a fixed delay
            # after an acknowledgement
            time.sleep(rng.uniform(0, 0.01))
            kid.kill()
            # what the child printed before it died was acknowledged too
            lines += kid.rest(timeout=30)
            assert kid.proc.wait(timeout=30) == -9, kid.stderr()
        finally:
            kid.stop()

        notes = [line.split() for line in lines if line.startswith("n ")]
        ids = [int(n[1]) for n in notes]
        ks = [int(n[2]) for n in notes]
        assert ids == list(range(start, start + len(ids))), "acknowledged ids not dense"
        assert ks == list(range(len(ks)))
        for i, k in zip(ids, ks):
            acked[i] = f"round {rnd} note {k}"
        acked_blocks |= {oracle.parse_bid(line.split()[1]) for line in lines if line.startswith("s ")}
        last = ids[-1]

        with vault.session(token, "owner") as s:
            mem = s.open_memory()
            model = oracle.load_model(mem)  # every row opens: nothing torn
            assert model.T in (last + 1, last + 2), (model.T, last)
            if model.T == last + 2:
                # committed, killed before it was reported: the next note
                assert model.notes[last + 1][1] == f"round {rnd} note {ks[-1] + 1}"
                acked[last + 1] = model.notes[last + 1][1]
            assert {i: model.notes[i][1] for i in acked} == acked
            assert acked_blocks <= set(model.summaries)
            oracle.check_summaries_match_sources(model)
            oracle.check_log_triggers(mem.mf.conn)

            # the store goes on: a new note takes the next id, what is due
            # can be settled, and the wake is whole
            text = f"after round {rnd}"
            days = {mem.today()}
            answer = mem.note(text)
            days.add(mem.today())
            assert answer["id"] == model.T
            date = mem.mf.memory(answer["id"])[1]
            assert date in days
            model.add_note(date, text)
            acked[answer["id"]] = text
            oracle.answer_all(mem, model)
            acked_blocks |= set(model.summaries)
            oracle.check_summaries_match_sources(model)
            oracle.check_wake(mem, model, dict(DEFAULTS))

    with vault.session(token, "read") as s:
        final = oracle.load_model(s.open_memory())
    assert final.notes == model.notes and final.summaries == model.summaries
