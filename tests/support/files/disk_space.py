"""Running a real filesystem out of space, for the tests of what a full disk
answers."""

from __future__ import annotations

import errno
from pathlib import Path


def fill(folder: Path, leave: int = 0) -> Path:
    """Fill the filesystem under ``folder`` until not one more byte fits,
    then give back about ``leave`` bytes."""
    filler = folder / "filler"
    with open(filler, "ab", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
            while True:
                try:
                    f.write(b"\xff" * size)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
                    break
        if leave:
            f.truncate(max(0, f.tell() - leave))
    return filler
