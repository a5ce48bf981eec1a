"""API-REFERENCE.md documents what the server and its client actually offer:
every route the server routes and every verb the ``stash`` client takes."""

from __future__ import annotations

import importlib
import re

from stash.cli.main import HOST_VERBS
from stash.web.codes import CODES
from stash.web.fields import error_codes
from stash.web.routes import ROUTES
from tests.support.docs.commands import reference

# docs/DESIGN.md, "HTTP surface", names these verbs; the client may offer more, never fewer.
SPEC_VERBS = ("wake", "note", "nap", "recall", "zoom", "forget", "config", "import", "grants")


def route_pattern(method: str, path: str) -> re.Pattern:
    """``METHOD /path`` as written in prose or a heading; a path parameter may
    carry any name (``{id}`` or ``{grant_id}``), and the path must not run on
    into a longer one (``/grants`` is not found inside ``/grants/{id}``)."""
    parts = re.split(r"(\{[^}]*\})", path)
    body = "".join(r"\{[^}]+\}" if p.startswith("{") else re.escape(p) for p in parts)
    return re.compile(rf"\b{method} {body}(?![\w/.{{-])")


def test_every_route_is_in_the_reference() -> None:
    text = reference()
    # A route's /m/{name} copy is the same route: the reference's "Memories" section says so once.
    missing = [f"{r.method} {r.base}" for r in ROUTES if not route_pattern(r.method, r.base).search(text)]
    assert "/m/{name}/…" in text
    assert missing == [], f"routes missing from API-REFERENCE.md: {missing}"


def client_verbs() -> list[str]:
    try:
        client = importlib.import_module("stash.client")
    except ModuleNotFoundError:
        return list(SPEC_VERBS)
    verbs = getattr(client, "VERBS", ())
    return sorted(set(verbs) | set(SPEC_VERBS) | set(HOST_VERBS))


def test_every_client_verb_is_in_the_reference() -> None:
    """The client's verbs and the host verbs (serve, backup, verify, mcp) alike."""
    text = reference()
    missing = [v for v in client_verbs() if not re.search(rf"\bstash {re.escape(v)}\b", text)]
    assert missing == [], f"client verbs missing from API-REFERENCE.md (as 'stash <verb>'): {missing}"


def test_route_pattern_is_strict() -> None:
    """The matcher must be able to fail, or the tests above prove nothing."""
    pat = route_pattern("GET", "/grants")
    assert pat.search("call GET /grants to list")
    assert not pat.search("DELETE /grants/{id} only")
    assert not pat.search("GET /grants/{id}")
    assert not pat.search("GET /grantsx")
    assert route_pattern("DELETE", "/grants/{grant_id}").search("`DELETE /grants/{id}` revokes")
    assert route_pattern("GET", "/").search("`GET /` the landing page")
    assert not route_pattern("GET", "/").search("GET /wake only")


STATUSES = {c.status for c in CODES.values()}


def route_sections(text: str) -> dict[str, str]:
    """Each ``### METHOD /path · …`` section of the reference, by heading."""
    out = {}
    for m in re.finditer(r"^### ((?:[A-Z]+ /\S*(?: · )?)+)\n(.*?)(?=^##)", text, flags=re.M | re.S):
        out[m.group(1).strip()] = m.group(2)
    return out


def errors_prose(section: str) -> list[tuple[int, str]]:
    """``(status, code)`` for every code an ``Errors:`` paragraph names, each
    with the status written last before it (``Errors: 400 `a`, `b`; 409 `c```)."""
    out = []
    for para in re.findall(r"^Errors:(.*?)(?:\n\n|\Z)", section, flags=re.M | re.S):
        status = 0
        for m in re.finditer(r"\*{0,2}\b([1-5][0-9]{2})\b|`([a-z_]+(?:\.[a-z_]+)*)`", para):
            if m.group(1):
                if int(m.group(1)) in STATUSES:  # "up to 256 summaries" is not a status
                    status = int(m.group(1))
            elif status and ("." in m.group(2) or m.group(2) in CODES):
                out.append((status, m.group(2)))
    return out


def test_each_route_sections_errors_are_codes_that_route_answers_with_their_status() -> None:
    """The "Errors:" lines are prose, written by hand beside the generated
    tables: each code they name must be one the section's routes declare
    (stash/web/routes/), under the status it has (codes.py), so the prose cannot
    drift from the declarations."""
    sections = route_sections(reference())
    by_name = {f"{r.method} {r.path}": r for r in ROUTES}
    wrong = []
    checked = 0
    for heading, body in sections.items():
        routes = [by_name[name] for name in heading.split(" · ") if name in by_name]
        if not routes:
            continue
        declared = {(status, code) for r in routes for status, codes in error_codes(r).items() for code in codes}
        for status, code in errors_prose(body):
            checked += 1
            if (status, code) not in declared:
                wrong.append(f"{heading}: {status} {code}")
    assert checked > 50  # the parse found the prose
    assert wrong == [], f"API-REFERENCE.md names errors its routes do not declare so: {wrong}"


def test_the_errors_prose_reader_reads_statuses_and_codes() -> None:
    section = (
        "Errors: 400 `request.bad_json`, `request.unknown_field`; **404 `grants.unknown`** (no such\nid, "
        "up to 256 of them); 429 `rate_limited`.\n\nLater prose `not.a_code` 500."
    )
    assert errors_prose(section) == [
        (400, "request.bad_json"),
        (400, "request.unknown_field"),
        (404, "grants.unknown"),
        (429, "rate_limited"),
    ]
