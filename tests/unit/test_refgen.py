"""API-REFERENCE.md's generated tables (field tables, scope matrix, error
codes) are what the route declarations say now: a route, field or code
changed without regenerating them fails here."""

from __future__ import annotations

import pytest

from stash.web import refgen
from stash.web.routes import RouteSpec
from stash.web.routes.public import health
from tests.support.docs.commands import REFERENCE
from tests.support.server import REPO


def test_the_generated_tables_of_the_reference_are_fresh() -> None:
    problems = refgen.stale(REFERENCE.read_text(encoding="utf-8"))
    assert problems == [], f"API-REFERENCE.md is stale; regenerate with: {refgen.REGENERATE}\n" + "\n".join(problems)


def test_a_stale_or_misplaced_table_is_found() -> None:
    """The check must be able to fail, or the test above proves nothing."""
    text = REFERENCE.read_text(encoding="utf-8")
    edited = text.replace("| `GET /wake` | 401 |", "| `GET /wake` | 2xx |", 1)
    assert edited != text and refgen.stale(edited) == ["the table 'scope matrix' is stale"]
    start = "<!-- generated: fields of POST /note -->"
    dropped = text.replace(start, "", 1)
    assert any("fields of POST /note" in p for p in refgen.stale(dropped))
    doubled = text + f"\n{start}\n{refgen.END}\n"
    assert any("appears 2 times" in p for p in refgen.stale(doubled))
    unknown = text + f"\n<!-- generated: fields of GET /nowhere -->\n{refgen.END}\n"
    assert any("GET /nowhere" in p for p in refgen.stale(unknown))
    # an answer or shared-shape table is checked where the prose places one, and needed nowhere
    nap = text.replace("| `remaining` | integer ≥ 0 |", "| `remaining` | integer |", 1)
    assert nap != text and refgen.stale(nap) == ["the table 'schema Nap' is stale"]
    assert refgen.stale(text + "\n<!-- generated: answer of POST /note -->\n" + refgen.END + "\n") == [
        "the table 'answer of POST /note' is stale"
    ]


def test_write_makes_a_stale_table_fresh_and_leaves_the_prose(tmp_path) -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    path = tmp_path / "API-REFERENCE.md"
    path.write_text(text.replace("| `POST /note` | 401 |", "| `POST /note` | 200 |", 1), encoding="utf-8")
    assert refgen.main(["--check", str(path)]) == 1
    assert refgen.main(["--write", str(path)]) == 0
    assert path.read_text(encoding="utf-8") == text
    assert refgen.main(["--check", str(path)]) == 0


def test_field_types_say_what_the_schema_says() -> None:
    assert refgen.describe({"type": "integer", "minimum": 0, "maximum": 10**15}) == "integer 0–10^15"
    assert refgen.describe({"type": "integer", "minimum": 1}) == "integer ≥ 1"
    assert refgen.describe({"type": "string", "minLength": 1, "maxLength": 512}) == "string, 1–512 characters"
    assert refgen.describe({"$ref": "#/components/schemas/BlockId"}) == "block id"
    assert refgen.describe({"enum": ["read", "full"]}) == '`"read"` or `"full"`'
    items = {"type": "object", "properties": {"block": {}, "text": {}}}
    assert (
        refgen.describe({"type": "array", "minItems": 1, "maxItems": 256, "items": items})
        == 'array of 1–256 `{"block", "text"}`'
    )


def test_a_declaration_the_generators_cannot_render_is_refused_at_import() -> None:
    with pytest.raises(ValueError, match="path_params"):
        RouteSpec("DELETE", "/grants/{grant_id}", "owner", "x", health)
    with pytest.raises(ValueError, match=r"no\.such_code"):
        RouteSpec("GET", "/x", "public", "x", health, errors=("no.such_code",))


def test_the_serve_options_table_of_the_deploy_guide_is_checked_and_rewritten(tmp_path) -> None:
    """deploy/README.md's `stash serve` synopsis and options table come from
    the option declarations: an edited row is found and --write restores it."""
    text = (REPO / refgen.DEPLOY_GUIDE).read_text(encoding="utf-8")
    assert refgen.stale(text, refgen.DEPLOY_GUIDE) == []
    edited = text.replace("| `--port PORT` | `STASH_PORT` | 8080 |", "| `--port PORT` | `STASH_PORT` | 80 |", 1)
    assert edited != text
    assert refgen.stale(edited, refgen.DEPLOY_GUIDE) == ["the table 'stash serve options' is stale"]
    dropped = text.replace("<!-- generated: stash serve synopsis -->", "", 1)
    assert any("stash serve synopsis" in p for p in refgen.stale(dropped, refgen.DEPLOY_GUIDE))
    path = tmp_path / "deploy" / "README.md"
    path.parent.mkdir()
    path.write_text(edited, encoding="utf-8")
    assert refgen.main(["--check", str(path)]) == 1
    assert refgen.main(["--write", str(path)]) == 0
    assert path.read_text(encoding="utf-8") == text


def test_the_clients_keyed_writes_are_the_routes_that_take_a_key(tmp_path) -> None:
    """The client's KEYED_WRITES is generated from the declarations: equal
    to the server's, a route's path parameter matched by any value, and a
    hand edit found by --check and undone by --write."""
    from stash import client
    from stash.web.routes import ROUTES

    # The /m/{name} copies are the same writes: the client sends their paths after a STASH_URL ending in /m/{name}.
    assert client.KEYED_WRITES == {(r.method, r.path) for r in ROUTES if r.idempotent and not r.under}
    assert client.is_keyed("DELETE", "/grants/7") and client.is_keyed("POST", "/note")
    assert not client.is_keyed("DELETE", "/grants") and not client.is_keyed("DELETE", "/grants/7/x")
    assert not client.is_keyed("GET", "/note") and not client.is_keyed("DELETE", "/store")
    text = (REPO / refgen.CLIENT).read_text(encoding="utf-8")
    edited = text.replace('    ("POST", "/erase"),\n', "", 1)
    assert edited != text and refgen.stale(edited, refgen.CLIENT) == ["the table 'keyed writes' is stale"]
    path = tmp_path / "client.py"
    path.write_text(edited, encoding="utf-8")
    assert refgen.main(["--check", str(path)]) == 1
    assert refgen.main(["--write", str(path)]) == 0
    assert path.read_text(encoding="utf-8") == text
