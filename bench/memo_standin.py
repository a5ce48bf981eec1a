"""A stand-in for OptMem's ``memo``: its work, on its files, one process a call.

The baseline of ``bench/versus.py``. OptMem is a single-file Python CLI; each
call is a fresh interpreter that reads the plaintext folder and exits. This
script does the same work on the same layout (the one ``GET /export`` and
``stash import-optmem`` speak, docs/DESIGN.md, "Memory model"):

* ``LOG.txt`` — one fixed 320-byte record per memory, ``#i DATE TEXT`` padded
  with spaces and ended by a newline, so memory ``#i`` is at byte ``320·i`` and
  ``T`` is the file's size over 320;
* ``TREE/<size>`` — one fixed 288-byte record per summary of that size, each
  level a dense prefix, so a level's count is its size over 288.

The algorithms are those of the design document, written here from its words and sharing no
code with ``stash`` (the harness checks that both give the same lines):

* ``wake`` — the cover (docs/DESIGN.md, "The cover": bisection, 60 halvings, then split the newest),
  one seek and read per line, then the first pending block and its prompt;
* ``zoom lo-hi`` — two records;
* ``note TEXT`` — append one record and fsync (Stash commits each note with
  ``synchronous = FULL``, so both pay for the disk), then the due nap;
* ``nap`` / ``nap lo-hi TEXT`` — what is due; or settle it (append to its
  level, fsync) and say what is due next;
* ``recall PATTERN`` — Python's ``re`` with IGNORECASE over every rendered log
  line, keeping the newest matches that fit 20,000 bytes, and the count.

Only the standard library is imported, as a single-file CLI would.

    python bench/memo_standin.py DIR wake
"""

from __future__ import annotations

import datetime as dt
import os
import re
import sys

LOG_REC = 320
TREE_REC = 288
WAKE_LINES = 96
ENTRY_CHARS = 280
PART_CHARS = 20_000
RAW_MAX = 16


class Folder:
    def __init__(self, root: str) -> None:
        self.root = root
        self.log_path = os.path.join(root, "LOG.txt")
        self.tree = os.path.join(root, "TREE")
        self.T = os.path.getsize(self.log_path) // LOG_REC
        self._log = open(self.log_path, "rb")

    def record(self, i: int) -> str:
        self._log.seek(i * LOG_REC)
        return self._log.read(LOG_REC).decode().rstrip()

    def settled(self, size: int) -> int:
        try:
            return os.path.getsize(os.path.join(self.tree, str(size))) // TREE_REC
        except FileNotFoundError:
            return 0

    def summary(self, lo: int, hi: int) -> str | None:
        size = hi - lo
        if lo // size >= self.settled(size):
            return None
        with open(os.path.join(self.tree, str(size)), "rb") as f:
            f.seek(lo // size * TREE_REC)
            return f"#{lo}-{hi - 1} " + f.read(TREE_REC).decode().rstrip()

    def line(self, lo: int, hi: int) -> str | None:
        return self.record(lo) if hi - lo == 1 else self.summary(lo, hi)

    def pending(self, limit: int | None = None) -> list[tuple[int, int]]:
        out = []
        size = 2
        while size <= self.T:
            for k in range(self.settled(size), self.T // size):
                out.append((k * size, (k + 1) * size))
                if limit is not None and len(out) >= limit:
                    return out
            size *= 2
        return out

    def remaining(self) -> int:
        n, size = 0, 2
        while size <= self.T:
            n += max(0, self.T // size - self.settled(size))
            size *= 2
        return n


def tile(T: int, a: float) -> list[tuple[int, int]]:
    R = 1
    while R < T:
        R *= 2
    out, stack = [], [(0, R)]
    while stack:
        lo, hi = stack.pop()
        if lo >= T:
            continue
        size = hi - lo
        if size > 1 and (hi > T or size > a * (T - lo)):
            mid = (lo + hi) // 2
            stack.append((mid, hi))
            stack.append((lo, mid))
        else:
            out.append((lo, hi))
    return out


def cover(T: int, budget: int) -> list[tuple[int, int]]:
    if T <= budget:
        return [(i, i + 1) for i in range(T)]
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if len(tile(T, mid)) > budget:
            lo = mid
        else:
            hi = mid
    out = tile(T, hi)
    while len(out) < budget:
        k = next((k for k in range(len(out) - 1, -1, -1) if out[k][1] - out[k][0] > 1), None)
        if k is None:
            break
        a, b = out[k]
        out[k : k + 1] = [(a, (a + b) // 2), ((a + b) // 2, b)]
    return out


def nap_prompt(f: Folder) -> str:
    """memo's nap prompt, byte for byte (OptMem's ``memo``, ``nap_prompt``):
    no count line when nothing remains, and the command after ``Run: ``."""
    due = f.pending(limit=1)
    if not due:
        return ""
    lo, hi = due[0]
    if hi - lo <= RAW_MAX:
        source = [f.record(i) for i in range(lo, hi)]
    else:
        mid = (lo + hi) // 2
        source = [f.summary(lo, mid) or "", f.summary(mid, hi) or ""]
    left = f.remaining() - 1
    tail = (
        ""
        if not left
        else "\n" + ("1 compression remains" if left == 1 else f"{left} compressions remain") + " after this one."
    )
    return (
        f"Compress memories #{lo}-{hi - 1} into one line of at most {ENTRY_CHARS} bytes.\n"
        "Keep what has lasting effect, drop what does not. Invent nothing.\n\n"
        + "\n".join("  " + s for s in source)
        + f"\n{tail}\n"
        + f'Run: memo nap {lo}-{hi - 1} "<your line>"\n'
    )


def wake(f: Folder) -> str:
    out = []
    for lo, hi in cover(f.T, WAKE_LINES):
        line = f.line(lo, hi)
        if line is None:
            return f"Cannot wake: #{lo}-{hi - 1} is not compressed yet.\n" + nap_prompt(f)
        out.append(line)
    return "\n".join(out) + "\n--- awake ---\n" + nap_prompt(f)


def zoom(f: Folder, block: str) -> str:
    lo, last = (int(x) for x in block.split("-"))
    hi = last + 1
    if lo >= f.T:
        return f"{block} starts beyond the log.\n"
    mid = (lo + hi) // 2
    out = []
    for a, b in ((lo, mid), (mid, hi)):
        if a >= f.T:
            continue
        out.append(f.line(a, b) or f"#{a}-{b - 1} not compressed yet")
    return "\n".join(out) + "\n"


def append(path: str, record: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, record)
        os.fsync(fd)
    finally:
        os.close(fd)


def fixed(text: str, width: int) -> bytes:
    b = text.encode()
    if len(b) > width - 1:
        raise SystemExit("too long")
    return b + b" " * (width - 1 - len(b)) + b"\n"


def note(f: Folder, text: str) -> str:
    date = dt.datetime.now(dt.UTC).date().isoformat()
    append(f.log_path, fixed(f"#{f.T} {date} {text}", LOG_REC))
    f.T += 1
    return f"noted #{f.T - 1}\n" + nap_prompt(f)


def nap(f: Folder, block: str | None, text: str | None) -> str:
    if block is None:
        return nap_prompt(f) or "nothing due\n"
    due = f.pending(limit=1)
    lo, last = (int(x) for x in block.split("-"))
    if not due or due[0] != (lo, last + 1):
        return f"refused: {block} is not due\n"
    os.makedirs(f.tree, exist_ok=True)
    append(os.path.join(f.tree, str(last + 1 - lo)), fixed(text, TREE_REC))
    return f"saved {block}\n" + nap_prompt(f)


def recall(f: Folder, pattern: str) -> str:
    rx = re.compile(pattern, re.IGNORECASE)
    kept: list[str] = []
    kept_bytes = 0
    total = 0
    with open(f.log_path, "rb") as log:
        data = log.read()
    for k in range(0, len(data), LOG_REC):
        line = data[k : k + LOG_REC].decode().rstrip()
        if rx.search(line):
            total += 1
            kept.append(line)
            kept_bytes += len(line.encode()) + 1
            while kept_bytes > PART_CHARS:
                kept_bytes -= len(kept.pop(0).encode()) + 1
    return "\n".join(kept) + f"\n{total} matches\n"


def main(argv: list[str]) -> int:
    f = Folder(argv[0])
    verb, args = argv[1], argv[2:]
    if verb == "wake":
        out = wake(f)
    elif verb == "zoom":
        out = zoom(f, args[0])
    elif verb == "note":
        out = note(f, args[0])
    elif verb == "nap":
        out = nap(f, args[0] if args else None, args[1] if len(args) > 1 else None)
    elif verb == "recall":
        out = recall(f, args[0])
    else:
        raise SystemExit(f"unknown verb {verb}")
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
