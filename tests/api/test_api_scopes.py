"""Who may call what (the scope column of docs/DESIGN.md,
"HTTP surface"), and how a bad token is
refused: always the same 401, whichever way the token failed.

The design document's route table is read from docs/DESIGN.md, and ROUTES must equal it;
that every route answers every kind of token as its declared scope says is
tests/api/test_scope_matrix.py's test, so together they hold the server to
the design."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from stash.crypto import tokens
from stash.web.routes import ROUTES
from tests.api.support import Mem, mint, state
from tests.support.api import Api, assert_error
from tests.support.route_calls import CALLS as ROUTE_CALLS

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "DESIGN.md"


def design_scopes() -> dict[str, str]:
    """The route table of docs/DESIGN.md, "HTTP surface", as written there:
    each row's routes (a path without a method takes the method before it)
    and the scope in its last column."""
    section = DESIGN.read_text(encoding="utf-8").split("## HTTP surface", 1)[1].split("\n## ", 1)[0]
    out: dict[str, str] = {}
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if not row.startswith("| `") or len(cells) < 3:
            continue
        method = ""
        for item in re.findall(r"`([^`]+)`", cells[0]):
            if " " in item:
                method, item = item.split(" ", 1)
            out[normal(method, item)] = cells[-1]
    return out


PATH_PARAM = re.compile(r"\{[^}]*\}")


def normal(method: str, path: str) -> str:
    return f"{method} {PATH_PARAM.sub('{id}', path)}"


SCOPES = design_scopes()


def test_routes_table_matches_the_design() -> None:
    assert len(SCOPES) > 30 and SCOPES["DELETE /grants/{id}"] == "owner"  # the table was read
    served = {normal(r.method, r.path): r.scope for r in ROUTES if not r.under}
    assert served == SCOPES
    # Every /m/{name} copy has its route's scope; the design's table lists each route once.
    assert all(
        r.scope == next(b.scope for b in ROUTES if b.path == r.base and b.method == r.method) for r in ROUTES if r.under
    )


class World:
    """A user with four memories, two summaries and a spare capability, and a
    token of each scope."""

    def __init__(self, api: Api, owner: str) -> None:
        self.api = api
        self.owner = owner
        mem = Mem(api, owner)
        mem.import_(["alpha", "beta", "gamma", "delta"])
        mem.nap("0-1", "alpha and beta")
        mem.nap("2-3", "gamma and delta")
        self.read = mint(api, owner, "read")
        self.full = mint(api, owner, "full")
        vault = api.app.state.vault
        with vault.session(owner, "owner") as s:
            self.spare, _ = vault.mint_grant(s, "read")

    def token(self, who: str | None) -> str | None:
        return None if who is None else getattr(self, who)

    # what a call of the table needs of this memory; each caller is named by ``who``

    def forgettable(self, who: str) -> str:
        """Full forgets the second pair, owner the first: each call finds a summary to drop."""
        return "0-1" if who == "owner" else "2-3"

    def revocable_grant(self, who: str) -> int:
        return self.spare

    def deletable_memory(self, who: str) -> str:
        return "nope"


# The one table of a request per route (tests/support/route_calls.py), keyed as the design's table is.
CALLS = {normal(*route.split(" ", 1)): call for route, call in ROUTE_CALLS.items()}

RANK = {"read": 0, "full": 1, "owner": 2}


def expected(scope: str, who: str | None) -> int | None:
    """The status docs/DESIGN.md, "HTTP surface", gives, or None for "anything but 401/403"."""
    if scope in ("public", "operator"):
        return None
    if who is None:
        return 401
    if scope == "capability":  # any live capability is let in; each of its calls is scoped (test_mcp_api.py)
        return 200
    if scope == "append":  # append is beside read, not above it: full and owner may note, read may not
        return 200 if who in ("full", "owner") else 403
    return 200 if RANK[who] >= RANK[scope] else 403


def test_read_cannot_write_and_full_cannot_own(api: Api, owner: str) -> None:
    world = World(api, owner)
    before = state(api, owner)
    for route, scope in SCOPES.items():
        for who in ("read", "full"):
            if expected(scope, who) != 403:
                continue
            method, url, body = CALLS[route](world, who)
            kw = {} if body is None else {"json": body}
            assert_error(api.request(method, url, world.token(who), **kw), 403, "auth.scope")
    assert state(api, owner) == before
    # The spare capability was not revoked and the store still answers.
    grants = api.get("/grants", owner).json()["grants"]
    assert any(g["id"] == world.spare and g["revoked"] is None for g in grants)


def test_no_route_mints_an_owner_capability(api: Api, owner: str) -> None:
    assert_error(api.post("/grants", owner, json={"scope": "owner"}), 422)
    assert_error(api.post("/grants", owner, json={}), 400)
    assert_error(api.post("/grants", owner), 400)
    assert [g["scope"] for g in api.get("/grants", owner).json()["grants"]] == ["owner"]


# ---------------------------------------------------------------- bad tokens


def spliced(a: str, b: str) -> str:
    """User A's id in front of user B's secret and checksum."""
    return a[:24] + b[24:]


def checksummed(body: str) -> str:
    token = body + tokens._checksum(body)
    assert tokens.parse(token) is not None  # passes the checksum: it must be refused later
    return token


def flip(ch: str) -> str:
    return "A" if ch != "A" else "B"


def bad_tokens(api: Api, owner: str) -> dict[str, dict]:
    """Authorization headers for every way a token can fail."""
    other = api.init()["token"]
    revoked = mint(api, owner, "full")
    grant_id = max(g["id"] for g in api.get("/grants", owner).json()["grants"])
    assert api.delete(f"/grants/{grant_id}", owner).status_code == 200
    unknown, _ = tokens.mint("0123456789abcdef")
    upper = owner[:7] + owner[7:23].upper() + owner[23:-6]
    forged_secret = checksummed(owner[:24] + other[24:-6])  # A's id, B's secret, a valid checksum
    cases = {
        "missing": {},
        "empty-bearer": {"Authorization": "Bearer "},
        "other-scheme": {"Authorization": f"Basic {owner}"},
        "no-scheme": {"Authorization": owner},
        "malformed": {"Authorization": "Bearer stash1_nothing_like_a_token"},
        "bogus-checksum": {"Authorization": f"Bearer {owner[:-1] + flip(owner[-1])}"},
        "bogus-secret": {"Authorization": f"Bearer {owner[:30] + flip(owner[30]) + owner[31:]}"},
        "truncated": {"Authorization": f"Bearer {owner[:-1]}"},
        "extended": {"Authorization": f"Bearer {owner}x"},
        "unknown-user": {"Authorization": f"Bearer {unknown}"},
        "spliced": {"Authorization": f"Bearer {spliced(owner, other)}"},
        "spliced-checksummed": {"Authorization": f"Bearer {forged_secret}"},
        "revoked": {"Authorization": f"Bearer {revoked}"},
        "uppercase-user": {"Authorization": f"Bearer {upper + tokens._checksum(upper)}"},
    }
    if owner[7:23] == owner[7:23].upper():  # all digits: nothing to uppercase
        del cases["uppercase-user"]
    return cases


def test_every_bad_token_gets_the_same_401(api: Api, owner: str) -> None:
    cases = bad_tokens(api, owner)
    before = state(api, owner)
    answers = {}
    for name, headers in cases.items():
        for method, url, body in (
            ("GET", "/wake", None),
            ("POST", "/note", {"text": "forged"}),
            ("GET", "/export", None),
            ("DELETE", "/store", None),
        ):
            kw: dict[str, Any] = {} if body is None else {"json": body}
            resp = api.request(method, url, headers=headers, **kw)
            assert_error(resp, 401)
            answers[(name, method, url)] = (resp.status_code, resp.content, resp.headers.get("www-authenticate"))
    assert len(set(answers.values())) == 1, answers
    assert state(api, owner) == before
    assert api.get("/wake", owner).status_code == 200


def test_token_in_a_query_string_is_refused(api: Api, owner: str) -> None:
    before = state(api, owner)
    for url in (
        f"/wake?token={owner}",
        f"/recall?q=a&access_token={owner}",
        f"/config?key={owner}",
        f"/health?token={owner}",
        f"/zoom?block={owner}",
    ):
        assert_error(api.get(url), 400, "auth.token_in_query")
        assert_error(api.get(url, owner), 400, "auth.token_in_query")
    assert_error(api.post(f"/note?token={owner}", owner, json={"text": "sneaky"}), 400, "auth.token_in_query")
    assert state(api, owner) == before
