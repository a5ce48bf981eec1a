"""Per-client sliding-window limits (failed authentication, identity minting).

A client is its address, or its /64 for IPv6, where one host is handed a
whole /64 and could otherwise rotate through addresses for free.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable

SWEEP_ABOVE = 10_000  # tracked clients before idle ones are swept out


@functools.lru_cache(maxsize=65536)  # parsing an address costs more than the rest of a refusal
def client_key(host: str) -> str:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if ip.version == 4:
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.ip_network(f"{ip}/64", strict=False))


class RateLimiter:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._hits: dict[tuple[str, str], deque[float]] = defaultdict(deque)
        self._periods: dict[str, float] = {}  # each kind's window, so a sweep keeps a day-long one whole
        self._last_sweep = clock()

    def _window(self, key: tuple[str, str], now: float, period: float) -> deque[float]:
        q = self._hits[key]
        while q and q[0] <= now - period:
            q.popleft()
        return q

    def blocked_for(self, kind: str, client: str, limit: int, period: float = 60.0) -> int:
        """Seconds until ``client`` may try ``kind`` again; 0 when it may now."""
        now = self._clock()
        key = (kind, client_key(client))
        with self._lock:
            if key not in self._hits:
                return 0
            q = self._window(key, now, period)
            if len(q) < limit:
                return 0
            return max(1, math.ceil(q[0] + period - now))

    def hit(self, kind: str, client: str, period: float = 60.0) -> None:
        now = self._clock()
        with self._lock:
            self._periods[kind] = period
            self._window((kind, client_key(client)), now, period).append(now)
            # Memory stays bounded under a flood of addresses: at most once a
            # period, forget every client whose window has emptied.
            if len(self._hits) > SWEEP_ABOVE and now - self._last_sweep >= period:
                self._last_sweep = now
                for k in list(self._hits):
                    if not self._window(k, now, self._periods.get(k[0], period)):
                        del self._hits[k]
