"""A long random life of one memory, driven through the service core.

Thousands of notes, every nap answered as it comes due (sometimes a few notes
late), summaries forgotten and rebuilt, sizes changed and restored. After each
step the wake, the naps, zoom, forget and recall are compared with the test's
own record through the model of docs/DESIGN.md in tests/support/oracle.py — never with the block
arithmetic under test.
"""

from __future__ import annotations

import datetime as dt
import random
import re

import pytest

from stash.core.errors import Conflict
from stash.core.sizes import DEFAULTS
from stash.service.access import Vault
from tests.support import oracle
from tests.support.api import CHEAP_KDF

pytestmark = pytest.mark.slow

NOTES = 1200
SEED = 20240611

# Words chosen so recall has to fold case the Unicode way (docs/DESIGN.md, "Recall").
WORDS = [
    "alpha",
    "Gamma",
    "GAMMA",
    "gammaray",
    "Yılmaz",
    "YILMAZ",
    "İstanbul",
    "istanbul",
    "café",
    "naïve",
    "東京",
    "deploy",
    "rollback",
    "schema",
    "ticket",
    "🙂",
    "Ünal",
    "ŞİŞLİ",
    "kernel",
    "delta",
]
RECALL_PATTERNS = ["gamma", "yilmaz", "istanbul", r"delta \d", "café|ünal", "n\\d*7 "]


class Calendar:
    """The service's clock, advanced by the test so that dates move through
    the life (Memory takes its date source as a parameter)."""

    def __init__(self) -> None:
        self.day = dt.date(2023, 12, 30)

    def __call__(self) -> str:
        return self.day.isoformat()

    def advance(self, days: int) -> None:
        self.day += dt.timedelta(days=days)


class Life:
    def __init__(self, mem, rng) -> None:
        self.mem = mem
        self.rng = rng
        self.model = oracle.Model()
        self.sizes = dict(DEFAULTS)
        self.generation = 0
        self.calendar = Calendar()
        mem.today = self.calendar
        self.revert_at: int | None = None
        self.naps_answered = 0
        self.refusals = 0
        self.forgets = 0
        self.multipart = 0
        self.lowered = 0

    # -------------------------------------------------------------- steps

    def note(self) -> dict | None:
        i = self.model.T
        words = self.rng.sample(WORDS, self.rng.randint(1, 5))
        text = f"n{i} " + " ".join(words) + f" delta {self.rng.randint(0, 999)}"
        if self.rng.random() < 0.03:
            # near the byte limit, multi-byte characters included
            text += " " + "é" * ((280 - len(text.encode()) - 1) // 2)
        answer = self.mem.note(text)
        assert answer["id"] == i
        self.model.add_note(self.calendar(), text)
        oracle.check_nap(answer["nap"], self.model, self.sizes["ENTRY_CHARS"])
        return answer["nap"]

    def summary_text(self, lo: int, hi: int) -> str:
        tail = " Ω ü" if (lo // (hi - lo)) % 3 == 0 else ""
        return f"S{oracle.bid(lo, hi)} g{self.generation}{tail}"

    def answer_all(self) -> None:
        nap = self.mem.nap()["nap"]
        oracle.check_nap(nap, self.model, self.sizes["ENTRY_CHARS"])
        while nap is not None:
            lo, hi = oracle.parse_bid(nap["block"])
            text = self.summary_text(lo, hi)
            answer = self.mem.nap(nap["block"], text)
            assert answer["saved"] == nap["block"]
            self.model.settle((lo, hi), text)
            self.naps_answered += 1
            nap = answer["nap"]
            oracle.check_nap(nap, self.model, self.sizes["ENTRY_CHARS"])
        assert self.model.first_pending() is None

    def wake(self) -> None:
        """With nothing pending the wake must never refuse, and must be
        exactly the model's document."""
        assert self.model.first_pending() is None
        doc, parts, budget = oracle.check_wake(self.mem, self.model, self.sizes)
        self.multipart += parts > 1
        self.lowered += budget < self.sizes["WAKE_LINES"] and len(doc) > oracle.popcount(self.model.T)

    def wake_while_due(self) -> None:
        """Naps are due: the wake (docs/DESIGN.md, "Wake") refuses only when the document needs a
        block that has no summary, and then names it and carries the nap."""
        assert self.sizes["WAKE_CHARS"] == DEFAULTS["WAKE_CHARS"]
        T = self.model.T
        cover = oracle.spec_cover(T, self.sizes["WAKE_LINES"])
        missing = [b for b in cover if b[1] - b[0] > 1 and b not in self.model.summaries]
        if missing:
            with pytest.raises(Conflict) as refused:
                self.mem.wake()
            err = refused.value
            assert err.status == 409 and err.code == "wake.needs_nap"
            assert oracle.parse_bid(err.extra["needs"]) in missing
            oracle.check_nap(err.extra["nap"], self.model, self.sizes["ENTRY_CHARS"])
            self.refusals += 1
            return
        # not refused: the due nap rides on the last part (checked in check_wake)
        oracle.check_wake(self.mem, self.model, self.sizes)

    def forget(self) -> None:
        if not self.model.summaries:
            return
        settled = sorted(self.model.summaries)
        recent = [b for b in settled if b[0] >= self.model.T - 128]
        # mostly recent ones (cheap to rebuild), sometimes anywhere in the past
        lo, hi = self.rng.choice(recent if recent and self.rng.random() < 0.75 else settled)
        want = self.model.forget_set(lo, hi)
        answer = self.mem.forget(oracle.bid(lo, hi))
        assert answer["dropped"] == [oracle.bid(*b) for b in want]
        self.model.drop(want)
        self.forgets += 1
        self.generation += 1
        # the log is untouched by forget
        assert self.mem.mf.count() == self.model.T

    def wrong_nap(self) -> None:
        """A summary for any block but the first pending one writes nothing:
        "already settled" for a settled block, 409 for a later pending one."""
        first = self.model.first_pending()
        complete = self.model.complete_blocks()
        if not complete:
            return
        lo, hi = self.rng.choice(complete)
        if (lo, hi) == first:
            return
        if (lo, hi) in self.model.summaries:
            answer = self.mem.nap(oracle.bid(lo, hi), "overwrite attempt")
            assert answer["saved"] is None
            # the parent's zoom shows the stored summary, unchanged
            parent = lo - lo % (2 * (hi - lo))
            shown = self.mem.zoom(oracle.bid(parent, parent + 2 * (hi - lo)))["lines"]
            assert shown == self.model.zoom(parent, parent + 2 * (hi - lo))
        else:
            with pytest.raises(Conflict) as wrong:
                self.mem.nap(oracle.bid(lo, hi), "out of order")
            assert wrong.value.code == "nap.wrong_block"
            assert first is not None
            assert wrong.value.extra["due"] == oracle.bid(*first)

    def zoom(self) -> None:
        T = self.model.T
        if not T:
            return
        size = 2 ** self.rng.randint(1, max(1, (T - 1).bit_length()))
        lo = self.rng.randrange(0, T, size) if size <= T else 0
        lo -= lo % size
        answer = self.mem.zoom(oracle.bid(lo, lo + size))
        assert answer["block"] == oracle.bid(lo, lo + size)
        assert answer["lines"] == self.model.zoom(lo, lo + size)

    def configure(self, step: int) -> None:
        """Change one size. The byte and part sizes make every wake read cost
        more, so they are restored to their defaults (null) a little later."""
        name = self.rng.choice(["WAKE_LINES", "WAKE_LINES", "PART_LINES", "PART_CHARS", "WAKE_CHARS"])
        if name == "WAKE_LINES":
            self.set_sizes({name: self.rng.choice([None, self.rng.randint(8, 120)])})
            return
        if name == "PART_LINES":
            value = self.rng.randint(8, 60)
        elif name == "PART_CHARS":
            # at least one longest line (id + date + 280 bytes + newline)
            value = self.rng.randint(600, 4000)
        else:
            value = self.rng.randint(1500, 5000)
        self.set_sizes({name: value})
        self.revert_at = step + self.rng.randint(20, 60)

    def set_sizes(self, change: dict) -> None:
        answer = self.mem.set_config(change)
        for n, v in change.items():
            self.sizes[n] = DEFAULTS[n] if v is None else v
        assert answer["sizes"] == self.sizes
        assert answer["defaults"] == DEFAULTS
        assert self.mem.config()["sizes"] == self.sizes

    def recall(self) -> None:
        lines = [self.model.memory_line(i) for i in range(self.model.T)]
        for pattern in RECALL_PATTERNS:
            want = [x for x in lines if re.search(pattern, x, re.IGNORECASE)]
            answer = self.mem.recall(pattern)
            assert answer["total"] == len(want), (pattern, answer["total"], len(want))
            got = answer["matches"]
            # the newest matches that fit PART_CHARS, oldest first
            assert got == want[len(want) - len(got) :], pattern
            assert sum(oracle.cost(x) for x in got) <= self.sizes["PART_CHARS"]
            if len(got) < len(want):
                older = want[len(want) - len(got) - 1]
                assert sum(oracle.cost(x) for x in got) + oracle.cost(older) > self.sizes["PART_CHARS"], pattern


def test_long_random_life_keeps_the_wake_a_valid_cover(tmp_path):
    rng = random.Random(SEED)
    vault = Vault(tmp_path, kdf=CHEAP_KDF)
    token = vault.create_identity().token
    with vault.session(token, "owner") as s:
        life = Life(s.open_memory(), rng)
        oracle.check_wake(life.mem, life.model, life.sizes)  # the empty memory
        late = 0
        for step in range(NOTES):
            if rng.random() < 0.02:
                life.calendar.advance(rng.randint(0, 3))
            nap = life.note()
            if nap is not None and late < 6 and rng.random() < 0.1:
                late += 1  # leave it due for a few notes
                if step % 2 == 0 and life.sizes["WAKE_CHARS"] == DEFAULTS["WAKE_CHARS"]:
                    life.wake_while_due()
                continue
            late = 0
            life.answer_all()
            if life.revert_at is not None and step >= life.revert_at:
                life.set_sizes({"PART_LINES": None, "PART_CHARS": None, "WAKE_CHARS": None})
                life.revert_at = None
                life.wake()
            elif step % (3 if life.revert_at is None else 9) == 0 or life.model.T <= 40:
                life.wake()
            roll = rng.random()
            if roll < 0.012:
                life.forget()
                if life.sizes["WAKE_CHARS"] == DEFAULTS["WAKE_CHARS"]:
                    life.wake_while_due()
                life.answer_all()
                life.wake()
            elif roll < 0.024 and life.revert_at is None:
                life.configure(step)
                life.wake()
            elif roll < 0.034:
                life.wrong_nap()
            elif roll < 0.06:
                life.zoom()
            if step % 400 == 399:
                life.recall()
        life.answer_all()
        final = oracle.check_wake(life.mem, life.model, life.sizes)[0]
        life.recall()
        sizes = dict(life.sizes)

    # the life really exercised what it claims to
    assert life.model.T == NOTES
    assert life.forgets >= 10 and life.refusals >= 5 and life.naps_answered > NOTES
    assert life.multipart >= 10 and life.lowered >= 3

    # a fresh session reads the same document from disk
    with vault.session(token, "read") as s:
        assert s.open_memory().sizes == sizes
        again = [line for part in oracle.collect_wake(s.open_memory()) for line in part["lines"]]
        assert again == final
