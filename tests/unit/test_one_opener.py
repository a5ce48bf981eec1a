"""One opener (docs/DESIGN.md, "Formats"): every SQLite file the package
opens is opened by storage/safeopen.py, which hardens the connection, bounds
every statement and lets the server's shutdown interrupt it; the callers
check the schema through it. Read from the source: any ``sqlite3.connect``
or ``sqlcipher3.connect`` (under any alias, or a ``Connection`` made or
subclassed, or a SQL ``ATTACH`` / ``VACUUM INTO``) anywhere else fails,
but for an in-memory database and the files named in
:data:`NOT_A_USERS_FILE` with the reason."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "stash"
OPENER = "stash/storage/safeopen.py"  # the one module that opens files (moved: name it here)
SQLITE_MODULES = frozenset(
    {"sqlite3", "sqlite3.dbapi2", "sqlcipher3", "sqlcipher3.dbapi2", "pysqlite3", "pysqlite3.dbapi2"}
)
# What opens a file: the function, the class (called, or subclassed and called).
OPENS = frozenset({"connect", "Connection"})
# A statement that opens a file by name: ATTACH [DATABASE] or VACUUM INTO, then the file (a literal, a
# parameter, or the rest of an f-string).
SQL_OPENS = re.compile(r"^\s*(ATTACH(?:\s+DATABASE)?|VACUUM\s+INTO)(?:\s+[?'\":@$]|\s*$)", re.IGNORECASE)
IN_MEMORY = ":memory:"

NOT_A_USERS_FILE: dict[tuple[str, str], str] = {
    (
        "stash/storage/cipher_swap.py",
        "ATTACH",
    ): "the plain copy `stash migrate` has sqlcipher_export write: a file cipher_swap creates empty (O_EXCL) "
    "the moment before, attached to the memory file's connection, which safeopen opened and bounds",
}
"""Each ``(module, what)`` allowed outside :data:`OPENER`, and why the file
it opens is not one a user's bytes could have crafted."""


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Each local name bound by an import to a SQLite module or to its
    ``connect`` / ``Connection``, with the dotted name it stands for."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    out[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _opener(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """``connect`` or ``Connection`` when ``node`` names a SQLite module's."""
    name = _dotted(node, aliases)
    if name is None or "." not in name:
        return None
    module, attr = name.rsplit(".", 1)
    return attr if module in SQLITE_MODULES and attr in OPENS else None


def _in_memory(call: ast.Call) -> bool:
    first = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "database"), None)
    return isinstance(first, ast.Constant) and first.value == IN_MEMORY


def _sql_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    return None


def opens(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` of every place ``source`` opens a SQLite file."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    found: list[tuple[int, str]] = []
    called: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            what = _opener(node.func, aliases)
            if what is not None:
                called.add(id(node.func))
                if not _in_memory(node):
                    found.append((node.lineno, what))
            elif isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) > 1:
                target, attr = node.args[0], node.args[1]
                if (
                    _dotted(target, aliases) in SQLITE_MODULES
                    and isinstance(attr, ast.Constant)
                    and attr.value in OPENS
                ):
                    found.append((node.lineno, str(attr.value)))
        elif isinstance(node, ast.ClassDef):
            found += [(node.lineno, "Connection") for base in node.bases if _opener(base, aliases) == "Connection"]
        text = _sql_text(node)
        if text is not None and SQL_OPENS.match(text):
            found.append((getattr(node, "lineno", 0), text.split()[0].upper()))
    for node in ast.walk(tree):  # connect handed on rather than called (a partial, a factory)
        if (
            isinstance(node, ast.Attribute | ast.Name)
            and id(node) not in called
            and _opener(node, aliases) == "connect"
        ):
            found.append((node.lineno, "connect"))
    return sorted(set(found))


def package_opens() -> dict[tuple[str, str], list[int]]:
    out: dict[tuple[str, str], list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(ROOT).as_posix()
        if module == OPENER:
            continue
        for line, what in opens(path.read_text(encoding="utf-8")):
            out.setdefault((module, what), []).append(line)
    return out


def test_no_file_is_opened_but_by_the_one_opener():
    found = package_opens()
    stray = {
        f"{module}:{lines} ({what})"
        for (module, what), lines in found.items()
        if (module, what) not in NOT_A_USERS_FILE
    }
    assert not stray, f"open them through {OPENER} (or, if not a user's file, name it in NOT_A_USERS_FILE)"
    assert not set(NOT_A_USERS_FILE) - set(found), "an allowance that no longer matches anything: remove it"


def test_the_opener_is_where_it_is_named():
    assert (ROOT / OPENER).is_file()
    assert opens((ROOT / OPENER).read_text(encoding="utf-8")), "the opener opens nothing any more?"


FORBIDDEN = {
    "plain": "import sqlite3\nsqlite3.connect(path)",
    "alias": "import sqlite3 as lite\nlite.connect('keyring.db')",
    "from": "from sqlite3 import connect\nconnect(p)",
    "from alias": "from sqlite3 import connect as c\nc(p, uri=True)",
    "dbapi2": "import sqlite3.dbapi2\nsqlite3.dbapi2.connect(p)",
    "cipher": "import sqlcipher3.dbapi2 as _s\n_s.connect(p, factory=F)",
    "cipher from": "from sqlcipher3 import dbapi2\ndbapi2.connect(p)",
    "class called": "import sqlite3\nsqlite3.Connection(p)",
    "subclass": "import sqlite3\nclass C(sqlite3.Connection):\n    pass",
    "handed on": "import functools, sqlite3\nopen_it = functools.partial(sqlite3.connect, timeout=1)",
    "getattr": "import sqlite3\ngetattr(sqlite3, 'connect')(p)",
    "keyword": "import sqlite3\nsqlite3.connect(database=p)",
    "attach": "conn.execute('ATTACH DATABASE ? AS other', (p,))",
    "attach f-string": "conn.execute(f\"attach '{p}' AS other\")",
    "vacuum into": "conn.execute('VACUUM INTO ?', (p,))",
}
ALLOWED = {
    "in memory": "import sqlite3\nsqlite3.connect(':memory:')",
    "in memory, cipher": "import sqlcipher3.dbapi2 as _s\n_s.connect(':memory:')",
    "annotation": "import sqlite3\ndef f(conn: sqlite3.Connection) -> sqlite3.Connection:\n    return conn",
    "isinstance": "import sqlite3\nisinstance(c, sqlite3.Connection)",
    "errors": "import sqlite3\ntry:\n    pass\nexcept sqlite3.Error:\n    pass",
    "other connect": "import socket\nsocket.create_connection(a)\ns.connect(a)",
    "words": "x = 'attach a capability to a memory; vacuum into nothing'",
}


@pytest.mark.parametrize("source", FORBIDDEN.values(), ids=FORBIDDEN.keys())
def test_the_walk_finds_every_way_to_open_a_file(source: str):
    assert opens(textwrap.dedent(source))


@pytest.mark.parametrize("source", ALLOWED.values(), ids=ALLOWED.keys())
def test_the_walk_passes_what_opens_no_file(source: str):
    assert opens(textwrap.dedent(source)) == []
