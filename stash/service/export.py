"""``GET /export``: the whole memory as an OptMem directory in a tar.gz.

The archive unpacks to ``memory/`` with OptMem's own layout, so
``MEMORY_DIR=memory memo wake`` reads it: ``LOG.txt`` (fixed 320-byte records
``#i DATE TEXT``), ``TREE/<size>`` (fixed 288-byte records) and ``config``.
An erased memory is exported as ``[erased]``: its text no longer exists.
"""

from __future__ import annotations

import io
import tarfile
import tempfile
import time

from ..core import lines, sizes
from .memory import Memory

LOG_REC = 320
TREE_REC = 288


def _record(text: str, width: int) -> bytes:
    b = text.encode()
    return b + b" " * (width - 1 - len(b)) + b"\n"


def _add(tar: tarfile.TarFile, name: str, fileobj, size: int, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = int(mtime)
    info.mode = 0o600
    tar.addfile(info, fileobj)


def export_archive(memory: Memory) -> bytes:
    mf = memory.mf
    T = mf.count()
    now = time.time()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar, tempfile.TemporaryFile() as log:
        for batch in mf.scan(T):
            log.write(b"".join(_record(line, LOG_REC) for line in batch))
        size = log.tell()
        log.seek(0)
        _add(tar, "memory/LOG.txt", log, size, now)
        for level in mf.level_sizes():
            data = b"".join(_record(text, TREE_REC) for text in mf.level(level))
            _add(tar, f"memory/TREE/{level}", io.BytesIO(data), len(data), now)
        over = mf.config()
        conf = ["# OptMem sizes for this memory, exported from Stash.", ""]
        for name, s in sizes.SIZES.items():
            mark = "" if name in over else "# "
            conf.append(f"{mark}{name} = {over.get(name, s.default)}  # {s.meaning}")
        data = ("\n".join(conf) + "\n").encode()
        _add(tar, "memory/config", io.BytesIO(data), len(data), now)
        readme = (f"Exported from Stash: {lines.plural(T, 'memory')}.\n"
                  "Read it with OptMem: MEMORY_DIR=memory memo wake\n").encode()
        _add(tar, "README.txt", io.BytesIO(readme), len(readme), now)
    return out.getvalue()
