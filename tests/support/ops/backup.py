"""The memory log as the owner's export holds it (``#i DATE TEXT``, oldest
first): what the backup, replication and full-disk tests compare."""

from __future__ import annotations

import io
import tarfile

from tests.support.api import member_bytes
from tests.support.server import Http

LOG_REC = 320


def log_of(http: Http, token: str) -> list[str]:
    """Every memory as ``#i DATE TEXT``, from the owner's export (the log
    whole, oldest first)."""
    resp = http.get("/export", token)
    assert resp.status_code == 200, resp.text
    with tarfile.open(fileobj=io.BytesIO(resp.content), mode="r:gz") as tar:
        data = member_bytes(tar, "memory/LOG.txt")
    assert len(data) % LOG_REC == 0
    return [data[k : k + LOG_REC].decode().rstrip() for k in range(0, len(data), LOG_REC)]
