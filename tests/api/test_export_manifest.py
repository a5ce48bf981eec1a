"""``GET /export`` carries ``manifest.json``: counts, and a SHA-256 of every
other member plus one digest over them all, checked here with hashlib from
the definition in API-REFERENCE.md "Export archive"; of main and of a
second memory (``GET /m/{name}/export``)."""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.api.support import Mem, export_members
from tests.support.api import Api
from tests.support.memories import Memory
from tests.support.oracle import bid, oracle_pending


@pytest.fixture
def mem(api: Api, owner: str, memory: Memory) -> Mem:
    memory.create(api, owner)
    return Mem(api, owner, memory)


def listing(files: dict[str, bytes]) -> str:
    """What ``sha256sum`` prints for these files, paths in byte order."""
    return "".join(f"{hashlib.sha256(files[p]).hexdigest()}  {p}\n" for p in sorted(files, key=str.encode))


def test_manifest_counts_and_digests(api: Api, mem: Mem) -> None:
    mem.import_([f"memory {i} ✓" for i in range(21)])
    mem.settle_all()
    api.post(mem.at("/erase"), mem.token, json={"ids": [9, 3]})
    # Erasing #3 and #9 dropped the blocks over them (2-3, 0-3, 0-7, 8-9, 8-11, 8-15, 0-15); settle the
    # size-2 ones again and leave the rest due: the export writes each level up to its first hole.
    for lo in range(2, 20, 2):
        mem.nap(bid(lo, lo + 2), f"again {lo}")
    mem.set_config(WAKE_LINES=40, ENTRY_CHARS=200)

    members = export_members(api, mem.token, mem.at("/export"))
    doc = json.loads(members.pop("manifest.json"))
    settled = {(0, 2), *((lo, lo + 2) for lo in range(2, 20, 2))}
    assert doc["format"] == "stash-export/1"
    assert doc["memories"] == 21 and doc["erased"] == 2
    assert doc["summaries"] == {"2": 10}
    assert doc["pending"] == len(oracle_pending(21, settled))
    assert doc["config"] == {"WAKE_LINES": 40, "ENTRY_CHARS": 200}
    assert doc["records"] == {"log": 320, "tree": 288}
    assert doc["files"] == [
        {"path": p, "bytes": len(members[p]), "sha256": hashlib.sha256(members[p]).hexdigest()}
        for p in sorted(members, key=str.encode)
    ]
    assert set(members) == {"README.txt", "memory/LOG.txt", "memory/TREE/2", "memory/config"}
    assert doc["digest"] == hashlib.sha256(listing(members).encode()).hexdigest()


def test_an_unchanged_memory_exports_the_same_manifest(api: Api, mem: Mem) -> None:
    mem.import_(["one", "two", "three"])
    mem.settle_all()
    first = export_members(api, mem.token, mem.at("/export"))["manifest.json"]
    assert export_members(api, mem.token, mem.at("/export"))["manifest.json"] == first
    mem.note("four")
    changed = json.loads(export_members(api, mem.token, mem.at("/export"))["manifest.json"])
    assert changed["digest"] != json.loads(first)["digest"] and changed["memories"] == 4


def test_an_empty_memory_has_a_manifest_too(api: Api, mem: Mem) -> None:
    members = export_members(api, mem.token, mem.at("/export"))
    doc = json.loads(members.pop("manifest.json"))
    assert (doc["memories"], doc["erased"], doc["summaries"], doc["pending"], doc["config"]) == (0, 0, {}, 0, {})
    assert members["memory/LOG.txt"] == b""
    assert doc["digest"] == hashlib.sha256(listing(members).encode()).hexdigest()


# The sizes OptMem's public `memo` knows (VictorTaelin/OptMem at 1fb164c, its KNOBS): it refuses a config
# file that sets any other ("WAKE_CHARS is not a size"). Written here from memo's source, not from Stash's.
MEMO_SIZES = {"WAKE_LINES", "ENTRY_CHARS", "PART_CHARS", "PART_LINES"}


def memo_reads(config: str) -> dict[str, int]:
    """The sizes memo's config reader takes from ``config``: each line up to
    its first '#', NAME = N; a name memo does not know is an error."""
    out = {}
    for line in config.splitlines():
        line = line.split("#")[0].strip()
        if "=" not in line:
            continue
        name, value = (part.strip() for part in line.split("=", 1))
        assert name.upper() in MEMO_SIZES, f"memo refuses the export: {name} is not a size"
        out[name.upper()] = int(value)
    return out


def test_the_exported_config_is_one_memo_reads(api: Api, mem: Mem) -> None:
    mem.import_(["one", "two"])
    mem.set_config(WAKE_CHARS=50_000, WAKE_LINES=40)
    members = export_members(api, mem.token, mem.at("/export"))
    assert memo_reads(members["memory/config"].decode()) == {"WAKE_LINES": 40}
    # Stash's own size is kept where a Stash import finds it, and shown to a reader as a comment.
    assert json.loads(members["manifest.json"])["config"] == {"WAKE_LINES": 40, "WAKE_CHARS": 50_000}
    assert "WAKE_CHARS = 50000" in members["memory/config"].decode()
