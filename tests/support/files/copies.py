"""A store's files page by page, for the tests that put an older copy's page
back behind the server (copies, owner-only, the swap matrix), and ``stash
verify`` run on a live server's data folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from stash.storage.formats import PAGE_BYTES
from tests.support.installed import OUTSIDE
from tests.support.server import Server

SIDE = ("", "-wal", "-shm")


def pages(path: Path, size: int = PAGE_BYTES) -> list[bytes]:
    """The file's bytes in chunks of ``size`` (its pages, or 16 KiB chunks of them)."""
    data = path.read_bytes() if path.exists() else b""
    return [data[k : k + size] for k in range(0, len(data), size)]


def put_back_page(path: Path, older: Path, index: int, size: int = PAGE_BYTES) -> None:
    page = pages(older, size)[index]
    with open(path, "r+b") as f:
        f.seek(index * size)
        f.write(page)


def verify(server: Server, token: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stash", "verify", str(server.data), "--token"],
        capture_output=True,
        text=True,
        cwd=OUTSIDE,
        timeout=120,
        env={**os.environ, "STASH_TOKEN": token},
    )
