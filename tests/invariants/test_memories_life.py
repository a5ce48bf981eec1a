"""A random life over several memories of one identity, each checked against
its own OptMem model (tests/support/oracle.py): notes by a bound full capability, by
the owner at /m/{name} and by an append capability, naps, forgets, zooms and
wakes in any order across the memories, and the owner forking a memory at a
random position (the fork's model: the source model's first ``at`` memories
and the summaries inside them, evolving on its own afterwards) and deleting
forks. Every answer is the one the model of that memory gives, no memory
ever shows another's line, and a deleted one answers 404. Seeded: a
Hypothesis-style walk, reproducible."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from stash.web.app import create_app
from tests.support import oracle
from tests.support.api import CHEAP_KDF, Api, make_settings

NAMES = ("main", "alpha", "beta")
pytestmark = pytest.mark.slow  # about 5 s: many requests in process


def test_a_random_life_over_three_memories_matches_one_model_each(data_dir) -> None:
    rng = random.Random("memories-life")
    api = Api(create_app(make_settings(data_dir, kdf=CHEAP_KDF)))

    def today() -> str:
        return dt.datetime.now(dt.UTC).date().isoformat()

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

        deleted: list[str] = []
        for step in range(120):
            n = rng.choice(sorted(models))
            m = models[n]
            op = rng.choice(("note", "note", "append", "nap", "nap", "forget", "zoom", "fork", "delete"))
            if op == "fork" and len(models) < 6:
                at = rng.randrange(0, m.T + 1)
                name = f"fork{step}"
                made = api.post(f"/memories/{n}/fork", owner, json={"name": name, "at": at})
                assert made.status_code == 201 and made.json()["at"] == at, made.text
                copy = oracle.Model()
                copy.notes = m.notes[:at]
                copy.summaries = {b: t for b, t in m.summaries.items() if b[1] <= at}
                models[name] = copy
                full[name] = api.post("/grants", owner, json={"scope": "full", "memory": name}).json()["token"]
                append[name] = api.post("/grants", owner, json={"scope": "append", "memory": name}).json()["token"]
            elif op == "delete" and n not in NAMES:
                assert api.delete(f"/memories/{n}", owner).json()["memories"] == m.T
                del models[n]
                deleted.append(n)
            elif op in ("note", "append"):
                who = rng.choice(("full", "owner")) if op == "note" else "append"
                tok = {"full": full[n], "owner": owner, "append": append[n]}[who]
                text = f"{n} says {step} {rng.choice(['ok', 'it’s done', 'a/b', '#3'])}"
                before = today()
                body = api.post(path(n, "/note", who), tok, json={"text": text}).json()
                day = today()
                assert body["id"] == m.T, (n, who, body)
                if day != before:  # midnight UTC fell inside the request: the date is the one it stored
                    lo = body["id"] // 2 * 2
                    shown = api.get(f"/m/{n}/zoom?block={oracle.bid(lo, lo + 2)}", owner).json()["lines"]
                    day = next(line.split(" ")[1] for line in shown if line.startswith(f"#{body['id']} "))
                m.add_note(day, text)
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
        assert deleted and len(models) > len(NAMES), (deleted, sorted(models))  # this seed forks and deletes
        for n in deleted:
            assert api.get(f"/m/{n}/wake", owner).json()["error"] == "memory.unknown"
            assert api.get("/wake", full[n]).status_code == 401
        assert {r["name"] for r in api.get("/memories", owner).json()["memories"]} == set(models)
        for n, m in models.items():
            while (want := m.first_pending()) is not None:
                api.post("/nap", full[n], json={"block": oracle.bid(*want), "text": "settled"})
                m.settle(want, "settled")
            wake = api.get("/wake", full[n]).json()
            assert wake["lines"] == [m.render(b) for b in oracle.spec_cover(m.T, 96)], n
            everything = api.post(f"/m/{n}/recall", owner, json={"q": "says"}).json()
            assert everything["total"] == m.T
            # Only this memory's own lines (a fork's first ones are its source's, at their positions).
            assert set(everything["matches"]) <= {m.memory_line(i) for i in range(m.T)}, n
    finally:
        api.close()
