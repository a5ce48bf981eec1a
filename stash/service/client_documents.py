"""An MCP host's Client ID Metadata Document: a client that names itself by
an https URL, whose document there says its name and redirect URIs
(docs/DESIGN.md, "Remote MCP"). The server fetches it when the host asks for
consent, and that fetch is the one request it makes on anyone's say-so, so it
is bounded every way:

* https only, to a URL with a path; no user, no fragment, no redirect
  followed. Loopback (over http too) only with ``--oauth-loopback-clients
  on``, which the tests set.
* The name is resolved once and every address it resolves to is checked:
  none may be private, loopback, link-local, multicast, reserved or
  otherwise not global. The connection goes to the address checked, never to
  a second resolution (a name that answers one address to the check and
  another to the connect gains nothing); TLS still checks the name.
* At most :data:`MAX_BYTES` of body and :data:`SECONDS` in all."""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import ssl
import time
from typing import Any
from urllib.parse import urlsplit

from ..core.errors import UnknownClient
from .redirect_uris import valid_redirect

MAX_BYTES = 5 * 1024
SECONDS = 3.0
URL_MAX = 2000
LOOPBACK_NAMES = ("localhost",)


Refused = UnknownClient  # a document that cannot be had, or is not one: its client is unknown


def is_document_url(client_id: str) -> bool:
    """A client_id that names a metadata document rather than a registration."""
    return client_id.startswith(("https://", "http://"))


def _address_allowed(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, loopback: bool) -> bool:
    if ip.is_loopback:
        return loopback
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        return _address_allowed(mapped, loopback)
    return ip.is_global and not (
        ip.is_private or ip.is_link_local or ip.is_multicast or ip.is_reserved or ip.is_unspecified
    )


def resolve(host: str, port: int, loopback: bool) -> str:
    """The one address to connect to: every address ``host`` resolves to is allowed, or it is refused."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise Refused("The client's metadata document's host does not resolve; check client_id.") from None
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
    if not addresses or not all(_address_allowed(a, loopback) for a in addresses):
        raise Refused(
            "The client's metadata document is on a private or local address, which this server "
            "does not fetch from; host it at a public https address."
        )
    return str(addresses[0])


def fetch(client_id: str, loopback: bool) -> dict[str, Any]:
    """The metadata document at ``client_id``, checked (:func:`check`)."""
    parts = urlsplit(client_id)
    host = parts.hostname or ""
    local = host in LOOPBACK_NAMES or _is_loopback_literal(host)
    if len(client_id) > URL_MAX or parts.username or parts.password or parts.fragment or not host:
        raise Refused("client_id is not a metadata document's URL (https, a host, a path, no fragment).")
    if parts.scheme != "https" and not (parts.scheme == "http" and loopback and local):
        raise Refused("A client's metadata document must be served over https.")
    if parts.path in ("", "/"):
        raise Refused("A client's metadata document URL needs a path, like https://host/client.json.")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    address = resolve(host, port, loopback)
    body = _get(parts.scheme, host, address, port, parts.path + (f"?{parts.query}" if parts.query else ""))
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise Refused("The client's metadata document is not JSON.") from None
    return check(document, client_id)


def _is_loopback_literal(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _get(scheme: str, host: str, address: str, port: int, target: str) -> bytes:
    deadline = time.monotonic() + SECONDS

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Refused("The client's metadata document took too long to fetch.")
        return remaining

    conn: http.client.HTTPConnection
    try:
        raw = socket.create_connection((address, port), timeout=left())
        if scheme == "https":
            conn = http.client.HTTPSConnection(host, port, timeout=left())
            conn.sock = ssl.create_default_context().wrap_socket(raw, server_hostname=host)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=left())
            conn.sock = raw
        try:
            conn.request("GET", target, headers={"Accept": "application/json", "User-Agent": "stash-oauth/1"})
            raw.settimeout(left())
            resp = conn.getresponse()
            if resp.status != 200:
                raise Refused(f"The client's metadata document answered HTTP {resp.status}, not the document.")
            declared = resp.getheader("Content-Length")
            if declared is not None and (not declared.isdigit() or int(declared) > MAX_BYTES):
                raise Refused(f"The client's metadata document is over {MAX_BYTES} bytes.")
            chunks, size = [], 0
            while True:
                raw.settimeout(left())
                chunk = resp.read1(1024)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_BYTES:
                    raise Refused(f"The client's metadata document is over {MAX_BYTES} bytes.")
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            conn.close()
    except Refused:
        raise
    except (OSError, http.client.HTTPException, ssl.SSLError):
        if time.monotonic() >= deadline:
            raise Refused("The client's metadata document took too long to fetch.") from None
        raise Refused("The client's metadata document could not be fetched.") from None


def check(document: object, client_id: str) -> dict[str, Any]:
    """A metadata document as a client: its ``client_id`` is the URL it was fetched from, its redirect URIs
    are valid (service/redirect_uris.py), and it authenticates with nothing (a public client)."""
    if not isinstance(document, dict) or document.get("client_id") != client_id:
        raise Refused("The client's metadata document does not name its own URL as client_id.")
    uris = document.get("redirect_uris")
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) and valid_redirect(u) for u in uris):
        raise Refused("The client's metadata document has no valid redirect_uris (https, or http on loopback).")
    if document.get("token_endpoint_auth_method", "none") != "none":
        raise Refused(
            "The client's metadata document asks for client authentication; this server takes public "
            "clients only (token_endpoint_auth_method none)."
        )
    name = document.get("client_name")
    return {"client_id": client_id, "client_name": name if isinstance(name, str) else None, "redirect_uris": list(uris)}
