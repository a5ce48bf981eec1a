"""Helpers shared by tests, moved whole from tests/e2e/test_full_disk.py so that no test module imports another."""

from __future__ import annotations

from pathlib import Path


def worker_pids(pid: int) -> set[int]:
    """The server's worker processes (its children)."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        out.update(int(c) for c in (task / "children").read_text().split())
    return out


def metrics_folder(worker: int) -> Path:
    """Where a worker keeps its metrics files, from its environment."""
    env = Path(f"/proc/{worker}/environ").read_bytes().split(b"\0")
    return Path(next(v for v in env if v.startswith(b"PROMETHEUS_MULTIPROC_DIR=")).split(b"=", 1)[1].decode())
