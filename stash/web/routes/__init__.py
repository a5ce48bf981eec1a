"""The one table of every route (docs/DESIGN.md, "HTTP surface"): the app,
/openapi.json, the API reference's generated tables and the client's list of
keyed writes are all made from :data:`ROUTES`.

Each route is declared once, right above its handler, in the module of its
caller: :mod:`.agent` (what a capability calls: wake, note, nap, recall,
zoom, forget, config, import), :mod:`.owner` (grants, rotation, erasure,
audit, export, the identity's end), :mod:`.memories` (the owner's many
memories), :mod:`.mcp_oauth` (/mcp and the OAuth a host gets its token by)
and :mod:`.public` (health, a new identity, the documents and pages);
:mod:`.declare` holds how they declare and what they share. The handler
takes the parsed fields (and, for a route that needs a capability, the
authenticated session) and returns the answer from one call into the
service layer; everything else is done from the declaration.

Adding a route: one declaration and its handler in the module of its
caller, its service function, its tests; then ``python -m stash.web.refgen
--write`` regenerates the reference's tables and the client's list of keyed
writes."""

from __future__ import annotations

from dataclasses import replace

from ..dispatch import MEMORY_PREFIX
from ..dispatch import RouteSpec as RouteSpec  # the declaration's class, named where the table is
from . import agent, mcp_oauth, memories, owner, public

# Every memory route is served again under /m/{name}, acting on that memory; the public documents too, so
# an agent whose STASH_URL ends in /m/{name} fetches the skill and the reference as its block says.
MEMORY_PATHS = (
    "/wake",
    "/note",
    "/nap",
    "/recall",
    "/zoom",
    "/forget",
    "/config",
    "/import",
    "/export",
    "/erase",
    "/erase/undo",
    "/erasures",
    "/skill",
    "/reference",
    "/health",
    "/mcp",
)

# In the order of /openapi.json and the reference.
_AT_THE_ROOT = [
    *public.START.routes,
    *agent.AGENT.routes,
    *owner.OWNER.routes,
    *public.DOCUMENTS.routes,
    *memories.MEMORIES.routes,
    *mcp_oauth.MCP_OAUTH.routes,
]
ROUTES: list[RouteSpec] = [
    *_AT_THE_ROOT,
    *(replace(r, path=MEMORY_PREFIX + r.path, under=True) for r in _AT_THE_ROOT if r.path in MEMORY_PATHS),
    *public.CONSOLE.routes,
]
"""Every route, in the order of /openapi.json and the reference."""
