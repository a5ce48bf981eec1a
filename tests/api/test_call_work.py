"""The work of one agent call (issue 27, item 4), counted through the app:
a request parses its token once and derives its lookup tag once (the web
edge's precheck hands both to the service's check), and it writes the key
ring only when something in it changed: a wake or a zoom never, a note once
(the copy of the log head it moved). bench/call_work.py prints the same
counts with the disk's syncs and times."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from stash.crypto import tokens
from stash.storage.sqlite import transactions
from tests.support.api import Api

# Both ways the app keeps a memory's files: closed after each request, and kept open as `stash serve` keeps them.
pytestmark = pytest.mark.parametrize("keep_open", [0.0, 5.0], ids=["closed", "kept-open"], indirect=True)


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Calls of the real functions, counted: tokens.parse, tokens.lookup_tag,
    and the write transactions begun on a key ring's connection."""
    seen: Counter[str] = Counter()
    for name in ("parse", "lookup_tag"):
        real = getattr(tokens, name)

        def counted(*a, _real=real, _name=name, **kw):
            seen[_name] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(tokens, name, counted)
    real_write = transactions.write_transaction

    def write(conn):
        if not conn.in_transaction and Path(conn.execute("PRAGMA database_list").fetchone()[2]).name.startswith(
            "keyring"
        ):
            seen["ring writes"] += 1
        return real_write(conn)

    for module in list(sys.modules.values()):
        if (
            getattr(module, "__name__", "").startswith("stash.")
            and getattr(module, "write_transaction", None) is real_write
        ):
            monkeypatch.setattr(module, "write_transaction", write)
    return seen


CALLS = [
    ("wake", "GET", "/wake", None, 0),
    ("zoom", "GET", "/zoom?block=0-1", None, 0),
    ("recall", "GET", "/recall?q=memory", None, 0),
    ("note", "POST", "/note", {"text": "the deploy went green"}, 1),
]


@pytest.mark.parametrize(("what", "method", "path", "body", "ring_writes"), CALLS, ids=[c[0] for c in CALLS])
def test_a_call_parses_its_token_once_and_writes_the_ring_only_for_a_change(
    api: Api, owner: str, counts: Counter[str], what: str, method: str, path: str, body: dict | None, ring_writes: int
) -> None:
    token = api.post("/grants", owner, json={"scope": "full"}).json()["token"]
    assert (
        api.post(
            "/import", token, json={"entries": [{"date": "2026-01-02", "text": f"memory {i}"} for i in range(2)]}
        ).status_code
        == 200
    )
    assert api.post("/nap", token, json={"block": "0-1", "text": "the first two memories"}).status_code == 200
    # Once a day per process a call also records its grant's last-used day and the memory's last
    # write day; those are written now, so what follows counts a call's own writes.
    assert api.post("/note", token, json={"text": "a first note of the day"}).status_code == 200
    counts.clear()
    for k in range(3):
        resp = api.send(
            method,
            path,
            {"Authorization": f"Bearer {token}"},
            **({} if body is None else {"json": {"text": f"{body['text']} {k}"}}),
        )
        assert resp.status_code == 200, resp.text
    assert counts["parse"] == 3, f"{what}: the token parsed {counts['parse']} times in 3 requests"
    assert counts["lookup_tag"] == 3, f"{what}: the lookup tag derived {counts['lookup_tag']} times in 3 requests"
    assert counts["ring writes"] == 3 * ring_writes, f"{what}: {counts['ring writes']} key-ring writes in 3 requests"
