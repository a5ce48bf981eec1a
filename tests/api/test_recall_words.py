"""Recall by words (docs/DESIGN.md, "Word search"), over HTTP: prefixes,
folding, every word counting, scores best first with ties newer first, and
paging by ``more`` with no match twice and none missing — also across the
word index's pieces (4,096 memories each) and while notes and an erasure land
between pages."""

from __future__ import annotations

import pytest

from tests.api.support import Mem
from tests.support.api import assert_error


def ask(mem: Mem, words: str, **more) -> dict:
    return mem.ok(mem.api.post("/recall", mem.token, json={"words": words, **more}))


def ids(answer: dict) -> list[int]:
    return [int(line.split(" ", 1)[0][1:]) for line in answer["matches"]]


def walk(mem: Mem, words: str) -> list[dict]:
    pages = [ask(mem, words)]
    while pages[-1]["more"] is not None:
        pages.append(ask(mem, words, before=pages[-1]["more"]))
        assert len(pages) < 500
    return pages


def test_a_word_matches_as_a_prefix_folded(mem: Mem) -> None:
    mem.import_(
        [
            "the directors met",
            "direct flight to İstanbul",
            "a dir listing",
            "Café Noir on Friday",
            "deploy on Friday",
            "YILMAZ called",
            "Straße closed",
            "ＦＵＬＬ width note",
            "nothing here",
        ]
    )
    assert ids(ask(mem, "direct")) == [0, 1]  # both hold a word "direct" prefixes; the shorter first
    assert set(ids(ask(mem, "dep fri"))) == {3, 4} and ids(ask(mem, "dep fri"))[0] == 4
    assert ids(ask(mem, "cafe")) == [3]
    assert ids(ask(mem, "istanbul")) == [1]
    assert ids(ask(mem, "yılmaz")) == [5]
    assert ids(ask(mem, "strasse")) == [6]
    assert ids(ask(mem, "full")) == [7]
    assert ask(mem, "zebra") == {
        "matches": [],
        "scores": [],
        "total": 0,
        "more": None,
        "message": "No match.",
        "run": [],
    }
    # Inside a word is not a prefix.
    assert ids(ask(mem, "rectors")) == []


def test_every_word_counts_and_scores_say_so(mem: Mem) -> None:
    texts = [
        "priya moved the harbor review",
        "priya likes tea",
        "the harbor is calm",
        "review the harbor plan",
        "the the the",
        "priya harbor review notes",
    ]
    mem.import_(texts + [f"filler the {i}" for i in range(40)])
    got = ask(mem, "priya harbor review")
    assert ids(got)[:2] == [5, 0]  # all three words, shorter memory first
    assert all(s >= 1 for s in got["scores"][:2]) and all(s < 1 for s in got["scores"][2:])
    assert got["scores"] == sorted(got["scores"], reverse=True)
    assert set(ids(got)) == {0, 1, 2, 3, 5}  # "the the the" holds none of the words: not a match
    assert got["total"] == 5
    # Every word counts: with "the" added, only #0 holds them all, and it alone scores 1 or more.
    with_the = ask(mem, "the priya harbor review")
    assert ids(with_the)[:2] == [0, 5] and with_the["scores"][0] >= 1 > with_the["scores"][1]
    # A word most memories hold weighs next to nothing: the fillers holding only "the" come last.
    assert ids(with_the)[:5] == [0, 5, 3, 1, 2] and set(ids(with_the)[5:]) == {4, *range(6, 46)}


def test_ties_rank_newer_first(mem: Mem) -> None:
    mem.import_(["same words here"] * 5)
    got = ask(mem, "same")
    assert ids(got) == [4, 3, 2, 1, 0] and len(set(got["scores"])) == 1


@pytest.mark.parametrize("part_chars", [120, 600])
def test_paging_shows_every_match_once(mem: Mem, part_chars: int) -> None:
    texts = [
        ("needle " if i % 3 else "hay ") + "x" * (i % 17) + f" {i}" + (" thread" if i % 5 == 0 else "")
        for i in range(200)
    ]
    mem.import_(texts)
    want = {i for i, t in enumerate(texts) if "needle" in t or "thread" in t}
    mem.set_config(PART_CHARS=part_chars)
    pages = walk(mem, "needle thread")
    seen = [i for p in pages for i in ids(p)]
    assert len(pages) > 1 and sorted(seen) == sorted(want) and len(seen) == len(set(seen))
    scores = [s for p in pages for s in p["scores"]]
    keys = list(zip(scores, seen))
    assert keys == sorted(keys, reverse=True)
    for p in pages:
        assert sum(len(x.encode()) + 1 for x in p["matches"]) <= part_chars
        assert p["total"] == len(want)
        if p["more"] is not None:
            assert p["run"][0]["fields"] == {"words": "<the same words>", "before": p["more"]}
            assert p["run"][0]["plain"] == f"<the same words>\n#words before {p['more']}"


def test_pages_hold_still_while_notes_and_an_erasure_land(mem: Mem, owner: str) -> None:
    mem.import_([f"alpha {'beta ' * (i % 4)}{i}" for i in range(60)])
    mem.set_config(PART_CHARS=200)
    first = ask(mem, "alpha beta")
    shown = ids(first)
    mem.note("alpha beta newest")  # past the search's T: not on later pages
    victim = next(i for i in range(60) if i not in shown)
    mem.ok(mem.api.post("/erase", owner, json={"ids": [victim]}))
    rest = [first]
    while rest[-1]["more"] is not None:
        rest.append(ask(mem, "alpha beta", before=rest[-1]["more"]))
    seen = [i for p in rest for i in ids(p)]
    assert sorted(seen) == sorted(set(range(60)) - {victim}) and len(seen) == len(set(seen))


def test_text_answers_and_plain_bodies(mem: Mem) -> None:
    mem.import_(["Café on Friday", "deploy friday"])
    resp = mem.api.post(
        "/recall",
        mem.token,
        content=b"CAFE fri\n#words",
        headers={"Content-Type": "text/plain", "Accept": "text/plain"},
    )
    assert resp.status_code == 200
    lines = resp.text.splitlines()
    assert lines[0] == mem.memory_line(0) and lines[1] == mem.memory_line(1)
    assert lines[2] == "2 matches. Best first."
    # The same first line with no second line is a regex, as ever.
    assert (
        mem.ok(mem.api.post("/recall", mem.token, content=b"CAFE fri", headers={"Content-Type": "text/plain"}))["total"]
        == 0
    )


@pytest.mark.parametrize(
    "body, code",
    [
        ({"words": ""}, "recall.bad_words"),
        ({"words": "!!! ..."}, "recall.bad_words"),
        ({"words": 7}, "recall.bad_words"),
        ({"words": "x" * 513}, "recall.bad_words"),
        ({"words": " ".join(f"w{i}" for i in range(17))}, "recall.bad_words"),
        ({"words": "a", "before": "nonsense"}, "recall.bad_words"),
        ({"words": "a", "before": 12}, "recall.bad_words"),
        ({"words": "a b", "before": "w1.5.5.5.1.10.3"}, "recall.bad_words"),  # a cursor of a one-word search
        ({"words": "a", "before": "w1.99.5.5.1.10.3"}, "recall.bad_words"),  # past the log
        ({"words": "a", "q": "a"}, "recall.q_and_words"),
    ],
)
def test_bad_words_are_refused_in_the_standard_shape(mem: Mem, body: dict, code: str) -> None:
    mem.import_(["a b c", "a", "b"])
    assert_error(mem.api.post("/recall", mem.token, json=body), 422, code)


def test_regex_recall_is_unchanged(mem: Mem) -> None:
    mem.import_([f"needle {i}" for i in range(10)])
    got = mem.ok(mem.api.post("/recall", mem.token, json={"q": "needle", "before": "5"}))
    assert got == {
        "matches": [mem.memory_line(i) for i in range(5)],
        "total": 5,
        "more": None,
        "message": "5 matches before #5.",
        "run": [],
    }
    assert_error(mem.api.get("/recall?q=needle&before=x", mem.token), 422, "request.bad_value")
    assert_error(mem.api.get("/recall", mem.token), 400, "request.missing_field")
