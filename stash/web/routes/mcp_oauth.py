"""Remote MCP (docs/DESIGN.md, "Remote MCP"): the /mcp endpoint, its
protected-resource metadata, and the OAuth an MCP host gets its capability
by (server metadata, consent page, token exchange, registration)."""

from __future__ import annotations

from starlette.responses import Response

from .. import consent, mcp_transport, oauth_answers
from ..dispatch import MAX_NAP_BODY, Call
from ..fields import Field, Fields
from ..schemas import (
    integer,
    nullable,
    obj,
    string,
)
from .declare import NO_FIELDS, Answer, Args, Declarations

MCP_OAUTH = Declarations()
route = MCP_OAUTH.route

MCP_DESCRIPTION = (
    "The Model Context Protocol's Streamable HTTP transport, stateless (any worker answers any request; no "
    "session is kept, so there is no stream to GET and no session to DELETE), its answers JSON. It negotiates "
    "every protocol version the `mcp` SDK serves, by the `initialize` handshake or per request. Its tools are the "
    "agent's verbs, each listed for the scopes that may call it (read: wake, recall, zoom; append: note; full and "
    "owner: all six) and each call answered as the route of the same name answers it; a `wake` prompt and the "
    "`stash://wake` resource load the whole wake. Memory text travels only in content blocks of its own, marked "
    '`_meta: {"stash/role": "memory"}`, and in structured content. The bearer must be a live capability; '
    "without one, 401 names the protected-resource metadata in `WWW-Authenticate`."
)


@route(
    "POST",
    "/mcp",
    "capability",
    "The agent's tools over the Model Context Protocol (Streamable HTTP)",
    protocol=mcp_transport.JSONRPC,
    body_cap=MAX_NAP_BODY,
    description=MCP_DESCRIPTION,
    answer=mcp_transport.MESSAGE | {"description": "The JSON-RPC response to the request sent."},
    more_answers=(mcp_transport.ACCEPTED,),
    errors=("request.too_large", "mcp.bad_request", "mcp.bad_origin", "mcp.not_acceptable", "mcp.bad_host"),
)
async def mcp(f: Args, call: Call) -> Response:
    return await mcp_transport.exchange(call, MAX_NAP_BODY.of(call.settings))


RESOURCE_METADATA = obj(
    {
        "resource": string("the MCP endpoint this describes: `<server>/mcp`, or `<server>/m/{name}/mcp`"),
        "resource_name": string("`Stash`"),
        "authorization_servers": {
            "type": "array",
            "items": string(),
            "description": "this server: it is the authorization server of its own MCP endpoints",
        },
        "bearer_methods_supported": {
            "const": ["header"],
            "description": "the token goes in the Authorization header, never a URL",
        },
    }
)


@route(
    "GET",
    "/.well-known/oauth-protected-resource",
    "public",
    "OAuth protected-resource metadata of /mcp",
    fields=NO_FIELDS,
    answer=RESOURCE_METADATA,
    description="RFC 9728 metadata of the MCP endpoint `/mcp`: what a host needs to learn how to send it a "
    "token. The 401 of /mcp names it in `WWW-Authenticate`.",
)
async def resource_metadata(f: Args, call: Call) -> Answer:
    return mcp_transport.resource_metadata(call.page_address(call.settings.public_url), None)


@route(
    "GET",
    "/.well-known/oauth-protected-resource/m/{name}/mcp",
    "public",
    "OAuth protected-resource metadata of /m/{name}/mcp",
    fields=NO_FIELDS,
    answer=RESOURCE_METADATA,
    name_params=("name",),
    errors=("memory.unknown",),
    description="RFC 9728 metadata of the MCP endpoint of memory `name`, at the path RFC 9728 gives it. It "
    "says nothing of whether the memory exists.",
)
async def memory_resource_metadata(f: Args, call: Call) -> Answer:
    return mcp_transport.resource_metadata(call.page_address(call.settings.public_url), f["name"])


# ---------------------------------------------------------------- OAuth for MCP hosts (docs/DESIGN.md, "Remote MCP")

AUTH_SERVER_METADATA = obj(
    {
        "issuer": string("this server's address"),
        "authorization_endpoint": string(),
        "token_endpoint": string(),
        "registration_endpoint": string(),
        "response_types_supported": {"const": ["code"]},
        "grant_types_supported": {"const": ["authorization_code"]},
        "code_challenge_methods_supported": {"const": ["S256"]},
        "token_endpoint_auth_methods_supported": {"const": ["none"]},
        "client_id_metadata_document_supported": {"const": True},
        "service_documentation": string("this server's API reference"),
    }
)


@route(
    "GET",
    "/.well-known/oauth-authorization-server",
    "public",
    "OAuth authorization server metadata",
    fields=NO_FIELDS,
    answer=AUTH_SERVER_METADATA,
    description="RFC 8414 metadata of this server as the authorization server of its own MCP endpoints: "
    "authorization code with PKCE S256 only, public clients (no secret), named by a Client ID "
    "Metadata Document or registered at /register.",
)
async def auth_server_metadata(f: Args, call: Call) -> Answer:
    return oauth_answers.server_metadata(call.page_address(call.settings.public_url))


AUTHORIZE_FIELDS = Fields(
    (
        Field("response_type", string(), "`code`"),
        Field(
            "client_id",
            string(maxLength=2000),
            "the client: its metadata document's https URL, or the id `POST /register` answered",
            required=True,
        ),
        Field(
            "redirect_uri",
            string(maxLength=2000),
            "one of the client's redirect URIs (a loopback one's port may differ)",
            required=True,
        ),
        Field("code_challenge", string(), "PKCE: BASE64URL(SHA-256(verifier)), 43 characters"),
        Field("code_challenge_method", string(), "`S256` (the only one taken)"),
        Field("state", string(), "given back with the code, unchanged"),
        Field(
            "resource",
            string(),
            "RFC 8707: the MCP endpoint the token is for, `<server>/mcp` or "
            "`<server>/m/{name}/mcp` (which fixes the memory)",
        ),
        Field("scope", string(), "`read`, `append` or `full`: the scope the page offers first"),
    ),
    form=True,
)
_CONSENT_CODES = ("oauth.invalid_request", "oauth.invalid_client", "oauth.invalid_redirect_uri", "fleet.unreachable")


@route(
    "GET",
    "/authorize",
    "public",
    "The owner's consent page for an MCP host",
    fields=AUTHORIZE_FIELDS,
    protocol=consent.PAGE,
    media="text/html",
    answer=string("The consent page: a form for the owner."),
    more_answers=(
        (
            "303",
            {
                "description": "A request the client and redirect URI of which are known but that "
                "is refused otherwise: sent back to the redirect URI with `error`."
            },
        ),
    ),
    errors=_CONSENT_CODES + ("rate_limited",),
    description="What an MCP host sends its user to. A server-rendered form, without script, under the "
    "owner console's policy: the host's name and where it will be sent, the owner token (used "
    "once, never stored), the memory, the scope (read, append or full; never owner) and how "
    "long. An unknown client or redirect URI is refused on the page; any other fault of the "
    "request is sent back to the host's redirect URI as OAuth says.",
)
async def authorize_page(f: Args, call: Call) -> Response:
    return await oauth_answers.consent_page(call, f)


CONSENT_FIELDS = Fields(
    (
        Field("nonce", string(), "the page's one-time nonce", required=True),
        Field("decision", {"enum": ["approve", "deny"]}, "`approve` or `deny`"),
        Field("owner_token", string(), "the owner token (used once, never stored)"),
        Field("memory", string(), "the memory (default `main`; fixed when the host asked for /m/{name}/mcp)"),
        Field("scope", {"enum": ["read", "append", "full"]}, "what the host may do"),
        Field("expires", {"enum": ["never", "1d", "30d", "1y"]}, "how long the capability lasts"),
        Field(
            "fleet_request",
            string(),
            "between hosts of a fleet only: the consent request the host that showed the page checked, sent on "
            "with the approval to the host of the owner's shard",
        ),
    ),
    form=True,
)


@route(
    "POST",
    "/authorize",
    "public",
    "The owner's answer to the consent page",
    fields=CONSENT_FIELDS,
    protocol=consent.PAGE,
    status=303,
    media="text/html",
    more_answers=(
        (
            "200",
            {
                "description": "The consent page again, saying what to fix (a refused owner token, an unknown memory).",
                "content": {"text/html": {}},
            },
        ),
    ),
    errors=(
        "consent.expired",
        "consent.bad_origin",
        "consent.bad_choice",
        "auth.invalid",
        "memory.unknown",
        "rate_limited",
        "grants.busy",
        "store.unreadable",
        "store.damaged",
        "fleet.unreachable",
        "fleet.bad_hop",
        "fleet.elsewhere",
        "fleet.moving",
    ),
    description="The consent form posted. Approved, it mints a capability of the scope chosen on the "
    "memory chosen (its label the host's name, its audit event a mint, as POST /grants) and "
    "sends the host to its redirect URI with a code and its `state`; denied, with "
    "`error=access_denied`. The form is taken once, from this server's own page (its nonce, "
    "and its Origin or Referer); framing is refused.",
)
async def authorize_answer(f: Args, call: Call) -> Response:
    return await oauth_answers.consent_answer(call, f)


TOKEN_FIELDS = Fields(
    (
        Field("grant_type", string(), "`authorization_code`", required=True),
        Field("code", string(), "the code the redirect carried"),
        Field("redirect_uri", string(), "the redirect URI the code was sent to"),
        Field("client_id", string(), "the client the code was approved for"),
        Field("code_verifier", string(), "PKCE: the verifier of the challenge sent to /authorize"),
        Field("resource", string(), "RFC 8707: the MCP endpoint, as sent to /authorize"),
    ),
    form=True,
)


@route(
    "POST",
    "/token",
    "public",
    "An MCP host's code exchanged for its capability token",
    fields=TOKEN_FIELDS,
    protocol=consent.OAUTH,
    answer=obj(
        {
            "access_token": string("the capability token: the host's only key, never stored"),
            "token_type": {"const": "Bearer"},
            "scope": {"enum": ["read", "append", "full"]},
            "expires_in": integer(0, description="seconds until the capability expires, when it does"),
        },
        required=["access_token", "token_type", "scope"],
    ),
    errors=(
        "oauth.invalid_grant",
        "oauth.unsupported_grant_type",
        "store.unreadable",
        "fleet.unreachable",
        "fleet.elsewhere",
        "fleet.moving",
    ),
    description="The code exchange (authorization code with PKCE S256). The code is taken once: redeemed "
    "twice, or with another client, redirect URI or a wrong verifier, it is refused and its "
    "capability withdrawn. The token is taken out of the shared state and nothing of it is "
    "left in the state file or its WAL by the time this answers.",
)
async def token(f: Args, call: Call) -> Response:
    return await oauth_answers.token(call, f)


@route(
    "POST",
    "/register",
    "public",
    "Register an MCP host (Dynamic Client Registration)",
    status=201,
    fields=Fields(
        open_schema={
            "type": "object",
            "description": "RFC 7591 client metadata: `redirect_uris` "
            "(required), `client_name`; the rest is answered as this server gives it.",
        }
    ),
    protocol=consent.OAUTH,
    answer=obj(
        {
            "client_id": string(),
            "client_id_issued_at": integer(0),
            "client_name": nullable(string()),
            "redirect_uris": {"type": "array", "items": string()},
            "token_endpoint_auth_method": {"const": "none"},
            "grant_types": {"const": ["authorization_code"]},
            "response_types": {"const": ["code"]},
        }
    ),
    errors=("oauth.invalid_redirect_uri", "oauth.invalid_client_metadata", "rate_limited"),
    description="For hosts that predate Client ID Metadata Documents: a public client (no secret) with its "
    "redirect URIs (https, or http on loopback) and name. Rate-limited per address; a "
    "registration never approved is forgotten within the hour.",
)
async def register(f: Args, call: Call) -> Answer:
    return await oauth_answers.register(call, f)
