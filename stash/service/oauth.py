"""OAuth 2.1 for MCP hosts that connect only that way (docs/DESIGN.md,
"Remote MCP"): the owner approves a host on a consent page, and the access
token the host receives is a capability token, minted then, labelled with
the host's name. The token is the only key, as for every other client.

* **Clients** are public (no secret): a Client ID Metadata Document
  (client_documents.py), or one registered by Dynamic Client Registration
  (RFC 7591), forgotten unless approved within the hour.
* **Authorization code with PKCE S256 only.** A code is 256 bits, single
  use, bound to its client, redirect URI and challenge, and lives
  ``--oauth-code-seconds`` (at most 60 s). Between approval and redemption
  the minted token exists only sealed under a key derived from the code, in
  the state file every worker shares (storage/oauth_state.py).
* **No live grant whose token nobody holds.** A code not redeemed in time
  takes its grant with it (:func:`sweep`); a code redeemed a second time,
  or redeemed wrongly (another client, another redirect URI, a wrong
  verifier), withdraws its grant: whoever holds the code may not be its
  host.
* **A fleet** (``--fleet-host``): each host keeps its own state file, so
  what a step needs names the host that keeps it: a registered client id
  the host that registered it, a consent form's nonce the host that showed
  the page, a code the shard of its user, whose host minted the grant and
  keeps the code (stash/web/oauth_answers.py sends each step there)."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode, urlsplit

from ..core.errors import (
    Forbidden,
    Invalid,
    Malformed,
    NotFound,
    OAuthRefused,
    StashError,
    TooMany,
    Unauthorized,
    UnknownClient,
)
from ..crypto import aead, oauth_codes
from ..storage import oauth_state
from ..storage.memories import MAIN, valid_name
from . import client_documents, grant_label_expiry, grants, operation
from .access import Vault
from .operation import Effects, Event, Limits
from .redirect_uris import matches, valid_redirect

SCOPES = ("read", "append", "full")
EXPIRIES = {"never": None, "1d": timedelta(days=1), "30d": timedelta(days=30), "1y": timedelta(days=365)}


class Redirected(Exception):
    """Tell the host through its redirect URI (RFC 6749, 4.1.2.1): the client and redirect URI are known."""

    def __init__(self, location: str) -> None:
        super().__init__("redirect")
        self.location = location


@dataclass(frozen=True)
class Client:
    client_id: str
    name: str | None
    redirect_uris: tuple[str, ...]


# ---------------------------------------------------------------- clients


CLIENT_PREFIX = "stash-client-"


def register(vault: Vault, body: dict[str, Any], host: str | None = None) -> dict[str, Any]:
    """Dynamic Client Registration (RFC 7591) of a public client: its redirect URIs (each https, or http on
    loopback) and its name. What it asks for beyond that is answered as what this server gives. On a host of
    a fleet (``host``), the client id names it: the registration is kept there only."""
    uris = body.get("redirect_uris")
    if (
        not isinstance(uris, list)
        or not 1 <= len(uris) <= 10
        or not all(isinstance(u, str) and valid_redirect(u) for u in uris)
    ):
        raise OAuthRefused(
            "redirect_uris must be 1 to 10 URIs, each https or http on a loopback address, with no fragment.",
            code="oauth.invalid_redirect_uri",
        )
    name = body.get("client_name")
    if name is not None and (not isinstance(name, str) or len(name) > 200):
        raise OAuthRefused("client_name must be text of at most 200 characters.", code="oauth.invalid_client_metadata")
    grant_types = body.get("grant_types", ["authorization_code"])
    if not isinstance(grant_types, list) or "authorization_code" not in grant_types:
        raise OAuthRefused("This server grants authorization_code only.", code="oauth.invalid_client_metadata")
    client_id = CLIENT_PREFIX + ("" if host is None else f"{host}.") + secrets.token_hex(16)
    answer = {
        "client_id": client_id,
        "client_id_issued_at": oauth_state.now(),
        "client_name": name,
        "redirect_uris": list(uris),
        "token_endpoint_auth_method": "none",
        "grant_types": ["authorization_code"],
        "response_types": ["code"],
    }
    with oauth_state.opened(vault.data_dir) as conn:
        oauth_state.put_client(conn, client_id, answer)
    return answer


def registered_on(client_id: object) -> str | None:
    """The host of a fleet a registered client id names (None: a single server's, or a metadata document)."""
    if not isinstance(client_id, str) or not client_id.startswith(CLIENT_PREFIX):
        return None
    host, dot, _ = client_id.removeprefix(CLIENT_PREFIX).partition(".")
    return host if dot else None


def client_of(vault: Vault, client_id: object, loopback: bool) -> Client:
    """The client ``client_id`` names: a metadata document's URL (fetched) or a registration."""
    if not isinstance(client_id, str) or not client_id or len(client_id) > client_documents.URL_MAX:
        raise OAuthRefused("client_id is missing.")
    if client_documents.is_document_url(client_id):
        found: dict[str, Any] | None = client_documents.fetch(client_id, loopback)
    else:
        with oauth_state.opened(vault.data_dir) as conn:
            found = oauth_state.client(conn, client_id)
    if found is None:
        raise UnknownClient("No such client; register it (POST /register) or name its metadata document.")
    return Client(client_id, found.get("client_name"), tuple(found["redirect_uris"]))


# ---------------------------------------------------------------- the consent page


def memory_of_resource(resource: object, address: str) -> str | None:
    """The memory an RFC 8707 ``resource`` names: None for ``<server>/mcp`` (the owner picks),
    ``name`` for ``<server>/m/{name}/mcp``; refused when it is not one of this server's MCP endpoints."""
    if resource is None:
        return None
    if isinstance(resource, str):
        if resource.rstrip("/") == f"{address}/mcp":
            return None
        if resource.startswith(f"{address}/m/") and resource.rstrip("/").endswith("/mcp"):
            name = resource.rstrip("/")[len(address) + 3 : -4]
            if valid_name(name):
                return name
    raise ValueError("resource is not an MCP endpoint of this server (<server>/mcp or <server>/m/{name}/mcp).")


def authorization_request(
    vault: Vault, params: dict[str, Any], address: str, loopback: bool
) -> tuple[dict[str, Any], Client]:
    """A checked authorization request and its client. An unknown client or a redirect URI it does not have
    is refused here, to the owner; anything else is told to the host at its redirect URI (Redirected)."""
    client = client_of(vault, params.get("client_id"), loopback)
    redirect = params.get("redirect_uri")
    if not isinstance(redirect, str) or not any(matches(r, redirect) for r in client.redirect_uris):
        raise OAuthRefused(
            "redirect_uri is not one this client registered; nothing was sent to it.", code="oauth.invalid_redirect_uri"
        )
    state = params.get("state") if isinstance(params.get("state"), str) else None

    def tell(error: str, words: str) -> Redirected:
        return Redirected(with_query(redirect, {"error": error, "error_description": words, "state": state}))

    if params.get("response_type") != "code":
        raise tell("unsupported_response_type", "response_type must be code.")
    if params.get("code_challenge_method") != "S256" or not oauth_codes.is_challenge(params.get("code_challenge")):
        raise tell("invalid_request", "PKCE is required: code_challenge (S256) and code_challenge_method=S256.")
    try:
        memory = memory_of_resource(params.get("resource"), address)
    except ValueError as err:
        raise tell("invalid_target", str(err)) from None
    asked = params.get("scope")
    scope = next((s for s in SCOPES[::-1] if isinstance(asked, str) and s in asked.split()), None)
    return {
        "client_id": client.client_id,
        "client_name": client.name,
        "redirect_uri": redirect,
        "state": state,
        "challenge": params["code_challenge"],
        "resource": params.get("resource"),
        "memory": memory,
        "scope": scope,
    }, client


def pending(vault: Vault, request: dict[str, Any], host: str | None = None) -> str:
    """File a consent page's request under a fresh nonce, which the page's form carries: the form answers this
    request and no other, once (the page's defence against a form posted from elsewhere). On a host of a
    fleet (``host``), the nonce names it, so the form is answered here whichever host it reaches."""
    nonce = oauth_codes.new_code(host)
    with oauth_state.opened(vault.data_dir) as conn:
        oauth_state.put_request(conn, oauth_codes.code_id(nonce), request)
    return nonce


def take_pending(vault: Vault, nonce: object) -> dict[str, Any]:
    found = None
    if oauth_codes.is_code(nonce):
        assert isinstance(nonce, str)
        with oauth_state.opened(vault.data_dir) as conn:
            found = oauth_state.take_request(conn, oauth_codes.code_id(nonce))
    if found is None:
        raise Malformed(
            "This consent form has expired or was sent already; ask the host to connect again.", code="consent.expired"
        )
    return found


REQUEST_FIELDS = ("client_id", "client_name", "redirect_uri", "state", "challenge", "resource", "memory", "scope")


def forwarded_request(text: object) -> dict[str, Any]:
    """A checked authorization request as another host of the fleet sent it on with the owner's approval
    (``fleet_request``, the JSON of :func:`authorization_request`'s). It gives no power of its own: only
    the owner token with it mints anything, as on the page, and it can name no more than POST /grants
    could; its redirect URI and challenge are checked again, so the answer is a redirect like any."""
    try:
        found = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        found = None
    if (
        not isinstance(found, dict)
        or set(found) != set(REQUEST_FIELDS)
        or not all(v is None or isinstance(v, str) for v in found.values())
        or not isinstance(found["client_id"], str)
        or not isinstance(found["redirect_uri"], str)
        or not valid_redirect(found["redirect_uri"])
        or not oauth_codes.is_challenge(found["challenge"])
        or (found["memory"] is not None and not valid_name(found["memory"]))
        or found["scope"] not in (None, *SCOPES)
    ):
        raise Malformed(
            "fleet_request is not a consent request another host of the fleet checked; open the consent page "
            "again from the host.",
            code="fleet.bad_hop",
        )
    return found


def denied(request: dict[str, Any]) -> str:
    return with_query(
        request["redirect_uri"],
        {"error": "access_denied", "error_description": "The owner declined.", "state": request.get("state")},
    )


def label_of(request: dict[str, Any]) -> str:
    """The capability's label: the host's name (its printable characters, cut short), else its redirect host."""
    name = request.get("client_name") or urlsplit(request["redirect_uri"]).hostname or "an MCP host"
    shown = " ".join("".join(c for c in str(name) if c.isprintable()).split())
    while len(shown.encode()) > grant_label_expiry.LABEL_MAX_BYTES:
        shown = shown[:-1]
    return shown.strip() or "an MCP host"


def approve(
    vault: Vault,
    request: dict[str, Any],
    owner_token: str,
    memory: str,
    scope: object,
    expiry: object,
    address: str,
    limits: Limits,
    code_seconds: int,
    fleet: bool = False,
) -> str:
    """The owner's approval: a capability minted on ``memory`` as POST /grants mints one (its audit event
    too), a code for it, and where to send the host with the code. On a host of a fleet (``fleet``), the
    code names its user's shard, whose host this is: any host sends its exchange here."""
    if scope not in SCOPES:
        raise Invalid("Pick read, append or full.", code="consent.bad_choice")
    if expiry not in EXPIRIES:
        raise Invalid("Pick how long the host may keep the capability.", code="consent.bad_choice")
    lasts = EXPIRIES[str(expiry)]
    expires = None if lasts is None else (datetime.now(UTC) + lasts).strftime("%Y-%m-%dT%H:%M:%SZ")
    label = grant_label_expiry.check_label(label_of(request))

    def mint(session: Any, fields: dict[str, Any], context: Any) -> dict[str, Any]:
        return {**grants.mint(session, vault, scope, label, expires, address, keyed=False), "user": session.user_id}

    event = Event("mint", lambda s, f, a: {"grant": a["id"], "scope": a["scope"], "memory": s.memory_name})
    done = operation.perform(
        vault,
        owner_token,
        None,
        Effects("owner", event=event),
        "POST /authorize",
        {},
        None,
        limits,
        mint,
        None,
        {},
        memory,
    )
    minted = done.body
    code = oauth_codes.new_code(minted["user"][:1] if fleet else None)
    approval = {
        "client_id": request["client_id"],
        "redirect_uri": request["redirect_uri"],
        "challenge": request["challenge"],
        "resource": request.get("resource"),
        "user": minted["user"],
        "memory": memory,
        "grant": minted["id"],
        "scope": scope,
        "expires": expires,
    }
    try:
        sealed = oauth_codes.seal_token(code, minted["token"], _bound(approval))
        with oauth_state.opened(vault.data_dir) as conn:
            oauth_state.put_code(conn, oauth_codes.code_id(code), approval, sealed, code_seconds)
    except BaseException:
        vault.withdraw(minted["user"], memory, minted["id"])  # never a live grant whose token nobody holds
        raise
    return with_query(request["redirect_uri"], {"code": code, "state": request.get("state")})


def _bound(approval: dict[str, Any]) -> str:
    return json.dumps([approval[k] for k in ("client_id", "redirect_uri", "challenge", "user", "memory", "grant")])


def with_query(uri: str, params: dict[str, Any]) -> str:
    kept = {k: v for k, v in params.items() if v is not None}
    return uri + ("&" if urlsplit(uri).query else "?") + urlencode(kept)


# ---------------------------------------------------------------- the token endpoint


def redeem(vault: Vault, form: dict[str, Any]) -> dict[str, Any]:
    """The code exchange: the capability token, once, to the client the code was approved for, at the
    redirect URI it was sent to, with the verifier of its challenge. Anything else withdraws the grant."""
    if form.get("grant_type") != "authorization_code":
        raise OAuthRefused("grant_type must be authorization_code.", code="oauth.unsupported_grant_type")
    code = form.get("code")
    if not oauth_codes.is_code(code):
        raise OAuthRefused("code is missing or malformed.", code="oauth.invalid_grant")
    assert isinstance(code, str)
    with oauth_state.opened(vault.data_dir) as conn:
        filed = oauth_state.approval_of(conn, oauth_codes.code_id(code))
        if filed is not None:
            # Only the host that serves the code's user now may hand out its capability or withdraw it: another
            # (one a placement took the shard from) refuses as it refuses the user's token, taking nothing.
            vault.serves(filed["user"])
        found = oauth_state.redeem(conn, oauth_codes.code_id(code))
        if found is None:
            raise OAuthRefused("The code is unknown or expired; connect again.", code="oauth.invalid_grant")
        approval = found.approval
        wrong = None
        if found.sealed is None:
            wrong = "This code was redeemed before; the capability it gave is revoked. Connect again."
        elif form.get("client_id") != approval["client_id"] or form.get("redirect_uri") != approval["redirect_uri"]:
            wrong = "The code was issued to another client or redirect URI; its capability is revoked."
        elif not oauth_codes.verifier_matches(form.get("code_verifier"), approval["challenge"]):
            wrong = "code_verifier does not match the code's challenge; its capability is revoked."
        elif form.get("resource") not in (None, approval.get("resource")):
            wrong = "resource is not the one the code was approved for; its capability is revoked."
        token = None
        if wrong is None and found.sealed is not None:
            try:
                token = oauth_codes.open_token(code, found.sealed, _bound(approval))
            except aead.Unsealable:
                wrong = "The code's state was altered; its capability is revoked."
        oauth_state.flush(conn)  # the sealed token is out of the file: no page or WAL frame keeps it
    if wrong is not None or token is None:
        vault.withdraw(approval["user"], approval["memory"], approval["grant"])
        raise OAuthRefused(wrong or "The code cannot be redeemed.", code="oauth.invalid_grant")
    answer: dict[str, Any] = {"access_token": token, "token_type": "Bearer", "scope": approval["scope"]}
    if approval.get("expires"):
        left = datetime.fromisoformat(approval["expires"].replace("Z", "+00:00")) - datetime.now(UTC)
        answer["expires_in"] = max(0, int(left.total_seconds()))
    return answer


def sweep(vault: Vault) -> int:
    """Withdraw the grant of every code nobody redeemed in time, then forget what has lived its time; how many
    grants were withdrawn. Any worker may run it, any number of times."""
    if not oauth_state.exists(vault.data_dir):
        return 0
    withdrawn = 0
    with oauth_state.opened(vault.data_dir) as conn:
        for code_id, approval in oauth_state.unredeemed_past(conn):
            try:
                vault.withdraw(approval["user"], approval["memory"], approval["grant"])
            except (StashError, OSError):
                continue  # its memory cannot be opened now: the next sweep tries again, the code still refused
            oauth_state.drop_code(conn, code_id)
            withdrawn += 1
        oauth_state.forget_old(conn)
        if withdrawn:
            oauth_state.flush(conn)
    return withdrawn


def owner_refused(err: StashError) -> bool:
    """A refusal of the owner token on the consent page (shown there, the form kept), not of the request."""
    return isinstance(err, Unauthorized | Forbidden | NotFound | TooMany | Invalid)


def check_memory(fixed: object, given: object) -> str:
    if isinstance(fixed, str):
        return fixed
    name = given if isinstance(given, str) and given.strip() else MAIN
    if not valid_name(name.strip()):
        raise Invalid("A memory's name is 1 to 64 of a-z 0-9 . _ - (see GET /memories).", code="consent.bad_choice")
    return name.strip()
