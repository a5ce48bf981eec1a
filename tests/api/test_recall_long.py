"""A hostile pattern over a long log must answer, not stall the server."""

from __future__ import annotations

import pytest

from tests.api.support import OLD_DATE
from tests.support.api import Api

N = 30_000


@pytest.mark.slow
def test_pathological_patterns_over_a_long_log_answer(api: Api, owner: str) -> None:
    # Lines of a's ending in "!" are the classic input on which a backtracking
    # engine explores exponentially many ways to split the a's.
    entries = [{"date": OLD_DATE, "text": "a" * 40 + "!"} for _ in range(N)]
    resp = api.post("/import", owner, json={"entries": entries})
    assert resp.status_code == 200, resp.text
    for pattern, total in (("(a+)+$", 0), ("(a|a)*b", 0), ("(x+x+)+y", 0), ("(a+)+!", N), ("^(a|aa)+$", 0)):
        resp = api.get("/recall", owner, params={"q": pattern})
        assert resp.status_code == 200, (pattern, resp.text)
        body = resp.json()
        assert body["total"] == total, pattern
        assert all(line.endswith("a" * 40 + "!") for line in body["matches"])
