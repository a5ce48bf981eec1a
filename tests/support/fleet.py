"""What the fleet tests share: a placement over this test's servers, and a
real Caddy on loopback with its admin endpoint on a free port, configured
only through that endpoint (as `stash fleet` configures the fleet's)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.support import loopback
from tests.support.ops.deploy import caddy_running
from tests.support.server import free_port

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


def placement_doc(
    hosts: dict[str, int],
    shards: list[tuple[str, str]],
    *,
    epoch: int = 1,
    replicas: dict[str, str] | None = None,
    replica_root: str | None = None,
    admin: str = "127.0.0.1:2019",
) -> dict[str, Any]:
    """A placement's JSON: each host at 127.0.0.1:<its port>, each shard
    (digits, host) replicating to ``replicas[host]`` (default: a folder
    path that is never written unless a server replicates)."""
    replicas = replicas or {}
    out: dict[str, Any] = {
        "epoch": epoch,
        "router": {"site": "stash.example.com", "admin": admin},
        "hosts": {name: f"127.0.0.1:{port}" for name, port in hosts.items()},
        "shards": [
            {"digits": d, "host": h, "replica": replicas.get(h, f"/nonexistent/replicas/{h}/e{epoch}")}
            for d, h in shards
        ],
    }
    if replica_root is not None:
        out["replica_root"] = replica_root
    return out


@contextmanager
def caddy_with_admin(tmp: Path) -> Iterator[str]:
    """A Caddy whose only configuration is its admin endpoint on a free
    loopback port (its address, host:port, is yielded); stopped at exit."""
    admin = f"127.0.0.1:{free_port()}"

    def up() -> bool:
        try:
            return loopback.get(f"http://{admin}/config/", timeout=2.0).status_code == 200
        except httpx.TransportError:
            return False

    with caddy_running(f"{{\n\tadmin {admin}\n}}\n", tmp / "caddy", up):
        yield admin
