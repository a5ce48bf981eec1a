"""Where an MCP host's authorization code may be sent (docs/DESIGN.md,
"Remote MCP"): the one rule for a redirect URI, registered (RFC 7591) or
named in a client's metadata document, and how one asked for is matched to
one registered: exactly, except that the port of a loopback one may vary
(RFC 8252, section 7.3), since a native app listens on whatever port is
free."""

from __future__ import annotations

from urllib.parse import urlsplit

URI_MAX = 2000
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


def _loopback(uri: str) -> bool:
    parts = urlsplit(uri)
    return parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS


def valid_redirect(uri: str) -> bool:
    """An https URI with a host, or an http one on loopback; no fragment, no user, at most URI_MAX characters."""
    if len(uri) > URI_MAX or any(c.isspace() or not c.isprintable() for c in uri):
        return False
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 - a malformed port raises here
    except ValueError:
        return False
    if parts.fragment or parts.username or parts.password or not parts.hostname:
        return False
    return parts.scheme == "https" or _loopback(uri)


def matches(registered: str, asked: str) -> bool:
    """``asked`` is ``registered``, or both are the same loopback URI on any port."""
    if registered == asked:
        return True
    if not (_loopback(registered) and _loopback(asked)):
        return False
    a, b = urlsplit(registered), urlsplit(asked)
    return (a.hostname, a.path, a.query) == (b.hostname, b.path, b.query)
