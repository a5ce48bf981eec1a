"""GET /export never writes the decrypted log to disk (issue 10 item 6): the
archive is built with every way Python has to make a temporary or a new file
refused, over a log of several scan batches, and its LOG.txt is still every
memory, in order, with the digest the manifest names; in main and in a
second memory."""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import tempfile

import pytest

from stash.storage.memfile import SCAN_BATCH
from tests.api.support import Mem, export_members
from tests.support.api import Api
from tests.support.memories import Memory


@pytest.fixture
def mem(api: Api, owner: str, memory: Memory) -> Mem:
    memory.create(api, owner)
    return Mem(api, owner, memory)


def test_export_builds_the_log_member_without_any_file(api: Api, mem: Mem, monkeypatch: pytest.MonkeyPatch):
    T = 2 * SCAN_BATCH + 7
    for start in range(0, T, 2000):
        mem.import_([f"memory {i}" for i in range(start, min(T, start + 2000))])
    mem.api.get(mem.at("/wake"), mem.token)  # every file this store needs is open-able before the trap is set

    def refuse(*args, **kwargs):
        raise AssertionError("the export tried to make a file")

    for name in ("TemporaryFile", "NamedTemporaryFile", "SpooledTemporaryFile", "mkstemp", "mkdtemp"):
        monkeypatch.setattr(tempfile, name, refuse)
    real_open, real_os_open = builtins.open, os.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            raise AssertionError(f"the export opened a file to write: {file}")
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded_open)
    members = export_members(api, mem.token, mem.at("/export"))
    monkeypatch.setattr(builtins, "open", real_open)
    assert os.open is real_os_open
    log = members["memory/LOG.txt"]
    assert len(log) == T * 320
    records = [log[k : k + 320].decode().rstrip() for k in range(0, len(log), 320)]
    assert records == [f"#{i} {mem.log[i][0]} memory {i}" for i in range(T)]
    manifest = json.loads(members["manifest.json"])
    entry = next(f for f in manifest["files"] if f["path"] == "memory/LOG.txt")
    assert entry == {"path": "memory/LOG.txt", "bytes": T * 320, "sha256": hashlib.sha256(log).hexdigest()}
