"""Idempotency-Key over HTTP, on each of the four routes that take it."""

from __future__ import annotations

import json

import pytest

from tests.api.support import OLD_DATE, state
from tests.support.api import Api, assert_error

REPLAYED = "idempotent-replayed"


def key(k: str) -> dict:
    return {"Idempotency-Key": k}


def texts(api: Api, token: str) -> list[str]:
    resp = api.post("/recall", token, json={"q": "."})
    assert resp.status_code == 200, resp.text
    return [line.split(" ", 2)[2] for line in resp.json()["matches"]]


def test_note_retried_five_times_is_one_memory(api: Api, owner: str):
    first = api.post("/note", owner, json={"text": "deployed v2"}, headers=key("note-1"))
    assert first.status_code == 200 and REPLAYED not in first.headers
    for _ in range(5):
        again = api.post("/note", owner, json={"text": "deployed v2"}, headers=key("note-1"))
        assert again.status_code == 200 and again.headers[REPLAYED] == "true"
        assert again.json() == first.json()
    assert texts(api, owner) == ["deployed v2"]


def test_nap_retry_replays_the_save(api: Api, owner: str):
    api.post("/import", owner, json={"entries": [{"date": OLD_DATE, "text": t} for t in ("a", "b")]})
    body = {"block": "0-1", "text": "a and b"}
    first = api.post("/nap", owner, json=body, headers=key("nap-1"))
    assert first.status_code == 200 and first.json()["saved"] == "0-1"
    again = api.post("/nap", owner, json=body, headers=key("nap-1"))
    assert again.headers[REPLAYED] == "true" and again.json() == first.json()
    # Without the key, the same request is answered afresh: already settled.
    fresh = api.post("/nap", owner, json=body)
    assert fresh.json()["saved"] is None and REPLAYED not in fresh.headers


def test_import_retry_imports_once(api: Api, owner: str):
    body = {"entries": [{"date": OLD_DATE, "text": f"old {k}"} for k in range(3)]}
    first = api.post("/import", owner, json=body, headers=key("imp-1"))
    again = api.post(
        "/import", owner, content=json.dumps(body, indent=3).encode(), headers=key("imp-1")
    )  # the same object, spaced differently
    assert first.status_code == again.status_code == 200
    assert again.headers[REPLAYED] == "true" and again.json() == first.json()
    answer = first.json()
    assert (answer["first"], answer["last"], answer["pending"], answer["head"]["count"]) == (0, 2, 1, 3)
    assert texts(api, owner) == ["old 0", "old 1", "old 2"]


def test_grants_retry_answers_the_same_grant_and_token(api: Api, owner: str):
    first = api.post("/grants", owner, json={"scope": "read"}, headers=key("mint-1"))
    again = api.post("/grants", owner, json={"scope": "read"}, headers=key("mint-1"))
    assert first.status_code == again.status_code == 201
    assert again.headers[REPLAYED] == "true" and again.json() == first.json()
    grants = api.get("/grants", owner).json()["grants"]
    assert [g["scope"] for g in grants] == ["owner", "read"]
    assert api.get("/wake", first.json()["token"]).status_code == 200


@pytest.mark.parametrize(
    "path, body, other",
    [
        ("/note", {"text": "one"}, {"text": "two"}),
        ("/import", {"entries": [{"date": OLD_DATE, "text": "a"}]}, {"entries": [{"date": OLD_DATE, "text": "b"}]}),
        ("/grants", {"scope": "read"}, {"scope": "full"}),
    ],
)
def test_the_same_key_with_another_body_is_409(api: Api, owner: str, path: str, body: dict, other: dict):
    status = 201 if path == "/grants" else 200
    assert api.post(path, owner, json=body, headers=key("k")).status_code == status
    before = state(api, owner), api.get("/grants", owner).json()
    assert_error(api.post(path, owner, json=other, headers=key("k")), 409, "idempotency.key_reused")
    assert (state(api, owner), api.get("/grants", owner).json()) == before


def test_a_keyed_write_that_changes_nothing_records_nothing(api: Api, owner: str):
    """A nap that only asks what is due stores no record (a flood of keyed
    no-ops costs no storage): its key is then free, and a write under it is
    recorded and replayed as usual."""
    for text in ("one", "two"):
        api.post("/note", owner, json={"text": text})
    asked = api.post("/nap", owner, json={}, headers=key("k"))
    assert asked.status_code == 200 and asked.json()["nap"]["block"] == "0-1"
    again = api.post("/nap", owner, json={}, headers=key("k"))
    assert again.status_code == 200 and REPLAYED not in again.headers
    saved = api.post("/nap", owner, json={"block": "0-1", "text": "both"}, headers=key("k"))
    assert saved.status_code == 200 and saved.json()["saved"] == "0-1"
    replay = api.post("/nap", owner, json={"block": "0-1", "text": "both"}, headers=key("k"))
    assert replay.headers[REPLAYED] == "true" and replay.json() == saved.json()
    assert_error(api.post("/nap", owner, json={}, headers=key("k")), 409, "idempotency.key_reused")


def test_the_same_key_on_another_memory_route_is_409(api: Api, owner: str):
    api.post("/note", owner, json={"text": "a"}, headers=key("shared"))
    resp = api.post("/import", owner, json={"entries": [{"date": OLD_DATE, "text": "a"}]}, headers=key("shared"))
    assert_error(resp, 409, "idempotency.key_reused")
    assert texts(api, owner) == ["a"]


@pytest.mark.parametrize("path", ["/note", "/nap", "/import", "/grants"])
@pytest.mark.parametrize("value", ["", "has space", "x" * 256])
def test_a_malformed_key_is_400_and_writes_nothing(api: Api, owner: str, path: str, value: str):
    body = {
        "/note": {"text": "x"},
        "/nap": {},
        "/import": {"entries": [{"date": OLD_DATE, "text": "x"}]},
        "/grants": {"scope": "read"},
    }[path]
    assert_error(api.post(path, owner, json=body, headers=key(value)), 400, "idempotency.bad_key")
    assert texts(api, owner) == []
    assert len(api.get("/grants", owner).json()["grants"]) == 1


def test_a_key_sent_twice_is_400(api: Api, owner: str):
    headers = [("Authorization", f"Bearer {owner}"), ("Idempotency-Key", "a"), ("Idempotency-Key", "a")]
    resp = api.loop.run_until_complete(api.client.post("/note", json={"text": "x"}, headers=headers))
    assert resp.request.headers.get_list("idempotency-key") == ["a", "a"]
    assert_error(resp, 400, "idempotency.bad_key")


def test_a_refusal_is_not_replayed(api: Api, owner: str):
    bad = {"entries": [{"date": "2999-01-01", "text": "future"}]}
    assert_error(api.post("/import", owner, json=bad, headers=key("imp")), 422, "import.bad_date")
    # The refusal was not recorded: the corrected request under the same key runs.
    good = {"entries": [{"date": OLD_DATE, "text": "past"}]}
    resp = api.post("/import", owner, json=good, headers=key("imp"))
    assert resp.status_code == 200 and REPLAYED not in resp.headers
    assert texts(api, owner) == ["past"]


def test_a_wrong_nap_block_409_is_not_recorded(api: Api, owner: str):
    api.post("/import", owner, json={"entries": [{"date": OLD_DATE, "text": t} for t in "abcd"]})
    assert_error(api.post("/nap", owner, json={"block": "2-3", "text": "x"}, headers=key("n")), 409, "nap.wrong_block")
    resp = api.post("/nap", owner, json={"block": "0-1", "text": "x"}, headers=key("n"))
    assert resp.status_code == 200 and resp.json()["saved"] == "0-1"


def test_keys_are_per_user(api: Api, owner: str):
    other = api.init()["token"]
    for token in (owner, other):
        resp = api.post("/note", token, json={"text": "same"}, headers=key("same-key"))
        assert resp.status_code == 200 and REPLAYED not in resp.headers
        assert texts(api, token) == ["same"]


def test_a_read_token_is_refused_before_any_record(api: Api, owner: str):
    read = api.post("/grants", owner, json={"scope": "read"}).json()["token"]
    assert_error(api.post("/note", read, json={"text": "x"}, headers=key("r")), 403, "auth.scope")
    resp = api.post("/note", owner, json={"text": "x"}, headers=key("r"))
    assert resp.status_code == 200 and REPLAYED not in resp.headers


def test_replays_are_counted_and_the_key_is_never_in_metrics(api: Api, owner: str):
    secret_key = "metrics-sentinel-key-31f9"
    for _ in range(2):
        api.post("/note", owner, json={"text": "x"}, headers=key(secret_key))
    text = api.app.state.metrics.render()
    assert 'stash_events_total{event="idempotent_replay"} 1' in text
    assert secret_key not in text


def test_the_document_describes_the_header(api: Api):
    doc = api.get("/openapi.json").json()
    for path in ("/note", "/nap", "/import", "/grants"):
        op = doc["paths"][path]["post"]
        names = [p["name"] for p in op.get("parameters", []) if p["in"] == "header"]
        assert names.count("Idempotency-Key") == 1, path
        assert "idempotency.key_reused" in op["responses"]["409"]["x-error-codes"]
        assert "idempotency.bad_key" in op["responses"]["400"]["x-error-codes"]
    assert "Idempotency-Key" not in str(doc["paths"]["/forget"])


@pytest.mark.parametrize("where", ["main", "bravo"])
@pytest.mark.parametrize("scope", ["full", "append"])
def test_a_bound_writers_key_replays_its_note_and_refuses_another(api: Api, owner: str, scope: str, where: str):
    """Every writer's note, the append capability's (whose record lives in
    the key ring, sealed under its own secret) as a full one's, in main and
    in a second memory: a retry replays, the same key with another text is
    409 and writes nothing."""
    if where != "main":
        assert api.post("/memories", owner, json={"name": where}).status_code == 201
    writer = api.post("/grants", owner, json={"scope": scope, "memory": where}).json()["token"]
    first = api.post("/note", writer, json={"text": "the merger closes friday"}, headers=key("n-1"))
    assert first.status_code == 200 and REPLAYED not in first.headers
    again = api.post("/note", writer, json={"text": "the merger closes friday"}, headers=key("n-1"))
    assert again.headers[REPLAYED] == "true" and again.json() == first.json()
    assert_error(
        api.post("/note", writer, json={"text": "the merger is off"}, headers=key("n-1")), 409, "idempotency.key_reused"
    )
    read_path = "/recall" if where == "main" else f"/m/{where}/recall"
    resp = api.post(read_path, owner, json={"q": "merger"})
    assert [line.split(" ", 2)[2] for line in resp.json()["matches"]] == ["the merger closes friday"]
