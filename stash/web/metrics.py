"""Prometheus counters and latencies: route templates and statuses only, never
a user, a memory, a token or a query string."""

from __future__ import annotations

import threading
from collections import defaultdict

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self._hist: dict[tuple[str, str], list[int]] = {}
        self._sum: dict[tuple[str, str], float] = defaultdict(float)
        self._count: dict[tuple[str, str], int] = defaultdict(int)
        self._events: dict[str, int] = defaultdict(int)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self._requests[(method, route, status)] += 1
            key = (method, route)
            hist = self._hist.setdefault(key, [0] * len(BUCKETS))
            for k, edge in enumerate(BUCKETS):
                if seconds <= edge:
                    hist[k] += 1
            self._sum[key] += seconds
            self._count[key] += 1

    def event(self, name: str) -> None:
        with self._lock:
            self._events[name] += 1

    def render(self) -> str:
        out = [
            "# HELP stash_requests_total Requests answered, by route template and status.",
            "# TYPE stash_requests_total counter",
        ]
        with self._lock:
            for (method, route, status), n in sorted(self._requests.items()):
                out.append(f'stash_requests_total{{method="{method}",route="{route}",status="{status}"}} {n}')
            out += [
                "# HELP stash_request_seconds Time to answer, by route template.",
                "# TYPE stash_request_seconds histogram",
            ]
            for (method, route), hist in sorted(self._hist.items()):
                labels = f'method="{method}",route="{route}"'
                for edge, n in zip(BUCKETS, hist):
                    out.append(f'stash_request_seconds_bucket{{{labels},le="{edge}"}} {n}')
                out.append(f'stash_request_seconds_bucket{{{labels},le="+Inf"}} {self._count[(method, route)]}')
                out.append(f"stash_request_seconds_sum{{{labels}}} {self._sum[(method, route)]:.6f}")
                out.append(f"stash_request_seconds_count{{{labels}}} {self._count[(method, route)]}")
            out += ["# HELP stash_events_total Notable events.", "# TYPE stash_events_total counter"]
            for name, n in sorted(self._events.items()):
                out.append(f'stash_events_total{{event="{name}"}} {n}')
        return "\n".join(out) + "\n"
