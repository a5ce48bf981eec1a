"""The pages and refusals of an MCP host's OAuth flow (docs/DESIGN.md,
"Remote MCP"): the owner's consent page, a server-rendered form that works
without JavaScript, in the console's style and under its policy (its form
may post only here, and on to the host's redirect URI); and the two ways
its routes refuse: as an HTML page to the owner, as OAuth's JSON
(``error``, ``error_description``) to the host. Every value placed in a
page is HTML-escaped where it is placed: the host's name is the host's
own text."""

from __future__ import annotations

import html
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from .. import package_data
from ..core.errors import StashError
from ..service.oauth import label_of
from .dispatch import Protocol
from .pages import CONSOLE_CSP

NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}


def _headers(form_to: str | None = None) -> dict[str, str]:
    """The console's headers; its policy's form-action opened to this server and ``form_to`` (an origin)."""
    action = "form-action 'self'" + (f" {form_to}" if form_to else "")
    # same-origin, not the console's no-referrer: under no-referrer a browser posts the form with "Origin: null"
    # and no Referer, which the form's CSRF check must refuse; the host's redirect URI still gets no Referer.
    return {
        "Content-Security-Policy": CONSOLE_CSP.replace("form-action 'none'", action),
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "same-origin",
        "Cross-Origin-Opener-Policy": "same-origin",
        **NO_STORE,
    }


def origin_of(uri: str) -> str:
    parts = urlsplit(uri)
    return f"{parts.scheme}://{parts.netloc}"


def page(
    request: dict[str, Any], nonce: str, error: str | None = None, status: int = 200, memory: str | None = None
) -> HTMLResponse:
    """The consent page for a checked authorization request (service/oauth.py), its form carrying ``nonce``."""

    def esc(text: object) -> str:  # one name for the one rule
        return html.escape(str(text), quote=True)

    host = request.get("client_name") or "An unnamed MCP host"
    fixed = request.get("memory")
    if fixed is not None:
        field = (
            f'<input id="memory" value="{esc(fixed)}" readonly aria-readonly="true">'
            f'<span class="tag">fixed by the address the host connects to</span>'
        )
    else:  # the pattern's "-" escaped: a browser compiles the pattern with the v flag, which takes no bare "-"
        field = (
            f'<input id="memory" name="memory" value="{esc(memory or "main")}" spellcheck="false" '
            'autocapitalize="off" pattern="[a-z0-9][a-z0-9._\\-]{0,63}">'
        )
    scope = request.get("scope") or "read"
    text = (
        package_data.read_text("web/console/consent.html")
        .replace("{{HOST}}", esc(host))
        .replace("{{LABEL}}", esc(label_of(request)))
        .replace("{{REDIRECT_HOST}}", esc(urlsplit(request["redirect_uri"]).netloc))
        .replace("{{CLIENT}}", esc(request["client_id"]))
        .replace("{{ERROR}}", "" if error is None else f'<p class="alert" role="alert" id="error">{esc(error)}</p>')
        .replace("{{ACTION}}", "/authorize")
        .replace("{{NONCE}}", esc(nonce))
        .replace("{{MEMORY}}", field)
        .replace("{{READ}}", " checked" if scope == "read" else "")
        .replace("{{APPEND}}", " checked" if scope == "append" else "")
        .replace("{{FULL}}", " checked" if scope == "full" else "")
    )
    return HTMLResponse(text, status_code=status, headers=_headers(origin_of(request["redirect_uri"])))


def html_refusal(request: Request, err: StashError) -> Response:
    """A refusal shown to the owner: a page saying what happened and what to do, its code in a header."""
    body = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
        'content="width=device-width, initial-scale=1"><title>Stash · not connected</title>'
        '<link rel="stylesheet" href="/console.css"></head><body><header class="top"><h1>Stash '
        '<span class="sub">connect an MCP host</span></h1></header><main><h2>Not connected</h2>'
        f'<p class="alert" role="alert" id="error">{html.escape(err.message)}</p></main></body></html>'
    )
    headers = {**_headers(), "Stash-Error": err.code}
    retry = getattr(err, "retry_after", None)
    if retry is not None:
        headers["Retry-After"] = str(retry)
    return HTMLResponse(body, status_code=err.status, headers=headers)


def oauth_refusal(request: Request, err: StashError) -> Response:
    """A refusal as OAuth writes it (RFC 6749, 5.2; RFC 7591, 3.2.2): ``error`` is the name OAuth gives it
    (an ``oauth.*`` code's own, else invalid_request, temporarily_unavailable for a wait (429, 503: a full
    disk, a host of the fleet not answering), or server_error for a failure of the server)."""
    if err.code.startswith("oauth."):
        error = err.code.removeprefix("oauth.")
    else:
        error = (
            "temporarily_unavailable"
            if err.status in (429, 503)
            else "server_error"
            if err.status >= 500
            else "invalid_request"
        )
    headers = {**NO_STORE, "Stash-Error": err.code}
    retry = getattr(err, "retry_after", None)
    if retry is not None:
        headers["Retry-After"] = str(retry)
    return JSONResponse({"error": error, "error_description": err.message}, status_code=err.status, headers=headers)


_OAUTH_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {"type": "string", "description": "OAuth's error name: `invalid_grant`, `invalid_client`, …"},
        "error_description": {"type": "string", "description": "what to do next"},
    },
}
OAUTH = Protocol(
    name="oauth",
    refusal=oauth_refusal,
    request=None,
    error={"application/json": {"schema": _OAUTH_ERROR}},
    error_words="OAuth's error object: `error` is the name OAuth gives it (the code's part after "
    "`oauth.`; `invalid_request` for the others), the Stash code in the `Stash-Error` "
    "header",
)
PAGE = Protocol(
    name="html",
    refusal=html_refusal,
    request=None,
    error={"text/html": {"schema": {"type": "string"}}},
    error_words="A page for the owner saying what happened; the code in the `Stash-Error` header",
)
