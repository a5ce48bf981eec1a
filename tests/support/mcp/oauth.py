"""An MCP host's OAuth flow against Stash, step by step as the spec has it
(RFC 9728 and 8414 discovery, RFC 7591 registration, authorization code with
PKCE S256, the consent form, the code exchange), over any of the suite's
HTTP clients (Api of tests/support/api.py in process, Http of tests/support/server.py live). Shared by
the API tests of the flow and its attacks (tests/api/test_oauth.py) and the
end-to-end ones (tests/e2e/test_oauth_live.py)."""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from stash.fleet.forward import HOP

REDIRECT = "http://127.0.0.1:43117/callback"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    return verifier, challenge


def register(client: Any, name: str | None = "Test host", redirect: str = REDIRECT) -> dict:
    resp = client.post("/register", json={"client_name": name, "redirect_uris": [redirect]})
    assert resp.status_code == 201, resp.text
    return resp.json()


def authorize(client: Any, client_id: str, challenge: str | None, redirect: str = REDIRECT, **more: str) -> Any:
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect,
        "state": "state-1",
        "code_challenge_method": "S256",
        **more,
    }
    if challenge is not None:
        params["code_challenge"] = challenge
    return client.get("/authorize?" + urlencode(params))


def nonce_of(page: str) -> str:
    found = re.search(r'name="nonce" value="((?:[a-z0-9_-]+\.)?[A-Za-z0-9_-]{43})"', page)  # a fleet's names its host
    assert found, page[:2000]
    return found.group(1)


def answer(client: Any, nonce: str, owner: str | None, origin: str | None, **choices: str) -> Any:
    form = {"nonce": nonce, "decision": "approve", "scope": "full", "expires": "never", **choices}
    if owner is not None:
        form["owner_token"] = owner
    headers = dict(FORM, **({"Origin": origin} if origin else {}))
    return client.post("/authorize", content=urlencode(form).encode(), headers=headers)


def code_of(resp: Any, redirect: str = REDIRECT) -> str:
    """The code of a 303 to the redirect URI (and its state, checked)."""
    assert resp.status_code == 303, (resp.status_code, resp.text[:1000])
    location = resp.headers["location"]
    assert location.startswith(redirect + "?"), location
    query = parse_qs(urlsplit(location).query)
    assert query["state"] == ["state-1"], query
    return query["code"][0]


def exchange(
    client: Any,
    code: str,
    verifier: str,
    client_id: str,
    redirect: str = REDIRECT,
    *,
    hop: str | None = None,
    **more: str,
) -> Any:
    """The code exchange (``hop``: marked as sent on by that host of a fleet, so it is answered where it lands)."""
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "code_verifier": verifier,
        "client_id": client_id,
        "redirect_uri": redirect,
        **more,
    }
    return client.post("/token", content=urlencode(form).encode(), headers={**FORM, **({HOP: hop} if hop else {})})


def approved_code(client: Any, owner: str, origin: str, **choices: str) -> tuple[str, str, dict]:
    """A registered client, a consent page, the owner's approval: (code, verifier, registration)."""
    reg = register(client)
    verifier, challenge = pkce()
    page = authorize(client, reg["client_id"], challenge)
    assert page.status_code == 200, page.text[:1000]
    return code_of(answer(client, nonce_of(page.text), owner, origin, **choices)), verifier, reg


class TokenMemory:
    """An MCP host's token storage for the SDK's OAuth client, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info
