"""The owner's way back from a full-token flood (docs/DESIGN.md, "Erase";
API-REFERENCE.md, "POST /erase/undo"): a real full capability imports and
notes until the identity's quota, its imports bounded per request and per
day, and an append capability notes beside it; the owner revokes both, undoes
what each wrote, and the memory is the owner's again: notes are accepted in
every memory and by a new append capability, and the wake owes naps only for
the blocks that still hold a live memory (counted by the oracle), showing the
rest as erased. In main and in a second memory (undone from the root, which
finds the memory a capability is bound to, and under /m/{name}), on SQLCipher
and plain stores."""

from __future__ import annotations

import pytest

from stash.service import undo
from stash.web.app import create_app
from tests.api.support import today_utc
from tests.support.api import Api, make_settings
from tests.support.oracle import Model, oracle_pending, spec_cover

QUOTA = 90
PER_REQUEST = 25
PER_DAY = 50
DATE = "2026-01-05"


def ok(resp, status: int = 200) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text)
    return resp.json()


def refused(resp, status: int, code: str) -> None:
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.json()["error"] == code, resp.text


@pytest.fixture(params=["main", "bravo"])
def where(request) -> str:
    """The memory the flood is in: main, or a second memory of the identity."""
    return request.param


def at(where: str, path: str) -> str:
    return path if where == "main" else f"/m/{where}{path}"


@pytest.fixture(params=["sqlcipher", "none"])
def api(request, data_dir):
    client = Api(
        create_app(
            make_settings(
                data_dir,
                file_cipher=request.param,
                quota_memories=QUOTA,
                import_per_request=PER_REQUEST,
                import_per_day=PER_DAY,
            )
        )
    )
    yield client
    client.close()


def entries(n: int, tag: str) -> dict:
    return {"entries": [{"date": DATE, "text": f"{tag} {k}"} for k in range(n)]}


def test_a_flood_by_a_full_token_is_bounded_and_undone_by_its_owner(api: Api, where: str, monkeypatch):
    monkeypatch.setattr(undo, "UNDO_MAX", 20)  # several slices out of a small flood
    owner = api.init()["token"]
    if where != "main":
        ok(api.post("/memories", owner, json={"name": where}), 201)
    ok(api.post(at(where, "/config"), owner, json={"WAKE_LINES": 6}))
    ok(api.post(at(where, "/import"), owner, json=entries(3, "owner's own")))
    grant = ok(api.post("/grants", owner, json={"scope": "full", "label": "flooder", "memory": where}), 201)
    full = grant["token"]
    appends = ok(api.post("/grants", owner, json={"scope": "append", "memory": where}), 201)

    # Bounded imports: one request, then one day.
    refused(api.post("/import", full, json=entries(PER_REQUEST + 1, "flood")), 403, "quota.import_request")
    ok(api.post("/import", full, json=entries(PER_REQUEST, "flood")))
    ok(api.post("/import", full, json=entries(PER_REQUEST, "flood")))
    refused(api.post("/import", full, json=entries(1, "flood")), 403, "quota.import_day")
    # The owner's own imports are not bounded.
    ok(api.post(at(where, "/import"), owner, json=entries(PER_REQUEST + 1, "owner's second")))
    B = 3 + 2 * PER_REQUEST  # the owner's second import starts here
    C = B + PER_REQUEST + 1  # the append capability's notes here
    APPENDED = 4
    for k in range(APPENDED):
        assert ok(api.post("/note", appends["token"], json={"text": f"appended {k}"}))["id"] == C + k
    # Notes are not imports: the flooder fills the identity to its quota with them.
    T = C + APPENDED
    while T < QUOTA:
        ok(api.post("/note", full, json={"text": f"flood note {T}"}))
        T += 1
    refused(api.post(at(where, "/note"), owner, json={"text": "mine"}), 403, "quota.memories")
    refused(api.post("/note", owner, json={"text": "mine, in main"}), 403, "quota.memories")
    refused(api.post("/note", appends["token"], json={"text": "one more"}), 403, "quota.memories")
    blocked = api.get(at(where, "/wake"), owner)
    assert blocked.status_code == 409 and blocked.json()["error"] == "wake.needs_nap"

    # The way back: revoke, then undo what each grant wrote, slice by slice. The first call names the grant
    # at the root (its memory is found from it); the next ones address the memory.
    ok(api.delete(f"/grants/{grant['id']}", owner))
    ok(api.delete(f"/grants/{appends['id']}", owner))
    erased: list[int] = []
    slices = 0
    for writer in (grant["id"], appends["id"]):
        body: dict = {"grant": writer}
        path = "/erase/undo"
        while True:
            ans = ok(api.post(path, owner, json=body))
            slices += 1
            erased += ans["erased"]
            if ans["more"] is None:
                break
            body["first"] = ans["more"]
            path = at(where, "/erase/undo")
    appended_ids = set(range(C, C + APPENDED))
    flood_ids = set(range(3, B)) | set(range(C, QUOTA))
    assert set(erased) == flood_ids and slices >= 4
    receipts = ok(api.get(at(where, "/erasures"), owner))["erasures"]
    assert sorted(i for r in receipts for i in r["erased"]) == sorted(flood_ids)
    assert appended_ids <= {i for r in receipts for i in r["erased"]}
    events = [e for e in ok(api.get("/audit", owner))["events"] if e["event"] == "erase" and e["memory"] == where]
    assert len(events) == len(receipts)

    # The model of what the owner's memory now is, from the design alone.
    model = Model()
    for k in range(3):
        model.add_note(DATE, f"owner's own {k}")
    for i in range(3, QUOTA):
        model.add_note(DATE if i < C else today_utc().isoformat(), "")
    for k in range(PER_REQUEST + 1):
        model.notes[B + k] = (DATE, f"owner's second {k}")
    for i in flood_ids:
        model.erase(i)
    due = oracle_pending(QUOTA, set(), frozenset(model.erased))
    # Only the blocks holding a live memory are owed: not one per flooded memory.
    naps = 0
    nap = ok(api.post(at(where, "/nap"), owner, json={}))["nap"]
    assert nap["remaining"] == len(due) - 1
    while nap is not None:
        assert nap["block"] == f"{due[naps][0]}-{due[naps][1] - 1}"
        lo, hi = due[naps]
        assert nap["source"] == model.source(lo, hi)
        model.settle((lo, hi), f"owner summary {nap['block']}")
        nap = ok(
            api.post(at(where, "/nap"), owner, json={"block": nap["block"], "text": f"owner summary {nap['block']}"})
        )["nap"]
        naps += 1
    assert naps == len(due) < len(model.complete_blocks()) // 2
    wake = ok(api.get(at(where, "/wake"), owner))
    assert wake["awake"] and wake["nap"] is None
    assert any(line.endswith(" [erased]") and "-" in line.split(" ")[0] for line in wake["lines"]), wake["lines"]
    assert wake["lines"] == [model.render(b) for b in spec_cover(QUOTA, 6)]
    # The quota is free again in every memory: the erased memories count for nothing, wherever they are and
    # whoever wrote them.
    ok(api.post(at(where, "/note"), owner, json={"text": "mine again"}))
    ok(api.post("/note", owner, json={"text": "mine again, in main"}))
    again = ok(api.post("/grants", owner, json={"scope": "append", "memory": where}), 201)
    ok(api.post("/note", again["token"], json={"text": "appended again"}))


def test_the_grant_of_another_memory_is_undone_only_where_it_is_bound(api: Api):
    owner = api.init()["token"]
    ok(api.post("/memories", owner, json={"name": "bravo"}), 201)
    ok(api.post("/import", owner, json=entries(4, "main's")))
    grant = ok(api.post("/grants", owner, json={"scope": "full", "memory": "bravo"}), 201)
    ok(api.post("/import", grant["token"], json=entries(3, "bravo's")))
    # Under main's address the bravo grant is nobody's; the root and bravo's address find it.
    refused(api.post("/m/main/erase/undo", owner, json={"grant": grant["id"]}), 404, "grants.unknown")
    refused(api.post("/erase/undo", owner, json={"grant": 5_000_001}), 404, "grants.unknown")
    ans = ok(api.post("/m/bravo/erase/undo", owner, json={"grant": grant["id"]}))
    assert ans["erased"] == [0, 1, 2] and ans["flushed"] is True
    assert ok(api.get("/m/bravo/recall?q=bravo", owner))["total"] == 0
    assert ok(api.get("/recall?q=main", owner))["total"] == 4


def test_undo_of_a_range_and_its_refusals(api: Api):
    owner = api.init()["token"]
    ok(api.post("/import", owner, json=entries(10, "m")))
    refused(api.post("/erase/undo", owner, json={}), 422, "undo.bad_range")
    refused(api.post("/erase/undo", owner, json={"first": 4, "last": 2}), 422, "undo.bad_range")
    refused(api.post("/erase/undo", owner, json={"last": 10}), 422, "undo.bad_range")
    refused(api.post("/erase/undo", owner, json={"grant": 99}), 404, "grants.unknown")
    full = ok(api.post("/grants", owner, json={"scope": "full"}), 201)["token"]
    refused(api.post("/erase/undo", full, json={"first": 0, "last": 3}), 403, "auth.scope")
    ans = ok(api.post("/erase/undo", owner, json={"first": 2, "last": 5}))
    assert ans["erased"] == [2, 3, 4, 5] and ans["more"] is None and ans["receipt"] >= 1
    again = ok(api.post("/erase/undo", owner, json={"first": 2, "last": 5}))
    assert again["receipt"] is None and again["erased"] == []
    zoom = ok(api.get("/zoom?block=0-7", owner))["lines"]
    assert zoom == ["#0-3 not compressed yet", "#4-7 not compressed yet"]
    assert ok(api.get("/zoom?block=2-3", owner))["lines"] == [f"#2 {DATE} [erased]", f"#3 {DATE} [erased]"]
    assert ok(api.get("/zoom?block=0-3", owner))["lines"] == ["#0-1 not compressed yet", "#2-3 [erased]"]


def test_a_grant_that_is_no_id_is_refused_not_a_server_error(api: Api):
    owner = api.init()["token"]
    ok(api.post("/import", owner, json=entries(2, "m")))
    grant: object
    for grant in ({}, [], "7", 1.5, True):
        resp = api.post("/erase/undo", owner, json={"grant": grant, "first": 0, "last": 0})
        assert resp.status_code in (400, 404, 422), (grant, resp.status_code, resp.text)
