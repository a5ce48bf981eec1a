"""Static things the server hands out — the client file and the landing page —
and the check of an address taken from a request's Host header: web concerns,
kept out of the service layer."""

from __future__ import annotations

import base64
import hashlib
import html
import re
from dataclasses import dataclass
from functools import cache

from .. import package_data
from ..core.sizes import SIZES

PLACEHOLDER_ADDRESS = "https://stash.example"
"""Shown in the quickstart when the request names no usable host."""

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]{{2,45}}\])(?::[0-9]{{1,5}})?"
_SAFE_HOST = re.compile(_HOST)
_SAFE_URL = re.compile(rf"https?://{_HOST}(?:/[A-Za-z0-9._~%/-]*)?")
_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.S)


def client_source() -> str:
    return package_data.read_text("client.py")


def is_safe_address(url: str) -> bool:
    """An http(s) origin with an optional plain path: nothing that could close
    an HTML attribute, a shell quote or a JSON string when pasted."""
    return len(url) <= 300 and _SAFE_URL.fullmatch(url) is not None


def page_address(public_url: str | None, scheme: str, host: str | None) -> str:
    """The address the quickstart's curl lines name: the operator's ``--url``
    when set, else the scheme and ``Host`` the request came in on. A ``Host``
    is the client's own text, so one that is not a plain host[:port] is
    replaced by a placeholder rather than escaped into a command a reader
    would paste into a shell."""
    if public_url and is_safe_address(public_url.rstrip("/")):
        return public_url.rstrip("/")
    if host and scheme in ("http", "https") and len(host) <= 260 and _SAFE_HOST.fullmatch(host):
        return f"{scheme}://{host}"
    return PLACEHOLDER_ADDRESS


@dataclass(frozen=True)
class Landing:
    template: str
    csp: str


def _digest(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@cache
def _landing() -> Landing:
    """The page's template and its Content-Security-Policy. The policy allows
    exactly the page's own inline script and style, by hash, computed from the
    file itself so an edit of either can never leave a stale hash behind; the
    address is filled in outside both, so the hashes hold for every request."""
    template = package_data.read_text("web/landing.html")
    hashes: dict[str, list[str]] = {"script": [], "style": []}
    for kind, body in _INLINE.findall(template):
        hashes[kind].append(_digest(body))
    csp = "; ".join(
        [
            "default-src 'none'",
            "script-src " + " ".join(hashes["script"]),
            "style-src " + " ".join(hashes["style"]),
            "connect-src 'self'",
            "img-src data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )
    return Landing(template, csp)


def landing_page(address: str) -> tuple[str, dict[str, str]]:
    """The landing page for a server at ``address``, and the headers it must
    be served with. Every value is HTML-escaped where it is placed."""
    page = _landing()
    text = page.template.replace("{{ADDRESS}}", html.escape(address, quote=True)).replace(
        "{{WAKE_LINES}}", str(SIZES["WAKE_LINES"].default)
    )
    headers = {
        "Content-Security-Policy": page.csp,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }
    return text, headers


CONSOLE_CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "img-src 'self' data:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
"""The owner console's policy: its one script and one style sheet come from this server, nothing runs
inline (so a text that reached the page as markup could not run), it talks to this server only, and no
other page may frame it (a framing page could overlay the token field)."""


def console_asset(name: str) -> tuple[str, dict[str, str]]:
    """One file of the owner console and the headers every one of them is served with. The page holds no
    data of its own, so it may be cached; no-store keeps a shared cache from keeping even that."""
    headers = {
        "Content-Security-Policy": CONSOLE_CSP,
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
        "Cross-Origin-Opener-Policy": "same-origin",
        "Cache-Control": "no-store",
    }
    return package_data.read_text(f"web/console/{name}"), headers
