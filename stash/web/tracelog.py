"""What the server logs of a failure it did not expect: where it happened,
never what it held.

A 500's log line names the exception's type and each frame of its traceback
as ``file:line function``, innermost last: enough to find the bug, and
nothing a memory's text, a token or a key could ride in on (an exception's
message and a frame's values are never written; file names are shown from
the package folder down, never as this machine's paths). ``STASH_DEBUG`` set
to anything but empty, ``0`` or ``off`` in the server's environment (a
developer's own machine: CONTRIBUTING, "Debugging") logs the whole trace
instead, values and all."""

from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import PurePath

DEBUG_ENV = "STASH_DEBUG"
_CHAIN_LIMIT = 3  # exceptions followed along __cause__ / __context__


def debugging(environ: os._Environ[str] | dict[str, str] = os.environ) -> bool:
    return environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "off", "no", "false")


def shown_file(filename: str) -> str:
    """A frame's file from the package folder down: ``stash/web/app.py``,
    ``starlette/routing.py``; never the folders above (this machine's)."""
    parts = PurePath(filename).parts
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(anchor) :])
    if "stash" in parts:
        return "/".join(parts[len(parts) - 1 - parts[::-1].index("stash") :])
    return parts[-1] if parts else "?"


def frames(exc: BaseException) -> str:
    """The failure as one line: ``KeyError at stash/web/dispatch.py:12 f < stash/service/memory.py:40 g``
    (outermost first), each earlier exception of the chain after ``; during``."""
    out: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(out) < _CHAIN_LIMIT:
        seen.add(id(current))
        where = " > ".join(
            f"{shown_file(f.filename)}:{f.lineno} {f.name}" for f in traceback.extract_tb(current.__traceback__)
        )
        out.append(f"{type(current).__name__} at {where or '?'}")
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return "; during ".join(out)


def whole(exc: BaseException) -> str:
    """The whole trace, messages and values included: for STASH_DEBUG only."""
    return "".join(traceback.format_exception(exc)).rstrip("\n")


class _Withheld(logging.Filter):
    """Keeps of a library's log record its logger, its level and, for an
    exception, :func:`frames`: never its message, which may carry what a
    request sent (a header, a body's text)."""

    def filter(self, record: logging.LogRecord) -> bool:
        shown = f"{record.levelname.lower()} from {record.name} (its message withheld)"
        if record.exc_info and record.exc_info[1] is not None:
            shown += ": " + frames(record.exc_info[1])
        record.msg, record.args, record.exc_info, record.exc_text = shown, (), None, None
        return True


def withhold(name: str) -> None:
    """Log what library ``name`` logs (its warnings and worse) as :class:`_Withheld`
    says, through a handler of its own; under STASH_DEBUG, all it logs, whole."""
    lib = logging.getLogger(name)
    if any(isinstance(h, _LibraryHandler) for h in lib.handlers):
        return
    handler = _LibraryHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    if not debugging():
        lib.setLevel(logging.WARNING)
        handler.addFilter(_Withheld())
    lib.addHandler(handler)
    lib.propagate = False


class _LibraryHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`withhold` gives a library's logger."""
