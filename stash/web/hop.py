"""A request this host of a fleet sends on to the host that answers it, and
that host's answer passed back whole (stash/fleet/forward.py says when and
why). What travels: the method, the path and query, the body, and the
headers a handler reads (``Host``, so that the page's address and the form's
Origin check come out as here; ``Origin``, ``Referer``, ``Content-Type``,
``Cookie``, ``Accept``); ``X-Forwarded-For`` gets this host's peer appended,
as a proxy's would, and the other host believes it only as its
``--trusted-proxy`` says; and :data:`~stash.fleet.forward.HOP` names this
host."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ..core.errors import Unavailable
from ..fleet.forward import HOP, Fleet, Unreachable, send

_KEPT = ("host", "origin", "referer", "content-type", "cookie", "accept", "accept-language", "user-agent")
_KEPT_FORWARDED = ("x-forwarded-proto", "x-forwarded-host")


def hopped(request: Request) -> bool:
    """Whether another host of the fleet sent this request on (it is answered here, never sent on again)."""
    return HOP.lower() in request.headers


async def forward(request: Request, fleet: Fleet, address: str, body: bytes, unreachable: str) -> Response:
    """``request`` (with ``body`` in place of its own) sent to the host at
    ``address``, and its answer; 503 ``fleet.unreachable`` saying
    ``unreachable`` when none came."""
    headers = [(name, value) for name, value in request.headers.items() if name in _KEPT + _KEPT_FORWARDED]
    peer = request.client.host if request.client else None
    chain = [v.strip() for v in request.headers.getlist("x-forwarded-for") if v.strip()]
    if peer:
        chain.append(peer)
    if chain:
        headers.append(("X-Forwarded-For", ", ".join(chain)))
    headers.append((HOP, fleet.host))
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    try:
        answer = await run_in_threadpool(send, address, request.method, target, headers, body)
    except Unreachable:
        raise Unavailable(unreachable, code="fleet.unreachable") from None
    response = Response(answer.body, status_code=answer.status)
    response.raw_headers = [
        *((k, v) for k, v in response.raw_headers if k == b"content-length"),
        *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers),
    ]
    return response
