"""The client's address when the server sits behind reverse proxies it trusts.

Every per-client decision (rate limits, the /metrics loopback check) uses the
address :meth:`TrustedProxies.client` resolves, never the raw TCP peer and
never a header on its own.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

UNKNOWN = "unknown"
"""The client of a request whose proxy chain cannot be read: one shared
bucket for rate limits, and never loopback."""

MAX_HOPS = 32  # entries read from the right of X-Forwarded-For; a real chain is a handful


def parse_network(text: str) -> IPNetwork:
    """``10.0.0.0/8``, ``::1/128`` or a bare address (one host). Host bits
    set under the prefix are refused: ``10.0.0.1/8`` is likelier a typo than a
    wish to trust the whole /8."""
    return ipaddress.ip_network(text.strip(), strict=True)


@functools.lru_cache(maxsize=65536)  # parsing an address costs more than the rest of a refusal
def _address(text: str) -> IPAddress | None:
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


class TrustedProxies:
    """The networks whose ``X-Forwarded-For`` this server believes."""

    def __init__(self, networks: Iterable[str] = ()) -> None:
        self.networks: tuple[IPNetwork, ...] = tuple(parse_network(n) for n in networks)

    def trusts(self, ip: IPAddress) -> bool:
        return any(ip.version == net.version and ip in net for net in self.networks)

    def client(self, peer: str, forwarded_for: list[str]) -> str:
        """The address of the client that made this request.

        The header is read only when the TCP peer is a trusted proxy, and then
        from the right: each trusted proxy appended the address it saw, so
        the first untrusted entry from the right is the client, and anything
        to its left is whatever that client chose to send. An unreadable
        entry reached before an untrusted one makes the client
        :data:`UNKNOWN`. A chain of only trusted addresses (a request made on
        the proxy host itself) resolves to its left-most entry.
        """
        peer_ip = _address(peer)
        if peer_ip is None or not self.trusts(peer_ip):
            return str(peer_ip) if peer_ip is not None else peer
        # Several X-Forwarded-For fields are one comma-separated list, in order.
        raw = ",".join(forwarded_for)
        if not raw.strip():
            return str(peer_ip)  # no header: the proxy itself is the client
        entries = raw.rsplit(",", MAX_HOPS)
        beyond_reach = len(entries) > MAX_HOPS  # the first item is then the unread rest of the chain
        if beyond_reach:
            entries = entries[1:]
        resolved = peer_ip
        for entry in reversed(entries):
            ip = _address(entry)
            if ip is None:
                return UNKNOWN
            if not self.trusts(ip):
                return str(ip)
            resolved = ip
        return UNKNOWN if beyond_reach else str(resolved)
