from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections.abc import Callable
from functools import cache, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from .sqlite.schema import sections

try:  # SQLCipher is optional: without it the file is plain SQLite, rows still sealed
    import sqlcipher3.dbapi2 as _sqlcipher
except ImportError:  # pragma: no cover - depends on the platform's wheels
    _sqlcipher = None

CHECK_SECONDS = 5.0
"""The most the schema check may take: reading sqlite_master of a file the
size of a user's quota is milliseconds; a crafted schema is refused by then."""
PROGRESS_STEPS = 10_000  # virtual-machine steps between two calls of a connection's progress handler
STATEMENT_STEPS = 2**30
"""The most virtual-machine steps one statement over a file may run: some
seconds of one core. Counted, not timed, so a loaded machine never cuts a
statement short. Stash's heaviest statement, ``stash migrate``'s
``sqlcipher_export``, ran 800,000 steps over a file of 100,000 memories
(15 MB; ``stash verify`` and ``compact`` 500,000), so about a twentieth of
the bound for a file at the default 1 GiB quota; what runs on past it is a
file that makes SQLite loop."""
_SQLITE_CORRUPT = 11

# One thread at a time opens or closes a SQLCipher connection in this process:
# opens and closes are where concurrent threads deadlocked on SQLite's VFS mutex
# under a newer SQLCipher (bench/HISTORY.md); pyproject.toml pins a build that
# does not, and this lock is the second guard.
SQLCIPHER_OPEN_CLOSE = threading.Lock()

_STOPPING = threading.Event()


def stop_all() -> None:
    """The process is stopping: every statement still running over a file
    opened here ends at its handler's next call (within
    :data:`PROGRESS_STEPS` steps) with ``SQLITE_INTERRUPT``, and so does
    every long one started from now on. The server's shutdown calls it once
    its requests are answered or cut (stash/web/app.py), so a worker thread
    caught in a file cannot keep the process from exiting."""
    _STOPPING.set()


def resume_all() -> None:
    """Undo :func:`stop_all` (a server started again in the same process)."""
    _STOPPING.clear()


def stopping() -> bool:
    return _STOPPING.is_set()


class _Budget:
    """What the statement under way on one connection has spent, in calls of
    its progress handler (:meth:`look`), and the deadline of a schema read."""

    __slots__ = ("deadline", "limit", "spent")

    def __init__(self, limit: int) -> None:
        self.spent = 0
        self.limit = limit
        self.deadline: float | None = None

    def look(self) -> int:
        """The progress handler: non-zero ends the statement (SQLITE_INTERRUPT)."""
        if _STOPPING.is_set():
            return 1
        self.spent += 1
        if self.spent > self.limit:
            return 1
        return 1 if self.deadline is not None and time.monotonic() > self.deadline else 0


if TYPE_CHECKING:  # the mixins below are typed as what they are mixed into
    _ConnectionBase = sqlite3.Connection
    _CursorBase = sqlite3.Cursor
else:
    _ConnectionBase = _CursorBase = object


class _Counted(_ConnectionBase):
    """A connection whose every statement starts with a fresh budget (the
    sqlite3 and sqlcipher3 classes below: their methods are the same)."""

    budget: _Budget
    cursor_class: type[Any]

    def execute(self, *args: Any) -> Any:
        self.budget.spent = 0
        return super().execute(*args)

    def executemany(self, *args: Any) -> Any:
        self.budget.spent = 0
        return super().executemany(*args)

    def executescript(self, *args: Any) -> Any:
        self.budget.spent = 0
        return super().executescript(*args)

    def commit(self) -> None:
        self.budget.spent = 0
        super().commit()

    def rollback(self) -> None:
        self.budget.spent = 0
        super().rollback()

    def cursor(self, factory: Any = None) -> Any:
        return super().cursor(factory or self.cursor_class)


def _budget_of(conn: Any) -> _Budget:
    budget: _Budget = conn.budget
    return budget


class _CountedCursor(_CursorBase):
    def execute(self, *args: Any) -> Any:
        _budget_of(self.connection).spent = 0
        return super().execute(*args)

    def executemany(self, *args: Any) -> Any:
        _budget_of(self.connection).spent = 0
        return super().executemany(*args)


class _PlainCursor(_CountedCursor, sqlite3.Cursor):
    pass


class Plain(_Counted, sqlite3.Connection):
    """A connection opened here to a plain SQLite file; it can carry attributes (files.LIVE)."""

    cursor_class = _PlainCursor


Cipher: type[Any] | None = None
if _sqlcipher is not None:

    class _CipherCursor(_CountedCursor, _sqlcipher.Cursor):  # type: ignore[misc]
        pass

    class Cipher(_Counted, _sqlcipher.Connection):  # type: ignore[no-redef, misc]
        """A connection opened here to a SQLCipher file."""

        cursor_class = _CipherCursor


_KINDS: dict[str, Callable[[str], bool]] = {
    "keyring.db": lambda name: name in ("keyring", "idempotency") or name.startswith("keyring_"),
    "memory.db": lambda name: name in ("memory", "idempotency") or name.startswith("memory_"),
    "recall.db": lambda name: name in ("scan_cache", "word_cache", "word_tail", "word_segs", "word_tail_segs"),
    "oauth.db": lambda name: name == "oauth",
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
    schema.sql makes in a file named ``kind`` (any name but those of _KINDS: all
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
    the schema itself is cut off after ``deadline`` seconds. ``conn`` is one
    this module opened (its budget carries the deadline)."""
    budget: _Budget = conn.budget
    budget.deadline = time.monotonic() + deadline
    try:
        rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    except Exception as exc:  # sqlite3's or sqlcipher3's OperationalError
        if interrupted(exc) and not stopping():
            raise ForeignSchema(f"{kind}'s schema could not be read within its bound") from None
        raise
    finally:
        budget.deadline = None
    what = _foreign(kind, rows)
    if what is not None:
        raise ForeignSchema(f"{kind} holds {what}; it was not read (the file was crafted or damaged)")


_SQLITE_INTERRUPT = 9


def interrupted(exc: BaseException) -> bool:
    """A statement ended by a progress handler (this module's: its bound, or :func:`stop_all`)."""
    return (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == _SQLITE_INTERRUPT


def _bound(conn: Any, steps: int) -> None:
    conn.budget = _Budget(max(1, steps // PROGRESS_STEPS))
    conn.set_progress_handler(conn.budget.look, PROGRESS_STEPS)


def open_file(
    target: str | Path,
    *,
    cipher: str = "none",
    key: bytes | None = None,
    page: int | None = None,
    uri: bool = False,
    timeout: float = 5.0,
    check_same_thread: bool = True,
    steps: int = STATEMENT_STEPS,
) -> sqlite3.Connection:
    """A connection to the SQLite file ``target`` (a path, or with ``uri`` a
    ``file:`` URI), in autocommit mode (transactions are explicit), hardened
    (:func:`harden`) and bounded: each statement at most ``steps`` steps,
    none once the process is stopping. A SQLCipher file (``cipher``) is
    opened with ``key`` and read with pages of ``page`` bytes (not stored in
    its encrypted header, so every open must say it: a wrong size, like an
    edited key ring's, fails the first page's HMAC and the file is refused as
    damaged); a plain file is made with pages of ``page`` bytes if it is new.
    Before the first query of the file's own tables the caller checks its
    schema (:func:`check_schema`; :func:`open_plain` does both)."""
    conn: Any
    if cipher == "sqlcipher":
        if _sqlcipher is None:
            raise RuntimeError("this store needs SQLCipher, which is not installed here")
        if key is None:
            raise ValueError("a SQLCipher file needs its key")
        with SQLCIPHER_OPEN_CLOSE:
            conn = _sqlcipher.connect(
                str(target),
                isolation_level=None,
                timeout=timeout,
                check_same_thread=check_same_thread,
                uri=uri,
                factory=Cipher,
            )
    else:
        conn = sqlite3.connect(
            str(target),
            isolation_level=None,
            timeout=timeout,
            check_same_thread=check_same_thread,
            uri=uri,
            factory=Plain,
        )
    try:
        _bound(conn, steps)
        if cipher == "sqlcipher":
            # A file that fails to open is reported to the caller as damage; the
            # library's own stderr lines about it would only be noise in the log.
            conn.execute("PRAGMA cipher_log_level = NONE")
            conn.execute(f"PRAGMA key = \"x'{key.hex()}'\"")  # type: ignore[union-attr]  # checked above
            if page is not None:
                conn.execute(f"PRAGMA cipher_page_size = {int(page)}")
        elif page is not None:
            conn.execute(f"PRAGMA page_size = {int(page)}")  # takes effect when the file is created
        harden(conn)
    except BaseException:
        close(conn)
        raise
    out: sqlite3.Connection = conn
    return out


def close(conn: Any) -> None:
    """Close a connection made here (a SQLCipher one under :data:`SQLCIPHER_OPEN_CLOSE`)."""
    if Cipher is not None and isinstance(conn, Cipher):
        with SQLCIPHER_OPEN_CLOSE:
            conn.close()
    else:
        conn.close()


def open_plain(
    path: Path, *, check: bool = True, read_only: bool = False, timeout: float = 5.0, check_same_thread: bool = True
) -> sqlite3.Connection:
    """A plain SQLite connection to ``path`` (:func:`open_file`) and, with
    ``check``, its schema checked against the file's name: what the
    operator tools, the quota check and the recall cache open files with."""
    target = f"file:{quote(Path(path).resolve().as_posix())}?mode=ro" if read_only else str(path)
    conn = open_file(target, uri=read_only, timeout=timeout, check_same_thread=check_same_thread)
    try:
        if check:
            check_schema(conn, Path(path).name)
    except BaseException:
        conn.close()
        raise
    return conn
