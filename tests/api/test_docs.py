"""API-REFERENCE.md documents what the server and its client actually offer:
every route the server routes and every verb the ``stash`` client takes."""

from __future__ import annotations

import importlib
import re

from stash.cli.main import HOST_VERBS
from stash.web.routes import ROUTES
from tests.doc_commands import reference

# SPEC §5 names these verbs; the client may offer more, never fewer.
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
    missing = [f"{r.method} {r.path}" for r in ROUTES if not route_pattern(r.method, r.path).search(text)]
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
