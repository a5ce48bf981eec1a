"""What the OAuth routes of an MCP host's flow answer (declared in
stash/web/routes/mcp_oauth.py; the flow itself is stash/service/oauth.py): each
handler's one call into the service, in a worker thread, and the page,
redirect or JSON it becomes."""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, RedirectResponse, Response

from ..core.errors import Forbidden, StashError, TooMany, Unauthorized
from ..service import oauth
from ..service.operation import Limits
from . import consent
from .dispatch import Call

REGISTER_PERIOD = 3600.0


def server_metadata(address: str) -> dict[str, Any]:
    """RFC 8414 metadata: this server is the authorization server of its own MCP endpoints."""
    return {
        "issuer": address,
        "authorization_endpoint": f"{address}/authorize",
        "token_endpoint": f"{address}/token",
        "registration_endpoint": f"{address}/register",
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none"],
        "client_id_metadata_document_supported": True,
        "service_documentation": f"{address}/reference",
    }


def _address(call: Call) -> str:
    return call.page_address(call.settings.public_url)


def _loopback(call: Call) -> bool:
    return bool(call.settings.oauth_loopback_clients == "on")


def _redirect(location: str) -> Response:
    return RedirectResponse(location, status_code=303, headers=dict(consent.NO_STORE))


async def consent_page(call: Call, fields: dict[str, Any]) -> Response:
    await run_in_threadpool(oauth.sweep, call.vault)
    try:
        request, _ = await run_in_threadpool(
            oauth.authorization_request, call.vault, fields, _address(call), _loopback(call)
        )
    except oauth.Redirected as sent:
        return _redirect(sent.location)
    nonce = await run_in_threadpool(oauth.pending, call.vault, request)
    return consent.page(request, nonce)


async def consent_answer(call: Call, fields: dict[str, Any]) -> Response:
    address = _address(call)
    if call.origin != consent.origin_of(address):
        raise Forbidden(
            "This form is taken only from this server's own consent page; open it again from the host.",
            code="consent.bad_origin",
        )
    request = await run_in_threadpool(oauth.take_pending, call.vault, fields["nonce"])
    if fields.get("decision") == "deny":
        return _redirect(oauth.denied(request))
    wait = call.limiter.blocked_for("auth", call.client, call.settings.auth_failures_per_minute)
    if wait:
        raise TooMany(f"Too many failed owner tokens from this address; wait {wait} s.", wait)
    limits = Limits(call.settings.quota_memories, call.settings.quota_bytes)
    try:
        memory = oauth.check_memory(request.get("memory"), fields.get("memory"))
        location = await run_in_threadpool(
            oauth.approve,
            call.vault,
            request,
            fields.get("owner_token") or "",
            memory,
            fields.get("scope"),
            fields.get("expires") or "never",
            address,
            limits,
            call.settings.oauth_code_seconds,
        )
    except StashError as err:
        if not oauth.owner_refused(err):
            raise
        if isinstance(err, Unauthorized):
            call.limiter.hit("auth", call.client)
            call.metrics.event("auth_failed")
        # The form again, under a new nonce, saying what to fix; the request stands.
        nonce = await run_in_threadpool(oauth.pending, call.vault, request)
        return consent.page(request, nonce, error=err.message, status=err.status, memory=fields.get("memory"))
    return _redirect(location)


async def token(call: Call, fields: dict[str, Any]) -> Response:
    await run_in_threadpool(oauth.sweep, call.vault)
    answer = await run_in_threadpool(oauth.redeem, call.vault, fields)
    return JSONResponse(answer, headers=dict(consent.NO_STORE))


async def register(call: Call, fields: dict[str, Any]) -> dict[str, Any]:
    wait = call.limiter.blocked_for(
        "register", call.client, call.settings.oauth_registrations_per_hour, REGISTER_PERIOD
    )
    if wait:
        raise TooMany(f"Too many registrations from this address; wait {wait} s.", wait)
    call.limiter.hit("register", call.client, REGISTER_PERIOD)
    answer: dict[str, Any] = await run_in_threadpool(oauth.register, call.vault, fields)
    return answer
