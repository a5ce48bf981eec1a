"""What the OAuth routes of an MCP host's flow answer (declared in
stash/web/routes/mcp_oauth.py; the flow itself is stash/service/oauth.py): each
handler's one call into the service, in a worker thread, and the page,
redirect or JSON it becomes.

On a host of a fleet, a step that reaches a host other than the one that
keeps its state is sent on there first (stash/fleet/forward.py): the
consent page to the host its registered client names, the consent form to
the host its nonce names, the owner's approval to the host of the owner's
shard (which mints the grant and keeps the code), the code exchange to the
host of the shard its code names. A client named by its metadata document
is answered by any host."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, RedirectResponse, Response

from ..core.errors import Forbidden, Malformed, StashError, TooMany, Unauthorized, Unavailable
from ..crypto import oauth_codes, tokens
from ..fleet.forward import Fleet
from ..fleet.placement import HEX
from ..service import oauth
from ..service.operation import Limits
from . import consent
from .dispatch import Call

REGISTER_PERIOD = 3600.0
CLIENT_HOST_DOWN = (
    "The host of this server's fleet that registered this MCP host is not answering; try again in a minute, "
    "or remove the connection from the MCP host and connect it again, so that it registers anew."
)
FORM_HOST_DOWN = (
    "The host of this server's fleet that showed this consent page is not answering; connect the MCP host again."
)
SHARD_HOST_DOWN = "The host of this server's fleet that keeps your memories is not answering; try again in a minute."
CODE_HOST_DOWN = (
    "The host of this server's fleet that keeps this code's user is not answering; try again within the code's "
    "lifetime, or connect again."
)


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


def _form(fields: dict[str, Any]) -> bytes:
    return urlencode({k: v for k, v in fields.items() if isinstance(v, str)}).encode("ascii")


def _elsewhere(call: Call, host: str | None, travels: bool | None = None) -> tuple[Fleet, str] | None:
    """This fleet and the address of ``host`` when it is another host of it and this request may travel
    there (by default: it was not sent on to this host already, so no loop); None: answer here."""
    fleet = call.fleet
    travels = not call.hopped if travels is None else travels
    address = None if fleet is None or not travels else fleet.elsewhere(host)
    return None if fleet is None or address is None else (fleet, address)


def _shard_host(call: Call, first_digit: str | None) -> str | None:
    fleet = call.fleet
    return None if fleet is None or first_digit is None or first_digit not in HEX else fleet.host_of(first_digit)


async def consent_page(call: Call, fields: dict[str, Any]) -> Response:
    there = _elsewhere(call, oauth.registered_on(fields.get("client_id")))
    if there is not None:
        return await call.forward(*there, b"", CLIENT_HOST_DOWN)
    await run_in_threadpool(oauth.sweep, call.vault)
    try:
        request, _ = await run_in_threadpool(
            oauth.authorization_request, call.vault, fields, _address(call), _loopback(call)
        )
    except oauth.Redirected as sent:
        return _redirect(sent.location)
    nonce = await run_in_threadpool(oauth.pending, call.vault, request, call.settings.fleet_host)
    return consent.page(request, nonce)


async def consent_answer(call: Call, fields: dict[str, Any]) -> Response:
    carried = fields.get("fleet_request")
    if carried is None:
        there = _elsewhere(call, oauth_codes.where_of(fields["nonce"]))
        if there is not None:
            return await call.forward(*there, _form(fields), FORM_HOST_DOWN)
    address = _address(call)
    if call.origin != consent.origin_of(address):
        raise Forbidden(
            "This form is taken only from this server's own consent page; open it again from the host.",
            code="consent.bad_origin",
        )
    if carried is not None:
        # The approval another host of the fleet checked and sent on: only a host sends it (the router drops
        # the marker from outside), and even forged it is worth no more than the owner token it carries.
        if not call.hopped:
            raise Malformed(
                "fleet_request is sent only by another host of the fleet; open the consent page again from the host.",
                code="fleet.bad_hop",
            )
        request = oauth.forwarded_request(carried)
    else:
        request = await run_in_threadpool(oauth.take_pending, call.vault, fields["nonce"])
    if fields.get("decision") == "deny":
        return _redirect(oauth.denied(request))
    wait = call.limiter.blocked_for("auth", call.client, call.settings.auth_failures_per_minute)
    if wait:
        raise TooMany(f"Too many failed owner tokens from this address; wait {wait} s.", wait)
    owner = fields.get("owner_token") or ""
    parsed = tokens.parse(owner)
    # The grant is minted, and its code kept, where the owner's files are. A form sent on to the host of its
    # nonce goes on from there once, as the approval; an approval arriving is answered here: two hops at most.
    user = parsed.user_id[:1] if parsed is not None else None
    there = _elsewhere(call, _shard_host(call, user), travels=carried is None)
    if there is not None:
        approval = {**fields, "fleet_request": json.dumps(request), "decision": "approve"}
        try:
            return await call.forward(*there, _form(approval), SHARD_HOST_DOWN)
        except Unavailable as err:
            nonce = await run_in_threadpool(oauth.pending, call.vault, request, call.settings.fleet_host)
            return consent.page(request, nonce, error=err.message, status=err.status, memory=fields.get("memory"))
    limits = Limits(call.settings.quota_memories, call.settings.quota_bytes)
    try:
        memory = oauth.check_memory(request.get("memory"), fields.get("memory"))
        location = await run_in_threadpool(
            oauth.approve,
            call.vault,
            request,
            owner,
            memory,
            fields.get("scope"),
            fields.get("expires") or "never",
            address,
            limits,
            call.settings.oauth_code_seconds,
            call.settings.fleet_host is not None,
        )
    except StashError as err:
        if not oauth.owner_refused(err):
            raise
        if isinstance(err, Unauthorized):
            call.limiter.hit("auth", call.client)
            call.metrics.event("auth_failed")
        # The form again, under a new nonce, saying what to fix; the request stands.
        nonce = await run_in_threadpool(oauth.pending, call.vault, request, call.settings.fleet_host)
        return consent.page(request, nonce, error=err.message, status=err.status, memory=fields.get("memory"))
    return _redirect(location)


async def token(call: Call, fields: dict[str, Any]) -> Response:
    there = _elsewhere(call, _shard_host(call, oauth_codes.where_of(fields.get("code"))))
    if there is not None:
        return await call.forward(*there, _form(fields), CODE_HOST_DOWN)
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
    answer: dict[str, Any] = await run_in_threadpool(oauth.register, call.vault, fields, call.settings.fleet_host)
    return answer
