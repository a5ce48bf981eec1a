"""One exception tree for every refusal the service makes.

Each class carries its HTTP status and a stable ``code``; the web layer has a
single handler that renders ``{"error": code, "message": message}`` plus any
``extra`` fields. Messages are written for the caller and say what to do next;
they never contain a token, a key, a path or memory text.
"""

from __future__ import annotations

from typing import Any


class StashError(Exception):
    status = 500
    code = "internal"

    def __init__(self, message: str, *, code: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message, **self.extra}


class Malformed(StashError):
    status = 400
    code = "request.malformed"


class Unauthorized(StashError):
    """Always the same answer, whichever way the token failed, so a caller
    cannot tell a revoked token from a mistyped one or another user's."""

    status = 401
    code = "auth.invalid"

    def __init__(self) -> None:
        super().__init__(
            "Send a valid token as 'Authorization: Bearer stash1_…'; a missing, mistyped, "
            "revoked or unknown token gets this same answer."
        )


class Forbidden(StashError):
    status = 403
    code = "auth.scope"


class NotFound(StashError):
    status = 404
    code = "not_found"


class OAuthRefused(StashError):
    """A refusal of the OAuth endpoints: its code is ``oauth.<error>``, the
    error RFC 6749, 7591 or 8707 names, which is what the host is answered."""

    status = 400
    code = "oauth.invalid_request"


class UnknownClient(StashError):
    """An OAuth client this server does not know, or whose metadata document cannot be had."""

    status = 401
    code = "oauth.invalid_client"


class NotAcceptable(StashError):
    """The request accepts no answer the route gives (an MCP host's Accept)."""

    status = 406
    code = "mcp.not_acceptable"


class Misdirected(StashError):
    """A Host this server does not answer for (421, Misdirected Request)."""

    status = 421
    code = "mcp.bad_host"


class Moving(StashError):
    """A shard of a fleet on its way to another host (``stash fleet move``):
    its requests wait a moment and are sent again; nothing was done."""

    status = 503
    code = "fleet.moving"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Conflict(StashError):
    status = 409
    code = "conflict"


class TooLarge(StashError):
    status = 413
    code = "request.too_large"


class Invalid(StashError):
    status = 422
    code = "request.invalid"


class TooMany(StashError):
    status = 429
    code = "rate_limited"

    def __init__(self, message: str, retry_after: int, *, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after


class QuotaReached(StashError):
    """A limit the operator set on one memory (``stash serve --quota-*``):
    nothing was written."""

    status = 403
    code = "quota.memories"


class Damaged(StashError):
    """Stored bytes failed authentication: they were altered, moved or belong
    to someone else. Never served; reported without naming any secret."""

    status = 500
    code = "store.damaged"


class RolledBack(Damaged):
    """The log is shorter than, or on another history from, the head recorded
    for it (in the file, or the copy in the key ring): it was cut short or
    replaced with an older copy. Never served."""

    code = "store.rolled_back"


class PinMismatch(Conflict):
    """The log does not continue the head the client pinned (``Stash-Pin``)."""

    code = "store.pin_mismatch"


class Unavailable(StashError):
    """The storage refused for a reason outside the data itself: a full disk,
    a read-only folder, a missing or unreadable file (or, for the readiness
    probe, a data folder that cannot be written). Nothing was written; what
    was acknowledged before is untouched."""

    status = 503
    code = "store.unavailable"


class Stopping(Unavailable):
    """The server was stopping and cut the request (stash/web/stopping.py),
    or interrupted its work in a file (storage/safeopen.py)."""

    code = "server.stopping"

    def __init__(self) -> None:
        super().__init__(
            "The server was stopping and cut this request; resend it with the same Idempotency-Key "
            "once the server is back, and the answer says whether it was done."
        )


class Full(Unavailable):
    status = 507
    code = "store.full"
