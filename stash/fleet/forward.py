"""A request sent on from one host of a fleet to another (docs/DESIGN.md,
"Remote MCP", its fleet part): the placement as this host reads it, and the
one HTTP hop.

The router sends a request with a Stash token to its shard's host, and any
other to any live host. An MCP host's OAuth flow has no token until its
end, so the host that receives a step sends it on to the host that keeps
what the step needs: the client's registration, the consent form's nonce,
or the user's files and the code. A request sent on carries :data:`HOP`
(the sender's name), and a request that carries it is answered where it
lands, never sent on again, with one exception that cannot loop: a consent
form sent on to the host that showed its page goes on from there once more,
as the owner's approval, to the host of the owner's shard, and an approval
is always answered where it lands (two hops at most). The router removes
the header from every request it proxies; it is no credential (what a step
may do is the owner token's, or the code's, as on a single host), so a
forged one only keeps a request from travelling, or lets an approval carry
its request in place of a nonce, which still mints nothing without the
owner token.
"""

from __future__ import annotations

import http.client
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .host import ADOPTED, CHECK_S
from .placement import Placement, PlacementError, load

HOP = "Stash-Fleet-Hop"  # names the host that sent the request on; the router drops it from outside requests
HOP_TIMEOUT_S = 30.0  # a consent's approval there takes an owner token's check (argon2id) and a write


class Unreachable(Exception):
    """The other host did not answer (refused, timed out, cut off)."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: list[tuple[str, str]]  # as sent, repeated names kept, hop-by-hop ones left out
    body: bytes


# RFC 9110, 7.6.1: these describe one connection, not the message; the length is the body's own.
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}
    | {"content-length", "date", "server"}
)


class Fleet:
    """This host's view of its fleet: its name (``--fleet-host``) and the
    placement adopted in its data folder, read again when the file changes
    (looked at no more than every :data:`CHECK_S`). No file, or one that
    cannot be read or does not name this host: no fleet, every request is
    answered here as on a single host."""

    def __init__(self, data_dir: Path, host: str) -> None:
        self.host = host
        self.path = Path(data_dir) / ADOPTED
        self._lock = threading.Lock()
        self._next = 0.0
        self._seen: tuple[int, int, int] | None = None
        self._placement: Placement | None = None

    def placement(self) -> Placement | None:
        now = time.monotonic()
        if now >= self._next:
            with self._lock:
                self._refresh(now)
        return self._placement

    def _refresh(self, now: float) -> None:
        if now < self._next:
            return
        self._next = now + CHECK_S
        try:
            st = os.stat(self.path)
        except OSError:
            self._seen, self._placement = None, None
            return
        seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        if seen == self._seen:
            return
        try:
            found = load(self.path)
        except PlacementError:
            return  # a file being replaced, or broken: the last view stands until a good one is there
        self._seen = seen
        self._placement = found if self.host in found.hosts else None

    def elsewhere(self, host: str | None) -> str | None:
        """The address of ``host`` when it is another host of this fleet; None: answer here."""
        placement = self.placement()
        if placement is None or host is None or host == self.host:
            return None
        return placement.hosts.get(host)

    def host_of(self, first_digit: str) -> str | None:
        """The host of the shard of users whose id starts with ``first_digit`` (None: no fleet, or no such digit)."""
        placement = self.placement()
        if placement is None:
            return None
        try:
            return placement.shard_of(first_digit).host
        except PlacementError:
            return None


def send(address: str, method: str, target: str, headers: list[tuple[str, str]], body: bytes) -> Answer:
    """One request to the host at ``address`` (host:port, plain http on the
    fleet's network), its answer whole; :class:`Unreachable` when none came."""
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=HOP_TIMEOUT_S)
    try:
        conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        data = resp.read()
        kept = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
        return Answer(resp.status, kept, data)
    except (OSError, http.client.HTTPException) as e:
        raise Unreachable(type(e).__name__) from None
    finally:
        conn.close()
