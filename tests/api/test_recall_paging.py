"""Recall says when it is cut, and pages (issue 12 item 5): ``more`` names the
``before`` of the next older page, and walking it until null yields every
match exactly once, oldest-first within a page, newest page first."""

from __future__ import annotations

import re

import pytest

from tests.api.support import Mem
from tests.support.api import assert_error, matched


def walk(mem: Mem, q: str) -> tuple[list[list[str]], list[dict]]:
    pages, answers = [], []
    body: dict = {"q": q}
    while True:
        ans = mem.ok(mem.api.post("/recall", mem.token, json=body))
        answers.append(ans)
        pages.append(ans["matches"])
        if ans["more"] is None:
            return pages, answers
        body = {"q": q, "before": ans["more"]}
        assert len(pages) < 1000


@pytest.mark.slow
@pytest.mark.parametrize("part_chars", [60, 200, 1000])
def test_walking_more_yields_every_match_exactly_once(mem: Mem, part_chars: int) -> None:
    texts = [("needle " if i % 3 else "hay ") + "x" * (i % 17) + f" {i}" for i in range(300)]
    mem.import_(texts)
    mem.set_config(PART_CHARS=part_chars)
    want = [mem.memory_line(i) for i, t in enumerate(texts) if t.startswith("needle")]
    pages, answers = walk(mem, "NEEDLE")
    assert len(pages) > 1
    assert [line for page in reversed(pages) for line in page] == want
    assert answers[0]["total"] == len(want)
    verb = "is" if len(pages[0]) == 1 else "are"
    assert answers[0]["message"].startswith(f"{len(want)} matches. The newest {len(pages[0])} {verb} shown")
    for page, ans in zip(pages, answers):
        assert sum(len(x.encode()) + 1 for x in page) <= part_chars
        if ans["more"] is not None:
            assert ans["more"] == int(page[0].split()[0][1:])
            assert ans["run"] == [
                {
                    "method": "POST",
                    "path": "/recall",
                    "fields": {"q": "<the same regex>", "before": ans["more"]},
                    "plain": f"<the same regex>\nbefore {ans['more']}",
                    "placeholders": ["<the same regex>"],
                }
            ]


def test_notes_arriving_between_pages_shift_nothing(mem: Mem) -> None:
    mem.import_([f"needle {i}" for i in range(50)])
    mem.set_config(PART_CHARS=100)
    first = mem.ok(mem.api.post("/recall", mem.token, json={"q": "needle"}))
    mem.note("needle late")
    rest = mem.ok(mem.api.post("/recall", mem.token, json={"q": "needle", "before": first["more"]}))
    assert rest["total"] == first["more"]
    assert int(rest["matches"][-1].split()[0][1:]) == first["more"] - 1


def test_the_count_line(mem: Mem) -> None:
    mem.import_(["alpha", "beta", "alphabet"])
    assert mem.ok(mem.api.post("/recall", mem.token, json={"q": "alpha"}))["message"] == "2 matches."
    one = mem.ok(mem.api.post("/recall", mem.token, json={"q": "beta"}))
    assert one["message"] == "1 match." and one["more"] is None
    assert mem.ok(mem.api.post("/recall", mem.token, json={"q": "zeta"}))["message"] == "No match."
    later = mem.ok(mem.api.post("/recall", mem.token, json={"q": "alpha", "before": 2}))
    assert later["matches"] == [mem.memory_line(0)] and later["message"] == "1 match before #2."
    past_end = mem.ok(mem.api.post("/recall", mem.token, json={"q": "a", "before": 10**9}))
    assert past_end["total"] == 3


def test_no_match_fits_says_so_and_does_not_loop(mem: Mem) -> None:
    mem.import_(["needle " + "y" * 200])
    mem.set_config(PART_CHARS=10)
    ans = mem.ok(mem.api.post("/recall", mem.token, json={"q": "needle"}))
    assert ans["matches"] == [] and ans["total"] == 1 and ans["more"] is None
    assert "PART_CHARS" in ans["message"]


@pytest.mark.parametrize("before", [-1, "x", True, 1.5, "-3"])
def test_a_bad_before_is_422(mem: Mem, before: object) -> None:
    mem.import_(["a"])
    assert_error(mem.api.post("/recall", mem.token, json={"q": "a", "before": before}), 422, "request.bad_value")


def test_get_recall_pages_too(mem: Mem) -> None:
    mem.import_([f"needle {i}" for i in range(10)])
    got = mem.ok(mem.api.get("/recall?q=needle&before=4", mem.token))
    assert [matched(re.match(r"#(\d+)", x)).group(1) for x in got["matches"]] == ["0", "1", "2", "3"]
