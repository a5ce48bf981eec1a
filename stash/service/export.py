"""``GET /export``: the whole memory as an OptMem directory in a tar.gz.

The archive unpacks to ``memory/`` with OptMem's own layout, so
``MEMORY_DIR=memory memo wake`` reads it: ``LOG.txt`` (fixed 320-byte records
``#i DATE TEXT``), ``TREE/<size>`` (fixed 288-byte records) and ``config``.
An erased memory is exported as ``[erased]``: its text no longer exists.
Beside ``memory/`` lie ``README.txt`` and ``manifest.json`` (counts, and a
SHA-256 of every other member plus one digest over them all).

The decrypted log is never written to disk: every record is the same size, so
the LOG.txt member's size is known before its first byte, and the records are
rendered a batch at a time as the tar writer reads them (:class:`_LogStream`).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from collections.abc import Iterable
from typing import Any

from ..core import blocks, lines, sizes
from .memory import Memory

LOG_REC = 320
TREE_REC = 288
MANIFEST = "manifest.json"
FORMAT = "stash-export/1"


def _record(text: str, width: int) -> bytes:
    b = text.encode()
    return b + b" " * (width - 1 - len(b)) + b"\n"


def _add(tar: tarfile.TarFile, name: str, fileobj: io.BytesIO | _LogStream, size: int, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = int(mtime)
    info.mode = 0o600
    tar.addfile(info, fileobj)


class _LogStream:
    """The log's fixed-size records, rendered from ``batches`` (of rendered
    lines) only as they are read, hashed on the way: at most one batch of
    plaintext exists at a time, in memory."""

    def __init__(self, batches: Iterable[list[str]], digest: hashlib._Hash) -> None:
        self._batches = iter(batches)
        self._digest = digest
        self._buf = b""
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        if self._pos >= len(self._buf):
            batch = next(self._batches, None)
            if batch is None:
                return b""
            self._buf = b"".join(_record(line, LOG_REC) for line in batch)
            self._pos = 0
            self._digest.update(self._buf)
        end = len(self._buf) if n is None or n < 0 else self._pos + n
        out = self._buf[self._pos : end]
        self._pos += len(out)
        return out


def listing_digest(files: list[dict[str, Any]]) -> str:
    """The manifest's ``digest``: SHA-256 of the text ``sha256sum`` prints for
    the listed files, one ``<hex>  <path>\\n`` line each, paths in byte order.
    Defined that way so anyone can recompute it with coreutils alone."""
    ordered = sorted(files, key=lambda f: f["path"].encode())
    text = "".join(f"{f['sha256']}  {f['path']}\n" for f in ordered)
    return hashlib.sha256(text.encode()).hexdigest()


def manifest(
    T: int, erased: int, levels: dict[int, int], pending: int, over: dict[str, int], files: list[dict[str, Any]]
) -> bytes:
    """A function of the memory's content only (no timestamp), so two exports
    of an unchanged memory carry the same manifest and the same digest."""
    files = sorted(files, key=lambda f: f["path"].encode())
    doc = {
        "format": FORMAT,
        "memories": T,
        "erased": erased,
        "summaries": {str(size): n for size, n in sorted(levels.items())},
        "pending": pending,
        "config": {name: over[name] for name in sizes.SIZES if name in over},
        "records": {"log": LOG_REC, "tree": TREE_REC},
        "files": files,
        "digest": listing_digest(files),
    }
    return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode()


def export_archive(memory: Memory) -> bytes:
    mf = memory.mf
    T = mf.count()
    now = time.time()
    files: list[dict[str, Any]] = []
    out = io.BytesIO()

    def member(name: str, fileobj: io.BytesIO, size: int, digest: str) -> None:
        _add(tar, name, fileobj, size, now)
        files.append({"path": name, "bytes": size, "sha256": digest})

    def small(name: str, data: bytes) -> None:
        member(name, io.BytesIO(data), len(data), hashlib.sha256(data).hexdigest())

    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        h = hashlib.sha256()
        size = T * LOG_REC
        _add(tar, "memory/LOG.txt", _LogStream(mf.scan(T), h), size, now)
        files.append({"path": "memory/LOG.txt", "bytes": size, "sha256": h.hexdigest()})
        counts: dict[int, int] = {}
        for level in mf.level_sizes():
            texts = list(mf.level(level))
            if not texts:
                continue  # the level's first block is an erasure's hole: OptMem asks for it itself
            counts[level] = len(texts)
            small(f"memory/TREE/{level}", b"".join(_record(text, TREE_REC) for text in texts))
        over = mf.config()
        conf = ["# OptMem sizes for this memory, exported from Stash.", ""]
        for name, s in sizes.SIZES.items():
            if not s.optmem:
                continue
            mark = "" if name in over else "# "
            conf.append(f"{mark}{name} = {over.get(name, s.default)}  # {s.meaning}")
        kept = [f"{name} = {value}" for name, value in over.items() if not sizes.SIZES[name].optmem]
        if kept:
            # A size memo does not know is only a comment here: memo refuses a file that sets one.
            conf += [
                "",
                "# Stash's own sizes, which OptMem does not read (manifest.json keeps them too):",
                *(f"#   {line}" for line in kept),
            ]
        small("memory/config", ("\n".join(conf) + "\n").encode())
        readme = (
            f"Exported from Stash: a memory of {lines.plural(T, 'note')}.\n"
            "Read it with OptMem: MEMORY_DIR=memory memo wake\n"
            "manifest.json lists every other file with its SHA-256; check them with:\n"
            "  find . -type f ! -name manifest.json | sed 's|^\\./||' | LC_ALL=C sort | xargs sha256sum\n"
            "Move it into another Stash memory with: stash import-optmem .\n"
        ).encode()
        small("README.txt", readme)
        # OptMem's levels are dense, so what it will ask for is counted from
        # the exported prefixes (a level stops at an erasure's first hole).
        pending = blocks.pending_count(T, counts)
        data = manifest(T, mf.erased_count(), counts, pending, over, files)
        _add(tar, MANIFEST, io.BytesIO(data), len(data), now)
    return out.getvalue()
