"""Who may mint an identity (``POST /init``): the operator's mode (open,
by invite, or off) and the per-address limits on wrong invites and on
identities minted per minute and per day."""

from __future__ import annotations

import hmac
from typing import Any, Protocol

from ..core.errors import Forbidden, Invalid, TooMany
from ..core.lines import plural
from .onboarding import BAD_URL

DAY_S = 24 * 60 * 60


class Limiter(Protocol):
    def blocked_for(self, kind: str, client: str, limit: int, period: float = ...) -> int: ...

    def hit(self, kind: str, client: str, period: float = ...) -> None: ...


def admit(policy: Any, limiter: Limiter, client: str, invite: object, address: str | None) -> None:
    """Let ``client`` mint one identity under ``policy`` (the server's
    settings: ``init``, ``invite_secret`` and the per-address limits), or
    refuse with the reason. ``address`` is the address the new user's
    AGENTS.md block will name (None: the one given was refused). A wrong
    invite spends the address's failure budget; an admitted mint counts
    against its per-minute and per-day limits."""
    if policy.init == "off":
        raise Forbidden("This server does not mint identities; ask its operator for one.", code="init.disabled")
    if policy.init == "invite":
        wait = limiter.blocked_for("auth", client, policy.auth_failures_per_minute)
        if wait:
            raise TooMany(f"Too many wrong invites from this address; wait {wait} s.", wait)
        expected = (policy.invite_secret or "").encode()
        if not isinstance(invite, str) or not hmac.compare_digest(invite.encode(), expected):
            limiter.hit("auth", client)
            raise Forbidden(
                'This server mints identities by invitation only; send the operator\'s invite as "invite".',
                code="init.invite_required",
            )
    wait = limiter.blocked_for("init", client, policy.init_per_minute)
    if wait:
        raise TooMany(f"Too many identities minted from this address; wait {wait} s.", wait)
    wait = limiter.blocked_for("init_day", client, policy.init_per_day, DAY_S)
    if wait:
        raise TooMany(
            f"This address minted the {plural(policy.init_per_day, 'identity')} a day this server "
            f"allows; wait {wait} s, or reuse a token you already have.",
            wait,
            code="quota.identities",
        )
    if address is None:
        raise Invalid(BAD_URL, code="init.bad_url")
    limiter.hit("init", client)
    limiter.hit("init_day", client, DAY_S)
