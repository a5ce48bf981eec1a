"""The SQL statements of one agent call (issue 27, item 4), counted through
the app as ``stash serve`` runs it (files kept open between requests): each
summary level's frontier is read in one statement, not one per level; the
idempotency table's script runs only in a file that lacks the table; and a
connection that :func:`stash.storage.sqlite.connections.connect` set up is put back into
the pool without asking SQLite its journal and locking modes again.
bench/request_cost.py prints what each call costs."""

from __future__ import annotations

from collections import Counter

import pytest

from stash.storage.sqlite import connections
from tests.support.api import Api

pytestmark = pytest.mark.parametrize("keep_open", [5.0], ids=["kept-open"], indirect=True)


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every statement the request's connections run, by text (SQLite's trace callback on each file opened);
    asked for before the app, so that every connection it opens is traced."""
    seen: Counter[str] = Counter()
    real = connections._open

    def traced(target, *a, **kw):
        conn = real(target, *a, **kw)
        conn.set_trace_callback(lambda sql: seen.update([" ".join(sql.split())]))
        return conn

    monkeypatch.setattr(connections, "_open", traced)
    return seen


def _memory(api: Api, owner: str) -> str:
    token = api.post("/grants", owner, json={"scope": "full"}).json()["token"]
    entries = [{"date": "2026-01-02", "text": f"memory {i}"} for i in range(40)]
    assert api.post("/import", token, json={"entries": entries}).status_code == 200
    nap = api.get("/wake", token).json()["nap"]
    while nap is not None:  # every level from 2 to 32 settled
        nap = api.post("/nap", token, json={"block": nap["block"], "text": f"summary of {nap['block']}"}).json()["nap"]
    assert api.post("/note", token, json={"text": "a first note of the day"}).status_code == 200
    return token


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("GET", "/wake", None), ("POST", "/note", {"text": "x"}), ("POST", "/nap", {})],
    ids=["wake", "note", "nap"],
)
def test_a_call_reads_the_level_frontiers_in_one_statement_each_time(
    statements: Counter[str], api: Api, owner: str, method: str, path: str, body: dict | None
) -> None:
    token = _memory(api, owner)
    statements.clear()
    resp = api.send(method, path, {"Authorization": f"Bearer {token}"}, **({} if body is None else {"json": body}))
    assert resp.status_code == 200, resp.text
    one_level = sum(n for sql, n in statements.items() if sql.startswith("SELECT MAX(idx) FROM summaries WHERE"))
    assert one_level == 0, f"{one_level} statements read one level's frontier each"
    assert any(sql.startswith("SELECT (SELECT MAX(idx) FROM summaries WHERE size =") for sql in statements)


def test_a_write_runs_the_idempotency_script_only_where_the_table_is_missing(
    statements: Counter[str], api: Api, owner: str
) -> None:
    token = _memory(api, owner)
    statements.clear()
    for k in range(3):
        assert api.post("/note", token, json={"text": f"note {k}"}).status_code == 200
    script = sum(n for sql, n in statements.items() if sql.startswith("CREATE INDEX IF NOT EXISTS idempotency_created"))
    assert script == 0, f"the idempotency script ran {script} times in 3 notes of a file that has the table"


def test_a_kept_connection_goes_back_without_asking_its_modes(statements: Counter[str], api: Api, owner: str) -> None:
    token = _memory(api, owner)
    statements.clear()
    for _ in range(3):
        assert api.get("/wake", token).status_code == 200
    assert statements["PRAGMA journal_mode"] == 0
    assert statements["PRAGMA locking_mode"] == 0
    assert statements["PRAGMA synchronous = FULL"] >= 6  # both files, every request: still reset before going idle
