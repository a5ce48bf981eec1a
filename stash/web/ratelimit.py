"""Per-client-address sliding-window limits (auth failures, identity minting)."""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict, deque


class RateLimiter:
    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._hits: dict[tuple[str, str], deque[float]] = defaultdict(deque)

    def _window(self, key: tuple[str, str], now: float, period: float) -> deque[float]:
        q = self._hits[key]
        while q and q[0] <= now - period:
            q.popleft()
        return q

    def blocked_for(self, kind: str, client: str, limit: int, period: float = 60.0) -> int:
        """Seconds until ``client`` may try ``kind`` again; 0 when it may now."""
        now = self._clock()
        with self._lock:
            q = self._window((kind, client), now, period)
            if len(q) < limit:
                return 0
            return max(1, math.ceil(q[0] + period - now))

    def hit(self, kind: str, client: str, period: float = 60.0) -> None:
        now = self._clock()
        with self._lock:
            q = self._window((kind, client), now, period)
            q.append(now)
            if len(self._hits) > 100_000:  # bound memory under a flood of addresses
                for k in [k for k, v in self._hits.items() if not v][:50_000]:
                    del self._hits[k]
