"""Opening a user's SQLite file with bounded work, whatever its bytes say.

A user's files may come from anyone who could write the data folder, a
replica or a backup. SQLite runs what a file's schema holds: a view over an
endless ``WITH RECURSIVE`` query named like one of our tables, a trigger, a
virtual table. So before any query of a file's own tables, every opener
(the server, ``stash verify``, ``backup``, ``restore``) calls
:func:`harden` on the connection and then :func:`check_schema`:

* ``trusted_schema = OFF``: functions and virtual tables in the schema run
  only if SQLite marks them innocuous; ``cell_size_check = ON``: a b-tree
  cell that overruns its page is corruption, found before it is followed.
* The schema (``sqlite_master``) is read, under a deadline enforced by a
  progress handler, and compared with what ``schema.sql`` makes for that
  file: no view, no virtual table, no table or index we do not make, and
  every trigger exactly ours (same table, same text). Anything else is
  :class:`ForeignSchema`, a ``sqlite3.DatabaseError`` with SQLite's
  corruption code, so every caller reports it as the damage it is
  (``store.damaged`` on the server; ``stash verify`` fails that user and
  goes on to the next) without running a statement of it.

The expected schema is read from schema.sql by running its sections in an
in-memory database, so it is never a copy: ``keyring.db`` may hold what the
sections ``keyring``, ``keyring_*`` and ``idempotency`` make, ``memory.db``
those of ``memory``, ``memory_*`` and ``idempotency``, ``recall.db`` those
of ``scan_cache``. SQLite's own tables (``sqlite_sequence``, ``sqlite_stat*``,
automatic indexes) and Litestream's (``_litestream_*``) are allowed.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable
from functools import cache, lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .schema import sections

CHECK_SECONDS = 5.0
"""The most the schema check may take: reading sqlite_master of a file the
size of a user's quota is milliseconds; a crafted schema is refused by then."""
PROGRESS_STEPS = 10_000  # virtual machine steps between two looks at the clock
_SQLITE_CORRUPT = 11

_KINDS: dict[str, Callable[[str], bool]] = {
    "keyring.db": lambda name: name in ("keyring", "idempotency") or name.startswith("keyring_"),
    "memory.db": lambda name: name in ("memory", "idempotency") or name.startswith("memory_"),
    "recall.db": lambda name: name in ("scan_cache", "word_cache", "word_tail", "word_segs", "word_tail_segs"),
}


def _any_section(name: str) -> bool:
    return True


class ForeignSchema(sqlite3.DatabaseError):
    """A file whose schema holds something Stash did not make: refused as
    corrupt before anything of it runs."""

    sqlite_errorcode = _SQLITE_CORRUPT
    sqlite_errorname = "SQLITE_CORRUPT"


@lru_cache(maxsize=64)
def _normal(sql: str | None) -> str:
    return re.sub(r"\s+", " ", sql or "").strip()


@cache
def expected(kind: str) -> tuple[frozenset[str], frozenset[str], frozenset[tuple[str, str, str]]]:
    """The tables, indexes and triggers ``(name, table, text)`` that
    schema.sql makes in a file named ``kind`` (any name but the three: all
    of its sections together)."""
    wanted = _KINDS.get(kind, _any_section)
    conn = sqlite3.connect(":memory:")
    try:
        for name, text in sections().items():
            if wanted(name):
                conn.executescript(text)
        rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    finally:
        conn.close()
    tables = frozenset(r[1] for r in rows if r[0] == "table")
    indexes = frozenset(r[1] for r in rows if r[0] == "index")
    triggers = frozenset((r[1], r[2], _normal(r[3])) for r in rows if r[0] == "trigger")
    return tables, indexes, triggers


def harden(conn: Any) -> None:
    """Set what keeps a crafted schema from running code on this connection
    (sqlite3 or sqlcipher3); call it before the first query of the file."""
    conn.execute("PRAGMA trusted_schema = OFF")
    conn.execute("PRAGMA cell_size_check = ON")


def _foreign(kind: str, rows: list[tuple[str, str, str, str | None]]) -> str | None:
    """What in ``rows`` (sqlite_master) Stash did not make, in words that
    quote nothing of the file; None when everything is ours."""
    tables, indexes, triggers = expected(kind)
    for type_, name, table, sql in rows:
        if name.startswith("_litestream_") and type_ in ("table", "index"):
            continue
        if type_ == "view":
            return "a view"
        if type_ == "table":
            if _normal(sql).upper().startswith("CREATE VIRTUAL TABLE"):
                return "a virtual table"
            if name not in tables and not name.startswith("sqlite_"):
                return "a table Stash does not make"
        elif type_ == "index":
            if table not in tables:
                return "an index of a table Stash does not make"
            if name not in indexes and not name.startswith(f"sqlite_autoindex_{table}_"):
                return "an index Stash does not make"
        elif type_ == "trigger":
            if (name, table, _normal(sql)) not in triggers:
                return "a trigger Stash did not make"
        else:
            return "an unknown schema entry"
    return None


def check_schema(conn: Any, kind: str, deadline: float = CHECK_SECONDS) -> None:
    """Refuse the file behind ``conn`` (:class:`ForeignSchema`) unless its
    schema is one schema.sql makes for a file named ``kind``; the read of
    the schema itself is cut off after ``deadline`` seconds."""
    end = time.monotonic() + deadline
    conn.set_progress_handler(lambda: 1 if time.monotonic() > end else 0, PROGRESS_STEPS)
    try:
        rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    except Exception as exc:  # sqlite3's or sqlcipher3's OperationalError
        if "interrupt" in str(exc).lower():
            raise ForeignSchema(f"{kind}'s schema could not be read within {deadline:g} s") from None
        raise
    finally:
        conn.set_progress_handler(None, 0)
    what = _foreign(kind, rows)
    if what is not None:
        raise ForeignSchema(f"{kind} holds {what}; it was not read (the file was crafted or damaged)")


def open_plain(path: Path, *, check: bool = True, read_only: bool = False, timeout: float = 5.0) -> sqlite3.Connection:
    """A plain SQLite connection to ``path`` (autocommit), hardened and,
    with ``check``, its schema checked against the file's name: what the
    operator tools use instead of ``sqlite3.connect``."""
    target = f"file:{quote(Path(path).resolve().as_posix())}?mode=ro" if read_only else str(path)
    conn = sqlite3.connect(target, isolation_level=None, uri=read_only, timeout=timeout)
    try:
        harden(conn)
        if check:
            check_schema(conn, Path(path).name)
    except BaseException:
        conn.close()
        raise
    return conn
