"""Helpers shared by tests, moved whole from tests/e2e/test_copies.py so that no test module imports another."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from stash.storage.files import PAGE_BYTES
from tests.installed import OUTSIDE
from tests.live import Server

SIDE = ("", "-wal", "-shm")


def pages(path: Path) -> list[bytes]:
    data = path.read_bytes() if path.exists() else b""
    return [data[k : k + PAGE_BYTES] for k in range(0, len(data), PAGE_BYTES)]


def put_back_page(path: Path, older: Path, index: int) -> None:
    page = pages(older)[index]
    with open(path, "r+b") as f:
        f.seek(index * PAGE_BYTES)
        f.write(page)


def verify(server: Server, token: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stash", "verify", str(server.data), "--token"],
                          capture_output=True, text=True, cwd=OUTSIDE, timeout=120,
                          env={**os.environ, "STASH_TOKEN": token})
