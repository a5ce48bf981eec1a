"""Every committed state a SQLite file and its WAL still hold, as someone
holding copies of the two files reads them: the main file as it is; the file
as each commit frame of the WAL's current generation left it; and the frames
of older generations still in the file past its end (a restarted WAL writes
from the start and leaves the rest), applied on top of the newest state.
SQLite itself reads only the newest state; an attacker reads them all.

A SQLCipher file's WAL holds its pages encrypted as they are in the file,
each readable at its own page number, so the same states open with the
file's key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

WAL_HEADER = 32
FRAME_HEADER = 24


def _frames(wal: bytes) -> tuple[int, bytes, list[tuple[int, int, bytes, bytes]]]:
    """The WAL's page size, its header's salts and every whole frame in the
    file: ``(page number, database pages after a commit or 0, salts, page)``."""
    if len(wal) < WAL_HEADER:
        return 0, b"", []
    page = int.from_bytes(wal[8:12], "big")
    if page < 512 or page & (page - 1):
        return 0, b"", []
    out = []
    at = WAL_HEADER
    while at + FRAME_HEADER + page <= len(wal):
        head = wal[at : at + FRAME_HEADER]
        out.append(
            (
                int.from_bytes(head[0:4], "big"),
                int.from_bytes(head[4:8], "big"),
                head[8:16],
                wal[at + FRAME_HEADER : at + FRAME_HEADER + page],
            )
        )
        at += FRAME_HEADER + page
    return page, wal[16:24], out


def states(main: bytes, wal: bytes) -> Iterator[bytes]:
    """The bytes of a whole database file for each state ``main`` and its
    ``wal`` hold (see the module docstring), newest of the current
    generation included."""
    yield main
    page, salts, frames = _frames(wal)
    if not frames:
        return
    image = bytearray(main)
    newest = bytes(main)
    k = 0
    while k < len(frames) and frames[k][2] == salts:  # the current generation
        number, commit, _, data = frames[k]
        _put(image, page, number, data)
        if commit:
            newest = bytes(image[: commit * page])
            yield newest
        k += 1
    # What older generations left past its end, run by run of one salt.
    while k < len(frames):
        run = frames[k][2]
        image = bytearray(newest)
        while k < len(frames) and frames[k][2] == run:
            number, commit, _, data = frames[k]
            _put(image, page, number, data)
            if commit:
                yield bytes(image[: commit * page])
            k += 1
        yield bytes(image)


def _put(image: bytearray, page: int, number: int, data: bytes) -> None:
    if number < 1:
        return
    end = number * page
    if len(image) < end:
        image.extend(bytes(end - len(image)))
    image[end - page : end] = data


def copy_now(folder: Path, names: tuple[str, ...]) -> dict[str, bytes]:
    """Each file of ``names`` (and its ``-wal``) in ``folder`` as it is
    right now, read whole one after the other; b"" for one not there."""
    out = {}
    for name in names:
        for suffix in ("", "-wal"):
            try:
                out[name + suffix] = (folder / (name + suffix)).read_bytes()
            except FileNotFoundError:
                out[name + suffix] = b""
    return out
