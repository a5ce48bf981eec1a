"""GET /openapi.json against the server itself: the document is generated
from the ROUTES declarations, so what is checked here is that it is valid,
that each operation's security and error codes follow its scope and the
codes the server raises, and that live answers — successes and refusals —
have exactly the shape the document gives them, with an error code the
document lists for that route and status.

The document is checked with jsonschema (OpenAPI 3.1 schemas are JSON Schema
2020-12), so a wrong field, type, range or pattern in either the document or
the server fails a test."""

from __future__ import annotations

import re
from typing import Any

import pytest

from stash.web.app import create_app
from stash.web.codes import CODES, OUTSIDE_ROUTES
from stash.web.fields import error_codes
from stash.web.routes import ROUTES
from tests.support.api import Api, assert_error, make_settings
from tests.support.docs.openapi import check_answer, codes_raised_by, operation, problems, raised_codes, resolve

OLD_DATE = "2020-02-03"
SECURED = {"append", "read", "full", "owner"}
RANK = {"read": 0, "full": 1, "owner": 2}


def test_the_schema_checker_refuses_what_it_should() -> None:
    # The checker is the judge of every test below: it must be able to say no.
    doc = {"components": {"schemas": {"N": {"type": "integer", "minimum": 1}}}}
    schema = {
        "type": "object",
        "required": ["a"],
        "additionalProperties": False,
        "properties": {
            "a": {"$ref": "#/components/schemas/N"},
            "b": {"anyOf": [{"type": "string", "pattern": "^x"}, {"type": "null"}]},
            "c": {"type": "array", "prefixItems": [{"type": "integer"}], "items": False},
        },
    }
    assert problems(doc, schema, {"a": 1, "b": None, "c": [3]}) == []
    assert problems(doc, schema, {"a": 1, "b": "xy"}) == []
    for bad in (
        {"b": None},
        {"a": 0},
        {"a": True},
        {"a": 1, "b": "y"},
        {"a": 1, "z": 1},
        {"a": 1, "c": [1, 2]},
        {"a": 1, "c": ["1"]},
    ):
        assert problems(doc, schema, bad), bad


# ---------------------------------------------------------------- the document


@pytest.fixture
def doc(api: Api) -> dict:
    resp = api.get("/openapi.json")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("application/json")
    return resp.json()


def all_refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for v in node.values() for r in all_refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in all_refs(v)]
    return []


def test_document_is_openapi_3_1(doc: dict) -> None:
    assert re.fullmatch(r"3\.1\.\d+", doc["openapi"])
    assert doc["info"]["title"] and doc["info"]["version"]
    for ref in all_refs(doc):
        resolve(doc, ref)  # a dangling reference raises KeyError


def test_security_matches_scope(doc: dict) -> None:
    schemes = doc["components"]["securitySchemes"]
    assert schemes["bearerAuth"]["type"] == "http" and schemes["bearerAuth"]["scheme"] == "bearer"
    for r in ROUTES:
        op = operation(doc, r.method, r.path)
        assert op["x-stash-scope"] == r.scope
        codes = {int(s): resp.get("x-error-codes", []) for s, resp in op["responses"].items()}
        if r.scope == "public":
            assert op["security"] == [], r.path
            # No bearer; the consent form's owner token (in its body) and an OAuth client can be refused.
            owner_form = r.fields is not None and "owner_token" in r.fields.names
            assert set(codes.get(401, [])) <= {"oauth.invalid_client"} | ({"auth.invalid"} if owner_form else set())
            assert "auth.scope" not in codes.get(403, [])
        elif r.scope in SECURED:
            assert op["security"] == [{"bearerAuth": []}], r.path
            assert codes[401] == ["auth.invalid"] and "rate_limited" in codes[429]
            # a read capability opens every route that needs read, so only higher scopes (and append,
            # which a read capability may not do) can be refused
            assert ("auth.scope" in codes.get(403, [])) == (r.scope != "read"), r.path
        elif r.scope == "capability":  # any live capability: each of its calls checks its own scope
            assert op["security"] == [{"bearerAuth": []}], r.path
            assert codes[401] == ["auth.invalid"] and "rate_limited" in codes[429]
            assert "auth.scope" not in codes.get(403, [])
        else:
            assert r.scope == "operator"
            # loopback needs no credential; elsewhere the operator's token, never a capability
            assert {} in op["security"] and {"bearerAuth": []} not in op["security"]
            assert all(schemes[name]["type"] == "http" for req in op["security"] for name in req)
            assert "auth.operator" in codes[403]


def test_every_error_response_is_the_error_shape(doc: dict) -> None:
    error = doc["components"]["schemas"]["Error"]
    assert set(error["required"]) == {"error", "message"} == set(error["properties"])
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for status, resp in op["responses"].items():
                if int(status) < 400:
                    continue
                assert resp["x-error-codes"], (method, path, status)
                if op.get("x-stash-protocol") == "html":  # a page for the owner; the code in Stash-Error
                    assert list(resp["content"]) == ["text/html"], (method, path)
                    continue
                schema = resp["content"]["application/json"]["schema"]
                if op.get("x-stash-protocol") == "jsonrpc":  # a JSON-RPC error, the Stash code in its data
                    assert set(schema["required"]) == {"jsonrpc", "id", "error"}, (method, path)
                    assert set(schema["properties"]["error"]["required"]) == {"code", "message"}
                    continue
                if op.get("x-stash-protocol") == "oauth":  # OAuth's error object
                    assert schema["required"] == ["error"] and "error_description" in schema["properties"]
                    continue
                for ref in all_refs(schema):
                    target = resolve(doc, ref)
                    assert {"error", "message"} <= set(target["required"]), ref


def test_documented_codes_are_the_codes_the_server_raises(doc: dict) -> None:
    """Every code the package raises is one some operation lists, at the
    status it is raised with, and every listed code is raised somewhere."""
    documented: dict[str, set[int]] = {}
    for ops in doc["paths"].values():
        for op in ops.values():
            for status, resp in op["responses"].items():
                for code in resp.get("x-error-codes", []):
                    documented.setdefault(code, set()).add(int(status))
    raised = raised_codes()
    assert set(documented) <= set(raised), set(documented) - set(raised)
    assert set(raised) - set(OUTSIDE_ROUTES) <= set(documented), set(raised) - set(OUTSIDE_ROUTES) - set(documented)
    wrong = {code: (raised[code], statuses) for code, statuses in documented.items() if statuses != raised[code]}
    assert wrong == {}, "code: (raised with, documented with)"


def test_every_code_has_one_status_and_a_meaning_and_is_raised() -> None:
    raised = raised_codes()
    assert set(raised) - set(CODES) == set(), "raised codes missing from stash/web/codes.py"
    assert set(CODES) - set(raised) == set(), "stash/web/codes.py lists codes nothing raises"
    # app.py's 404 and 405 answers set their status by hand, which the source reading cannot see
    assert {code: {c.status} for code, c in CODES.items() if code not in OUTSIDE_ROUTES} == {
        code: statuses for code, statuses in raised.items() if code not in OUTSIDE_ROUTES
    }
    assert [CODES[code].status for code in OUTSIDE_ROUTES] == [404, 405]
    assert all(c.meaning for c in CODES.values())


def test_each_route_declares_the_codes_its_handler_raises() -> None:
    """Route by route, as far as the handler's own body goes (what the
    service raises is held to the routes as a whole above)."""
    missing = {}
    for r in ROUTES:
        declared = {code for codes in error_codes(r).values() for code in codes}
        if undeclared := codes_raised_by(r.handler) - declared:
            missing[f"{r.method} {r.path}"] = undeclared
    assert missing == {}
    # the reading must see a handler's raises, or the check above proves nothing
    assert codes_raised_by(ROUTES[[f"{r.method} {r.path}" for r in ROUTES].index("POST /init")].handler) >= {
        "init.disabled",
        "init.invite_required",
        "init.bad_url",
        "quota.identities",
    }


# ---------------------------------------------------------------- live answers against the document


def refused(doc: dict, method: str, path: str, resp, status: int, code: str) -> dict:
    assert_error(resp, status, code)
    body = check_answer(doc, method, path, resp, status)
    # The plain refusals are exactly {error, message}; only the documented
    # special shapes add fields.
    error_props = set(doc["components"]["schemas"]["Error"]["properties"])
    assert set(body) == error_props or set(body) > error_props
    return body


def entries(n: int, date: str = OLD_DATE) -> list[dict]:
    return [{"date": date, "text": f"imported memory {k}"} for k in range(n)]


def test_public_answers_match(api: Api, doc: dict) -> None:
    check_answer(doc, "GET", "/health", api.get("/health"), 200)
    body = check_answer(doc, "POST", "/init", api.post("/init", json={"url": "https://stash.test"}), 201)
    assert "https://stash.test" in body["prompt"]
    check_answer(doc, "POST", "/init", api.post("/init"), 201)
    for T, lines in ((0, 96), (5, 96), (1000, 96), (10**6, 40)):
        got = check_answer(doc, "GET", "/shape", api.get(f"/shape?T={T}&lines={lines}"), 200)
        # the blocks tile [0, T) in order, within the budget: a property of the answer, not a copy of it
        assert len(got["blocks"]) <= lines
        starts = [b[0] for b in got["blocks"]]
        ends = [b[1] + 1 for b in got["blocks"]]
        assert starts == [0, *ends][: len(starts)] and ends[-1:] == ([T] if T else [])
    check_answer(doc, "POST", "/shape", api.post("/shape", json={"T": 300, "lines": 10}), 200)
    check_answer(doc, "GET", "/openapi.json", api.get("/openapi.json"), 200)
    check_answer(doc, "GET", "/metrics", api.get("/metrics"), 200)
    check_answer(doc, "GET", "/", api.get("/"), 200)
    check_answer(doc, "GET", "/client", api.get("/client"), 200)


def test_memory_answers_match(api: Api, doc: dict, owner: str) -> None:
    def ok(method: str, path: str, resp) -> dict:
        return check_answer(doc, method, path, resp, 200)

    check_answer(doc, "GET", "/wake", api.get("/wake", owner), 200)  # the empty memory
    imported = ok("POST", "/import", api.post("/import", owner, json={"entries": entries(3)}))
    assert (imported["first"], imported["last"], imported["pending"]) == (0, 2, 1)
    noted = ok("POST", "/note", api.post("/note", owner, json={"text": "the fourth memory"}))
    assert noted["id"] == 3 and noted["nap"]["block"] == "0-1"
    ok("POST", "/nap", api.post("/nap", owner, json={}))
    saved = ok("POST", "/nap", api.post("/nap", owner, json={"block": "0-1", "text": "two memories"}))
    assert saved["saved"] == "0-1"
    again = ok("POST", "/nap", api.post("/nap", owner, json={"block": "0-1", "text": "two memories"}))
    assert again["saved"] is None
    ok("GET", "/wake", api.get("/wake", owner))
    ok("POST", "/wake", api.post("/wake", owner, json={"part": 1}))
    ok("GET", "/zoom", api.get("/zoom?block=0-1", owner))
    ok("POST", "/zoom", api.post("/zoom", owner, json={"block": "0-3"}))
    ok("GET", "/recall", api.get("/recall?q=memory", owner))
    ok("POST", "/recall", api.post("/recall", owner, json={"q": "FOURTH"}))
    ok("POST", "/forget", api.post("/forget", owner, json={"block": "0-1"}))
    ok("GET", "/config", api.get("/config", owner))
    ok("POST", "/config", api.post("/config", owner, json={"WAKE_LINES": 64, "PART_LINES": None}))
    resp = api.get("/export", owner)
    check_answer(doc, "GET", "/export", resp, 200)
    assert resp.content[:2] == b"\x1f\x8b"  # gzip magic


def test_a_wake_in_parts_matches(api: Api, doc: dict, owner: str) -> None:
    api.post("/import", owner, json={"entries": entries(12)})
    api.post("/config", owner, json={"PART_LINES": 5})
    part1 = check_answer(doc, "GET", "/wake", api.get("/wake", owner), 200)
    assert part1["parts"] == 3 and part1["next"] and not part1["awake"]
    last = check_answer(doc, "GET", "/wake", api.get(f"/wake?part=3&T={part1['T']}", owner), 200)
    assert last["awake"] and last["nap"] is not None


def test_owner_answers_match(api: Api, doc: dict, owner: str) -> None:
    routes = {(r.method, r.path) for r in ROUTES}
    if ("POST", "/grants") not in routes:
        pytest.skip("no grant routes on this server")
    minted = check_answer(doc, "POST", "/grants", api.post("/grants", owner, json={"scope": "read"}), 201)
    check_answer(doc, "GET", "/grants", api.get("/grants", owner), 200)
    check_answer(doc, "DELETE", "/grants/{grant_id}", api.delete(f"/grants/{minted['id']}", owner), 200)
    api.post("/note", owner, json={"text": "to be erased"})
    check_answer(doc, "POST", "/erase", api.post("/erase", owner, json={"ids": [0]}), 200)
    check_answer(doc, "GET", "/erasures", api.get("/erasures", owner), 200)
    check_answer(doc, "DELETE", "/store", api.delete("/store", owner), 200)


def test_refusals_match(api: Api, doc: dict, owner: str) -> None:
    refused(doc, "GET", "/wake", api.get("/wake"), 401, "auth.invalid")
    refused(doc, "GET", "/health", api.get("/health?access_token=abc"), 400, "auth.token_in_query")
    refused(doc, "POST", "/note", api.post("/note", owner, content=b"{"), 400, "request.bad_json")
    refused(doc, "POST", "/note", api.post("/note", owner, content=b""), 400, "request.empty_body")
    refused(doc, "POST", "/note", api.post("/note", owner, json={"txt": "x"}), 400, "request.unknown_field")
    refused(doc, "GET", "/wake", api.get("/wake?part=1&part=2", owner), 400, "request.duplicate_field")
    refused(doc, "GET", "/recall", api.get("/recall", owner), 400, "request.missing_field")
    refused(doc, "POST", "/note", api.post("/note", owner, json={"text": "x" * 70_000}), 413, "request.too_large")
    refused(doc, "POST", "/note", api.post("/note", owner, json={"text": "a\nb"}), 422, "text.multiline")
    refused(doc, "GET", "/wake", api.get("/wake?part=x", owner), 422, "request.bad_value")
    refused(doc, "GET", "/zoom", api.get("/zoom?block=3-4", owner), 422, "block.invalid")
    refused(doc, "GET", "/recall", api.get("/recall?q=(a", owner), 422, "recall.bad_pattern")
    refused(doc, "GET", "/shape", api.get("/shape?lines=0"), 422, "shape.out_of_range")
    refused(doc, "POST", "/config", api.post("/config", owner, json={"WAKE_LINES": 0}), 422, "config.out_of_range")
    refused(doc, "POST", "/init", api.post("/init", json={"url": "ftp://x"}), 422, "init.bad_url")

    # 97 memories: the wake's cover needs summaries that no nap has written yet
    api.post("/import", owner, json={"entries": entries(97)})
    body = refused(doc, "GET", "/wake", api.get("/wake", owner), 409, "wake.needs_nap")
    assert set(body) == set(doc["components"]["schemas"]["WakeRefusal"]["properties"])
    body = refused(
        doc, "POST", "/nap", api.post("/nap", owner, json={"block": "2-3", "text": "x"}), 409, "nap.wrong_block"
    )
    assert body["due"] == "0-1"
    refused(doc, "POST", "/forget", api.post("/forget", owner, json={"block": "0-1"}), 404, "forget.no_summary")
    body = refused(
        doc,
        "POST",
        "/import",
        api.post("/import", owner, json={"entries": entries(2, "1999-01-01")}),
        422,
        "import.before_log",
    )
    assert body["index"] == 0
    late = entries(3)
    late[2]["date"] = "2020-02-30"
    body = refused(doc, "POST", "/import", api.post("/import", owner, json={"entries": late}), 422, "import.bad_date")
    assert body["index"] == 2
    refused(doc, "POST", "/import", api.post("/import", owner, json={"entries": []}), 422, "import.empty")


def test_scope_refusals_match(api: Api, doc: dict, owner: str) -> None:
    if ("POST", "/grants") not in {(r.method, r.path) for r in ROUTES}:
        pytest.skip("no grant routes on this server")
    tokens = {"owner": owner}
    for scope in ("read", "full"):
        tokens[scope] = api.post("/grants", owner, json={"scope": scope}).json()["token"]
    api.post("/note", owner, json={"text": "one"})
    for r in ROUTES:
        # DELETE routes and POST /rotate end what the next calls need; tests of
        # their own check their refusals.
        if r.scope not in SECURED or r.method == "DELETE" or r.path == "/rotate":
            continue
        for scope, token in tokens.items():
            # A /m/{name} copy is called on memory main, which every capability here is bound to.
            path = r.path.replace("{name}", "main").replace("{source}", "main")
            resp = api.request(r.method, path, token, **SAMPLES.get((r.method, r.base), {}))
            # append is beside read, not above it: full and owner may note, read may not
            if (scope not in ("full", "owner")) if r.scope == "append" else RANK[scope] < RANK[r.scope]:
                refused(doc, r.method, r.path, resp, 403, "auth.scope")
            else:
                # past the scope check, whatever the route then answers is one the document gives it
                assert resp.status_code not in (401, 403), (r.method, r.path, scope, resp.text[:200])
                check_answer(doc, r.method, r.path, resp)


# A well-formed request for each route that needs one, so the only thing wrong
# with it is the token.
SAMPLES: dict[tuple[str, str], dict] = {
    ("GET", "/recall"): {"params": {"q": "one"}},
    ("POST", "/recall"): {"json": {"q": "one"}},
    ("GET", "/zoom"): {"params": {"block": "0-1"}},
    ("POST", "/zoom"): {"json": {"block": "0-1"}},
    ("POST", "/note"): {"json": {"text": "a memory"}},
    ("POST", "/nap"): {"json": {}},
    ("POST", "/wake"): {"json": {}},
    ("POST", "/forget"): {"json": {"block": "0-1"}},
    ("POST", "/config"): {"json": {"WAKE_LINES": 50}},
    ("POST", "/import"): {"json": {"entries": [{"date": OLD_DATE, "text": "x"}]}},
    ("POST", "/grants"): {"json": {"scope": "read"}},
    ("POST", "/erase"): {"json": {"ids": [0]}},
    ("POST", "/memories"): {"json": {"name": "sample"}},
    ("POST", "/memories/{source}/fork"): {"json": {"name": "sample-fork"}},
    ("POST", "/memories/erase"): {"json": {"q": "one", "dry_run": True}},
}


def test_every_secured_route_refuses_a_missing_token(api: Api, doc: dict) -> None:
    for r in ROUTES:
        if r.scope not in SECURED:
            continue
        path = r.path.replace("{grant_id}", "2").replace("{name}", "main")
        resp = api.request(r.method, path, None, **SAMPLES.get((r.method, r.base), {}))
        refused(doc, r.method, r.path, resp, 401, "auth.invalid")


def test_rate_limited_and_unknown_routes_are_the_error_shape(data_dir, doc: dict) -> None:
    limited = Api(create_app(make_settings(data_dir, auth_failures_per_minute=2)))
    try:
        for _ in range(2):
            refused(doc, "GET", "/config", limited.get("/config"), 401, "auth.invalid")
        resp = limited.get("/config")
        refused(doc, "GET", "/config", resp, 429, "rate_limited")
        assert int(resp.headers["retry-after"]) >= 1
        # not routes of the document, but still the Error shape
        error = doc["components"]["schemas"]["Error"]
        for resp, status, code in (
            (limited.get("/nowhere"), 404, "route.unknown"),
            (limited.delete("/health"), 405, "method_not_allowed"),
        ):
            assert_error(resp, status, code)
            assert problems(doc, error, resp.json()) == []
    finally:
        limited.close()
