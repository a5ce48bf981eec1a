"""The shape of the route table itself (docs/DESIGN.md, "HTTP surface") and the regressions the
schemathesis run (tests/e2e/test_schemathesis.py) found in the server and its
OpenAPI document: every read route that takes fields has a POST twin taking
the same fields as JSON, no route ends in ``/``, a 405 names every method the
path takes, the request schemas say what the server refuses, and the
reference's hand-written prose names every answer field."""

from __future__ import annotations

import re

import pytest

from stash.web.routes import ROUTES
from tests.support.api import Api, assert_error
from tests.support.docs.openapi import problems

OLD_DATE = "2020-02-03"


@pytest.fixture
def doc(api: Api) -> dict:
    return api.get("/openapi.json").json()


def query_fields(doc: dict, path: str) -> dict[str, tuple[dict, bool]]:
    op = doc["paths"][path]["get"]
    return {p["name"]: (p["schema"], p["required"]) for p in op.get("parameters", []) if p["in"] == "query"}


def test_no_route_ends_in_a_slash_and_a_trailing_slash_is_not_redirected(api: Api) -> None:
    assert [f"{r.method} {r.path}" for r in ROUTES if r.path.endswith("/") and r.path != "/"] == []
    # Starlette would redirect /health/ to /health; the server answers 404 instead, so a
    # client learns the real route rather than depending on a redirect a gateway may drop.
    for path in ("/health/", "/wake/", "/shape/"):
        assert_error(api.get(path), 404, "route.unknown")


def test_every_read_route_with_fields_has_a_post_twin_with_the_same_fields() -> None:
    table = {(r.method, r.path): r for r in ROUTES}
    # GET /authorize is a browser's navigation, its query OAuth's protocol: no broker calls it.
    reads = [r for r in ROUTES if r.method == "GET" and r.fields is not None and r.fields.items and r.protocol is None]
    # the routes docs/DESIGN.md gives a query string must all be here, or this test proves little
    assert {r.path for r in reads} >= {"/wake", "/recall", "/zoom", "/shape"}
    for r in reads:
        twin = table.get(("POST", r.path))
        assert twin is not None, f"GET {r.path} has no POST twin"
        assert twin.scope == r.scope and twin.handler is r.handler, r.path
        # one declaration read two ways, so the twins' fields, limits and refusals cannot differ
        assert twin.fields is r.fields, f"POST {r.path} declares its fields apart from GET {r.path}"


def test_the_post_twins_answer_what_the_get_routes_answer(api: Api, owner: str) -> None:
    entries = [{"date": OLD_DATE, "text": f"twin memory {k}"} for k in range(6)]
    assert api.post("/import", owner, json={"entries": entries}).status_code == 200
    for path, fields in (
        ("/wake", {"part": 1}),
        ("/recall", {"q": "memory [24]"}),
        ("/zoom", {"block": "4-7"}),
        ("/shape", {"T": 300, "lines": 12}),
    ):
        got = api.get(path, owner, params=fields)
        twin = api.post(path, owner, json=fields)
        assert got.status_code == 200, got.text
        assert (twin.status_code, twin.json()) == (200, got.json()), path


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("OPTIONS", "/config", "GET, HEAD, POST"),
        ("DELETE", "/wake", "GET, HEAD, POST"),
        ("PUT", "/recall", "GET, HEAD, POST"),
        ("GET", "/note", "POST"),
        ("POST", "/grants/7", "DELETE"),
        ("GET", "/store", "DELETE"),
    ],
)
def test_a_405_names_every_method_the_path_takes(api: Api, method: str, path: str, allowed: str) -> None:
    # Found by schemathesis: each method of a path is its own route, and the 405
    # named only the first one's methods (OPTIONS /config said "Allow: HEAD, GET").
    resp = api.request(method, path)
    assert_error(resp, 405, "method_not_allowed")
    assert resp.headers["allow"] == allowed


def test_shape_blocks_schema_loads_without_prefix_items(doc: dict, api: Api) -> None:
    # Found by schemathesis 4: a prefixItems pair made it reject the whole document
    # for /shape. The pair is now items + minItems/maxItems, as exact as before.
    blocks = doc["paths"]["/shape"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    pair = blocks["properties"]["blocks"]["items"]
    assert "prefixItems" not in pair and (pair["minItems"], pair["maxItems"]) == (2, 2)
    answer = api.get("/shape?T=5&lines=96").json()
    assert problems(doc, blocks, answer) == []
    assert problems(doc, blocks, {**answer, "blocks": [[0, 1, 2]]})
    assert problems(doc, blocks, {**answer, "blocks": [[0]]})


@pytest.mark.parametrize("text", ["", "   ", "tab\there", "two\nlines", "sep\u2028x", "nel\x85x", "x" * 281])
def test_the_note_schema_refuses_what_the_server_refuses(api: Api, owner: str, doc: dict, text: str) -> None:
    # Found by schemathesis: the schema said "any string", so most generated notes
    # were refused by the server. Now a text the server refuses fails the schema too.
    schema = doc["paths"]["/note"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert problems(doc, schema, {"text": text}), repr(text)
    assert api.post("/note", owner, json={"text": text}).status_code == 422


@pytest.mark.parametrize("text", ["a", "  spaced  ", "ünïcödé ✓ — fine", "x" * 280])
def test_the_note_schema_takes_what_the_server_takes(api: Api, owner: str, doc: dict, text: str) -> None:
    schema = doc["paths"]["/note"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert problems(doc, schema, {"text": text}) == []
    assert api.post("/note", owner, json={"text": text}).status_code == 200


def test_recall_and_init_schemas_carry_the_server_limits(api: Api, owner: str, doc: dict) -> None:
    q = query_fields(doc, "/recall")["q"][0]
    assert (q["minLength"], q["maxLength"]) == (1, 512)
    assert api.post("/recall", owner, json={"q": "a" * 512}).status_code == 200
    assert_error(api.post("/recall", owner, json={"q": "a" * 513}), 422, "recall.bad_pattern")
    assert_error(api.post("/recall", owner, json={"q": ""}), 422, "recall.bad_pattern")
    url = doc["paths"]["/init"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]["url"]
    assert re.search(url["pattern"], "https://stash.example") and not re.search(url["pattern"], "ftp://x")
    assert_error(api.post("/init", json={"url": "ftp://x"}), 422, "init.bad_url")
    date = doc["paths"]["/import"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert date["properties"]["entries"]["items"]["properties"]["date"]["format"] == "date"


def test_the_document_is_the_router_and_every_operation_is_described(api: Api, doc: dict) -> None:
    """Both directions, from what actually serves requests: every method and
    path the app routes is an operation of the document, and every operation
    is routed."""
    from starlette.routing import Route

    routed = set()
    for route in api.app.router.routes:
        assert isinstance(route, Route), f"a mount or other non-route is served but not documented: {route}"
        routed |= {(m, route.path) for m in route.methods or () if m != "HEAD"}  # Starlette adds HEAD to every GET
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert documented == routed


def reference_sections() -> dict[str, str]:
    from tests.support.docs.commands import reference

    parts = re.split(r"^### ", reference(), flags=re.M)
    return {p.split("\n", 1)[0]: p for p in parts[1:]}


def test_every_answer_field_of_every_route_is_in_its_reference_section(doc: dict) -> None:
    """Field by field: each header and path parameter and each top-level
    field of a route's answer is named, in backticks, in that route's
    section of API-REFERENCE.md. Request fields need no such check: their
    tables there are generated from the same declaration as the document."""
    sections = reference_sections()
    missing = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            # A /m/{name} copy is answered as the route at the root, in that route's section.
            base = path.removeprefix("/m/{name}")
            heading = next(
                (h for h in sections if re.search(rf"\b{method.upper()} {re.escape(base)}(?![\w/.{{])", h)), None
            )
            assert heading, f"{method.upper()} {path} has no section"
            section = sections[heading]
            # Stash-Pin is taken by every authenticated route alike; its one
            # section ("The log head and Stash-Pin") is checked below.
            fields = [
                p["name"]
                for p in op.get("parameters", [])
                if p["in"] != "query" and p["name"] != "Stash-Pin" and not (base != path and p["name"] == "name")
            ]
            answer = next(iter(op["responses"].values())).get("content") or {"": {}}  # a 303 has no body
            schema = next(iter(answer.values())).get("schema", {})
            if "$ref" in schema:
                schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
            fields += list(schema.get("properties", {}))
            missing += [
                f"{method.upper()} {path}: {f}"
                for f in fields
                if f"`{f}`" not in section and f'"{f}"' not in section and f"{{{f}" not in section
            ]
    assert missing == []
    from tests.support.docs.commands import reference

    pin = reference().split("\n## The log head and Stash-Pin\n", 1)[1].split("\n## ", 1)[0]
    assert "`Stash-Pin: <count>:<digest>:<state>`" in pin and "`pin`" in pin


@pytest.mark.parametrize("invite", [1, True, ["x"], {"a": 1}])
def test_init_refuses_an_invite_that_is_not_a_string_in_every_mode(api: Api, invite: object) -> None:
    # Found by schemathesis (negative_data_rejection): on an open server a non-string
    # invite was ignored and an identity minted, so a broken client never found out.
    assert_error(api.post("/init", json={"invite": invite}), 422, "request.bad_value")
    assert api.post("/init", json={"invite": "ignored on an open server"}).status_code == 201


def test_head_reads_the_query_string_as_its_get_does(api: Api, owner: str) -> None:
    # HEAD runs the GET route's handler, so it reads the same declared fields from the query
    # (before RouteSpec declared them, HEAD read a body instead and ignored the query).
    assert api.request("HEAD", "/recall?q=anything", owner).status_code == 200
    assert api.request("HEAD", "/wake?part=x", owner).status_code == 422
    assert api.request("HEAD", "/config?stray=1", owner).status_code == 400
