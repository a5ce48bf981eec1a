"""What the replication tests read of a replicating server: its readiness,
a metric, and a wait for a condition."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.support import loopback


def wait_for(what: Callable[[], Any], timeout: float = 20.0, pause: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(pause)
    raise AssertionError("timed out")


def ready(url: str) -> httpx.Response:
    return loopback.get(f"{url}/health?ready=1", timeout=5)


def metric(url: str, name: str) -> float:
    for line in loopback.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in /metrics")
