"""A random life over several memories of one identity, each checked against
its own OptMem model (tests/oracle.py): notes by a bound full capability, by
the owner at /m/{name} and by an append capability, naps, forgets, zooms and
wakes in any order across the memories. Every answer is the one the model of
that memory gives, and no memory ever shows another's line. Seeded: a
Hypothesis-style walk, reproducible."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from stash.web.app import create_app
from tests import oracle
from tests.helpers import CHEAP_KDF, Api, make_settings

NAMES = ("main", "alpha", "beta")
pytestmark = pytest.mark.slow  # about 5 s: many requests in process


def test_a_random_life_over_three_memories_matches_one_model_each(data_dir) -> None:
    rng = random.Random("memories-life")
    api = Api(create_app(make_settings(data_dir, kdf=CHEAP_KDF)))
    today = dt.datetime.now(dt.UTC).date().isoformat()
    try:
        owner = api.init()["token"]
        models = {n: oracle.Model() for n in NAMES}
        full, append = {}, {}
        for n in NAMES:
            if n != "main":
                assert api.post("/memories", owner, json={"name": n}).status_code == 201
            full[n] = api.post("/grants", owner, json={"scope": "full", "memory": n}).json()["token"]
            append[n] = api.post("/grants", owner, json={"scope": "append", "memory": n}).json()["token"]

        def path(n: str, route: str, who: str) -> str:
            return route if who != "owner" else f"/m/{n}{route}"

        for step in range(120):
            n = rng.choice(NAMES)
            m = models[n]
            op = rng.choice(("note", "note", "append", "nap", "nap", "forget", "zoom"))
            if op in ("note", "append"):
                who = rng.choice(("full", "owner")) if op == "note" else "append"
                tok = {"full": full[n], "owner": owner, "append": append[n]}[who]
                text = f"{n} says {step} {rng.choice(['ok', 'it’s done', 'a/b', '#3'])}"
                body = api.post(path(n, "/note", who), tok, json={"text": text}).json()
                assert body["id"] == m.T, (n, who, body)
                m.add_note(today, text)
                if who == "append":
                    assert body == {"id": m.T - 1, "nap": None}
            elif op == "nap":
                due = api.post(path(n, "/nap", "full"), full[n], json={}).json()["nap"]
                want = m.first_pending()
                assert (due and oracle.parse_bid(due["block"])) == (want and tuple(want)), (n, due, want)
                if want is not None:
                    assert due["source"] == m.source(*want)
                    api.post("/nap", full[n], json={"block": due["block"], "text": f"sum {n} {step}"})
                    m.settle(want, f"sum {n} {step}")
            elif op == "forget" and m.summaries:
                lo, hi = rng.choice(sorted(m.summaries))
                dropped = api.post(path(n, "/forget", "owner"), owner, json={"block": oracle.bid(lo, hi)}).json()
                gone = m.forget_set(lo, hi)
                assert dropped["dropped"] == [oracle.bid(a, b) for a, b in gone]
                m.drop(gone)
            elif op == "zoom" and m.T >= 2:
                size = 2 ** rng.randrange(1, max(2, m.T.bit_length()))
                lo = rng.randrange(0, max(1, m.T // size)) * size
                if lo < m.T:
                    got = api.get(f"/m/{n}/zoom?block={oracle.bid(lo, lo + size)}", owner).json()["lines"]
                    assert got == m.zoom(lo, lo + size), (n, lo, size)
        for n, m in models.items():
            while (want := m.first_pending()) is not None:
                api.post("/nap", full[n], json={"block": oracle.bid(*want), "text": "settled"})
                m.settle(want, "settled")
            wake = api.get("/wake", full[n]).json()
            assert wake["lines"] == [m.render(b) for b in oracle.spec_cover(m.T, 96)], n
            everything = api.post(f"/m/{n}/recall", owner, json={"q": "says"}).json()
            assert everything["total"] == m.T
            assert all(line.split(" ", 3)[2] == n for line in everything["matches"])  # "<name> says …"
    finally:
        api.close()
