"""How a module of :mod:`stash.web.routes` declares its routes, and the
pieces of answers more than one of them writes. A declaration
(:class:`~stash.web.dispatch.RouteSpec`) says how the route is called and
guarded, what it reads and answers, its own refusals, and what happens
around its handler: its Idempotency-Key record, the notes it adds against
the quotas, its audit event, its cleanup."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..dispatch import RouteSpec
from ..fields import Fields
from ..schemas import ref

Handler = Callable[..., Any]
Args = dict[str, Any]  # a request's fields, read as its route declares them
Answer = dict[str, Any]


class Declarations:
    """The routes one part of the table declares, in the order it declares
    them; the table (:mod:`stash.web.routes`) sets the parts in order."""

    def __init__(self) -> None:
        self.routes: list[RouteSpec] = []

    def route(self, method: str, path: str, scope: str, summary: str, **kw: Any) -> Callable[[Handler], Handler]:
        """Declare the route the decorated function handles."""

        def declare(handler: Handler) -> Handler:
            self.routes.append(RouteSpec(method, path, scope, summary, handler, **kw))
            return handler

        return declare

    def twins(
        self, path: str, scope: str, summaries: tuple[str, str], fields: Fields, description: str, **kw: Any
    ) -> Callable[[Handler], Handler]:
        """Declare a read-only route and its POST twin (docs/DESIGN.md, "HTTP surface"), sharing one
        declaration of their fields: query parameters of the one, JSON body of the other."""

        def declare(handler: Handler) -> Handler:
            self.routes.append(
                RouteSpec("GET", path, scope, summaries[0], handler, fields=fields, description=description, **kw)
            )
            self.routes.append(
                RouteSpec(
                    "POST",
                    path,
                    scope,
                    summaries[1],
                    handler,
                    fields=fields,
                    description=description + " POST twin of the GET route: the same fields as a JSON body.",
                    **kw,
                )
            )
            return handler

        return declare


NO_FIELDS = Fields()
# In every owner listing over the identity's memories (GET /memories, /grants, /audit).
UNOPENED = {
    "type": "array",
    "items": ref("Unopened"),
    "description": "The memories this answer could not open, each named with its refusal; empty when every "
    "memory opened. The rest is listed all the same.",
}
FLUSHED = {
    "type": "boolean",
    "description": "`true`: the write-ahead logs holding the destroyed keys were "
    "flushed into their files and emptied; after an erasure, those of every file of each memory it erased "
    "in (`memory.db`, its key ring, where append notes wait, and `recall.db`), so nothing of an erased "
    "memory is left in any file of its folder. `false`: the action is in force, the flush is still pending "
    "(every later close of the file retries it; a resend with the same Idempotency-Key tries again).",
}
