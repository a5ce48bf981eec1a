"""Where each memory of an identity lives on disk (docs/DESIGN.md, "Memories").

Memory ``main`` is the user's folder itself, exactly as every earlier release
wrote it, so nothing moves and every token keeps working bound to it. Memory
``<name>`` is the same three files (key ring, memory file, recall cache) in
``users/<user_id>/m/<name>/``, under its own master key and epochs.

Every multi-step change of the set of memories is made by one ``rename``:
a new memory (or a fork) is built whole in a hidden staging folder and then
renamed to its name. A delete's one step is in main's key ring instead: the
memory's salt, name and capabilities' tags leave it in one transaction (from
that instant no token opens the memory through a server, and the owner token
no copy of its files), then its folder is renamed away and shredded. A crash leaves at most a hidden folder
or a folder no salt names, which :func:`sweep` finishes (a staged one
removed, a retired or unsalted one shredded); the set of memories itself is
never half-changed.

Ids: a grant of the memory numbered ``n`` (main is 0) has an id in
``[n * GRANT_ID_SPAN, (n + 1) * GRANT_ID_SPAN)``, append capabilities from
``APPEND_ID_OFFSET`` up within it, so ``DELETE /grants/{id}`` names one
grant of one memory, and a memory's number is never reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import sqlite3
import time
from pathlib import Path

from ...crypto import owner_seal
from ...crypto.owner_seal import OwnerKeys
from .. import formats, safeopen
from ..keyring import Keyring, owner_handover
from ..layout import UserFiles
from ..private_files import fsync_path, overwrite_with_zeros, private_folder
from ..sqlite.transactions import write_transaction

MAIN = "main"
SUBFOLDER = "m"
NAME_PATTERN = r"[a-z0-9][a-z0-9._-]{0,63}"
_NAME = re.compile(NAME_PATTERN)
GRANT_ID_SPAN = 1_000_000
APPEND_ID_OFFSET = 500_000
COUNTER = "memories_made"  # main key ring: how many memories were ever numbered
NUMBER = "memory_number"  # a memory's key ring: its number
CREATED = "memory_created"  # a memory's key ring: when it was made (main: its owner grant's time)
_STAGED = ".new-"
_RETIRED = ".gone-"
SECTION = "keyring_memories"
# A memory's key ring is made with pages of this size: it holds a handful of
# grants, so 2 KiB pages keep an extra empty memory under 32 KiB on disk
# (its four pages are 8 KiB; the empty memory file's two 4 KiB pages are 8 KiB).
RING_PAGE_BYTES = 2048


RESERVED = frozenset({"erase"})
"""Names no memory may take: a segment of an owner route (POST /memories/erase), which a memory of that name
would shadow."""


def valid_name(name: object) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None and name not in RESERVED


def store_id(user_id: str, name: str) -> str:
    """The id every row of memory ``name`` is bound to (associated data, the
    files' ``user_id`` records): the user id for ``main``, as before, and
    ``<user_id>/m/<name>`` for another, so a row or a whole file moved from
    one memory to another fails to open even before the keys differ."""
    return user_id if name == MAIN else f"{user_id}/{SUBFOLDER}/{name}"


class MemoryFiles(UserFiles):
    """The folder of one memory of one user."""

    def __init__(self, data_dir: Path, user_id: str, name: str = MAIN) -> None:
        super().__init__(data_dir, user_id)
        self.user_folder = self.folder
        self.name = name
        if name != MAIN:
            self.at(self.folder / SUBFOLDER / name)

    def at(self, folder: Path) -> None:
        """Point at ``folder`` (a staging folder while a memory is built)."""
        self.folder = folder
        self.keyring = folder / "keyring.db"
        self.memory = folder / "memory.db"

    def exists(self) -> bool:
        return self.keyring.is_file() if self.name != MAIN else super().exists()


def names(data_dir: Path, user_id: str) -> list[str]:
    """Every memory of the user: ``main`` and each published sub-folder."""
    parent = UserFiles(data_dir, user_id).folder / SUBFOLDER
    try:
        entries = os.listdir(parent)
    except OSError:
        entries = []
    return [MAIN, *sorted(n for n in entries if valid_name(n) and (parent / n / "keyring.db").is_file())]


def exists(data_dir: Path, user_id: str, name: str) -> bool:
    return valid_name(name) and MemoryFiles(data_dir, user_id, name).exists()


def staging(data_dir: Path, user_id: str, name: str) -> MemoryFiles:
    """A fresh hidden folder to build memory ``name`` in, 0700."""
    files = MemoryFiles(data_dir, user_id, name)
    parent = files.user_folder / SUBFOLDER
    private_folder(parent)
    folder = parent / f"{_STAGED}{name}-{secrets.token_hex(4)}"
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o700)
    files.at(folder)
    return files


def publish(staged: MemoryFiles) -> bool:
    """Give the staged folder its name, in one rename; False when a memory of
    that name appeared meanwhile (the staged one is then removed)."""
    final = staged.user_folder / SUBFOLDER / staged.name
    try:
        os.rename(staged.folder, final)  # refused over a non-empty folder
    except OSError:
        shutil.rmtree(staged.folder, ignore_errors=True)
        return False
    fsync_path(final.parent)  # the rename is durable once its folder is flushed
    staged.at(final)
    return True


def retire(files: MemoryFiles, number: int) -> Path:
    """Take memory ``files.name`` away in one rename (from here on it is not
    there for any request), and return where it went, to be shredded. The
    hidden name carries the memory's ``number``, so a sweep after a crash
    destroys its salt and name in main's key ring too (:func:`sweep`)."""
    gone = files.user_folder / SUBFOLDER / f"{_RETIRED}{max(number, 0)}-{secrets.token_hex(8)}"
    os.rename(files.folder, gone)
    fsync_path(gone.parent)
    return gone


def overwrite_keyrings(user_folder: Path) -> None:
    """Overwrite with zeros the key ring of every memory of a user (with its
    WAL and index), before the user's folder is removed: each memory's
    wrapped keys and boxes then leave no copy in the file's blocks."""
    for path in sorted(user_folder.rglob("keyring.db*")):
        if path.is_file() and not path.is_symlink():
            overwrite_with_zeros(path)


def shred(folder: Path) -> None:
    """Overwrite every file with zeros (the key ring's wrapped keys and boxes
    first), then remove the folder: its keys are gone from the files, and
    with them everything sealed under them. A folder already gone (a sweep
    of another request shredded it first) is done."""
    try:
        paths = sorted(folder.iterdir(), key=lambda p: (not p.name.startswith("keyring"), p.name))
    except FileNotFoundError:
        return
    for path in paths:
        if path.is_file():
            try:
                overwrite_with_zeros(path)
            except OSError:
                pass
    shutil.rmtree(folder, ignore_errors=True)


# A staged folder younger than this may be a create or fork still building
# (another request, another worker): a sweep leaves it be.
STAGED_FOR_S = 3600.0


def _older_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime > seconds
    except OSError:
        return False


def sweep(data_dir: Path, user_id: str, main: sqlite3.Connection | None = None) -> None:
    """Finish what a crash left: remove staged folders an hour old (a younger
    one may be a create still building), shred retired ones —
    with ``main`` (main's key ring), a retired memory's capabilities' tags,
    salt and name there first, as a folder of a release that renamed before
    it ended the salt may be — and, with ``main``, a published folder that
    main's key ring does not name: shredded when no salt is kept for its
    number (a delete cut after its commit, :func:`end`), named when one is (a
    create cut between its rename and its naming)."""
    parent = UserFiles(data_dir, user_id).folder / SUBFOLDER
    try:
        entries = os.listdir(parent)
    except OSError:
        return
    known = set(named(main)) if main is not None else set()
    for n in entries:
        if main is not None and valid_name(n) and n not in known:
            kept = _number_at(parent / n / "keyring.db")
            if kept is None:
                continue  # not a memory's folder Stash can read: verify names it
            if salt_of(main, kept) is None:
                try:
                    shred(retire(MemoryFiles(data_dir, user_id, n), kept))
                except FileNotFoundError:
                    pass  # the delete that ended its salt (another request) renamed it away first
            else:
                name_memory(main, kept, n)
        elif n.startswith(_RETIRED):
            number = n[len(_RETIRED) :].split("-", 1)[0]
            if main is not None and number.isdigit() and int(number) > 0:
                gone = name_of(main, int(number))
                if gone is not None:
                    drop_tags(main, memory=gone)
                drop_salt(main, int(number))
            shred(parent / n)
        elif n.startswith(_STAGED) and _older_than(parent / n, STAGED_FOR_S):
            shutil.rmtree(parent / n, ignore_errors=True)


# ---------------------------------------------------------------- main's key ring


def _has(conn: sqlite3.Connection, table: str) -> bool:
    return (
        conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone() is not None
    )


def ensure(conn: sqlite3.Connection, table: str) -> None:
    if not _has(conn, table):
        formats.make_on_use(conn, SECTION, table)


def home_of(conn: sqlite3.Connection, tag: bytes) -> str | None:
    """The memory a capability not in main's key ring is bound to, by its tag."""
    if not _has(conn, "memory_tags"):
        return None
    row = conn.execute("SELECT memory FROM memory_tags WHERE tag = ?", (tag,)).fetchone()
    return None if row is None else str(row[0])


def put_tag(conn: sqlite3.Connection, tag: bytes, name: str, expires: str | None = None) -> None:
    with write_transaction(conn):
        ensure(conn, "memory_tags")
        conn.execute("INSERT OR REPLACE INTO memory_tags(tag, memory) VALUES (?, ?)", (tag, name))
        if expires is not None:
            ensure(conn, "memory_tag_terms")
            conn.execute("INSERT OR REPLACE INTO memory_tag_terms(tag, expires) VALUES (?, ?)", (tag, expires))


def drop_tags(conn: sqlite3.Connection, *, tag: bytes | None = None, memory: str | None = None) -> None:
    if not _has(conn, "memory_tags"):
        return
    with write_transaction(conn):
        if tag is not None:
            conn.execute("DELETE FROM memory_tags WHERE tag = ?", (tag,))
        if memory is not None:
            conn.execute("DELETE FROM memory_tags WHERE memory = ?", (memory,))
        if _has(conn, "memory_tag_terms"):
            conn.execute("DELETE FROM memory_tag_terms WHERE tag NOT IN (SELECT tag FROM memory_tags)")


def other_tags(conn: sqlite3.Connection) -> frozenset[bytes]:
    """The tags of every live capability bound to a memory other than main."""
    if not _has(conn, "memory_tags"):
        return frozenset()
    return frozenset(bytes(r[0]) for r in conn.execute("SELECT tag FROM memory_tags"))


def tag_expiries(conn: sqlite3.Connection) -> dict[bytes, str]:
    """The expiry of every live capability main's key ring knows that has
    one: main's own (read, full, append) and those bound to other memories."""
    out: dict[bytes, str] = {}
    if _has(conn, "grant_notes"):
        for table in ("grants", "append_grants"):
            if _has(conn, table):
                out.update(
                    (bytes(t), str(e))
                    for t, e in conn.execute(
                        f"SELECT g.tag, n.expires FROM {table} g JOIN grant_notes n ON n.grant_id = g.id "
                        "WHERE g.tag IS NOT NULL AND n.expires IS NOT NULL"
                    )
                )
    if _has(conn, "memory_tag_terms"):
        out.update((bytes(t), str(e)) for t, e in conn.execute("SELECT tag, expires FROM memory_tag_terms"))
    return out


OWNER_GRANTS = "owner_grants"  # another memory's key ring: {enrolment id: main's owner grant id}, as JSON


def note_owner(conn: sqlite3.Connection, enrolment: int, owner: int) -> None:
    """Record, in another memory's key ring, that its owner enrolment
    ``enrolment`` is main's owner capability ``owner``: so its audit events
    name the capability GET /grants lists (ids, in clear, as the grants')."""
    row = conn.execute("SELECT value FROM keyring_meta WHERE name = ?", (OWNER_GRANTS,)).fetchone()
    known = json.loads(row[0]) if row else {}
    known[str(enrolment)] = owner
    conn.execute(
        "INSERT INTO keyring_meta(name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = excluded.value",
        (OWNER_GRANTS, json.dumps(known, sort_keys=True)),
    )


def owners_of(conn: sqlite3.Connection) -> dict[int, int]:
    """:func:`note_owner`'s records: enrolment id to main's owner grant id
    (empty for a memory made before they were kept, or when unreadable)."""
    row = conn.execute("SELECT value FROM keyring_meta WHERE name = ?", (OWNER_GRANTS,)).fetchone()
    try:
        known = json.loads(row[0]) if row else {}
        return {int(k): int(v) for k, v in known.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


def next_number(conn: sqlite3.Connection) -> int:
    """Number the next memory (main is 0), never reusing one."""
    with write_transaction(conn):
        row = conn.execute("SELECT value FROM keyring_meta WHERE name = ?", (COUNTER,)).fetchone()
        n = (int(row[0]) if row else 0) + 1
        conn.execute(
            "INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            (COUNTER, str(n)),
        )
    return n


SALT_BYTES = 32


def new_salt(conn: sqlite3.Connection, number: int) -> bytes:
    """Draw and keep memory ``number``'s salt in main's key ring."""
    salt = secrets.token_bytes(SALT_BYTES)
    with write_transaction(conn):
        ensure(conn, "memory_salts")
        conn.execute("INSERT OR REPLACE INTO memory_salts(number, salt, name) VALUES (?, ?, NULL)", (number, salt))
    return salt


def name_memory(conn: sqlite3.Connection, number: int, name: str) -> None:
    """Record ``name`` beside memory ``number``'s salt in main's key ring
    (schema.sql, "memory_salts"), once it is published: a create cut by a
    crash before its rename leaves a salt that names nothing, never a name a
    restore would look for. Also what names a memory whose naming a crash
    cut (the owner's next listing)."""
    if number <= 0 or salt_of(conn, number) is None or name_of(conn, number) == name:
        return
    with write_transaction(conn):
        conn.execute("UPDATE memory_salts SET name = ? WHERE number = ?", (name, number))


def name_of(conn: sqlite3.Connection, number: int) -> str | None:
    if not _has(conn, "memory_salts"):
        return None
    row = conn.execute("SELECT name FROM memory_salts WHERE number = ?", (number,)).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def named(conn: sqlite3.Connection) -> list[str]:
    """The memories main's key ring names, main left out: each with a salt
    (so not deleted), each a valid name (a crafted row is passed over), once
    each, by number."""
    return list(numbered(conn))


def numbered(conn: sqlite3.Connection) -> dict[str, int]:
    """:func:`named`, each with its number (the newest, should a crash have
    left an older row under the same name)."""
    if not _has(conn, "memory_salts"):
        return {}
    rows = conn.execute(
        "SELECT name, number, length(salt) FROM memory_salts WHERE name IS NOT NULL ORDER BY number"
    ).fetchall()
    out: dict[str, int] = {}
    for name, number, salt_bytes in rows:
        if valid_name(name) and name != MAIN and salt_bytes == SALT_BYTES:
            out[name] = int(number)
    return out


def salt_of(conn: sqlite3.Connection, number: int) -> bytes | None:
    if number <= 0 or not _has(conn, "memory_salts"):
        return None
    row = conn.execute("SELECT salt FROM memory_salts WHERE number = ?", (number,)).fetchone()
    return None if row is None or len(row[0]) != SALT_BYTES else bytes(row[0])


def salted(conn: sqlite3.Connection) -> list[tuple[int, bytes, str | None]]:
    """Every memory main's key ring keeps a salt for, main left out: its
    number, salt and name (None until it is published), by number; what a
    rotation seals its new owner's way into (service/handover.py)."""
    if not _has(conn, "memory_salts"):
        return []
    return [
        (int(n), bytes(salt), None if name is None or not valid_name(name) else str(name))
        for n, salt, name in conn.execute(
            "SELECT number, salt, name FROM memory_salts WHERE number > 0 ORDER BY number"
        )
        if isinstance(salt, bytes) and len(salt) == SALT_BYTES
    ]


def drop_salt(conn: sqlite3.Connection, number: int) -> None:
    """Destroy memory ``number``'s salt and name, one row (secure_delete
    overwrites its cell; the caller flushes the WAL)."""
    if not _has(conn, "memory_salts"):
        return
    with write_transaction(conn):
        conn.execute("DELETE FROM memory_salts WHERE number = ?", (number,))


def end(conn: sqlite3.Connection, number: int, name: str) -> None:
    """A delete's one commit, in main's key ring: memory ``number``'s salt
    and name, and the lookup tags of its capabilities, in one transaction.
    The owner reaches a memory only through its salt and every other
    capability only through its tag, so from the commit nothing opens it,
    whatever is left of its files (the caller flushes the WAL). A rotation's
    row for it (storage/keyring/owner_handover.py) goes too."""
    with write_transaction(conn):
        drop_salt(conn, number)
        drop_tags(conn, memory=name)
        owner_handover.drop(conn, number)


def _number_at(keyring: Path) -> int | None:
    """The number a memory's key ring records, read without a key; None
    when the file does not open as one."""
    try:
        conn = safeopen.open_plain(keyring, read_only=True)
    except (sqlite3.Error, safeopen.ForeignSchema, OSError):
        return None
    try:
        number = number_of(conn)
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return number if number > 0 else None


def owner_secret(secret: bytes, salt: bytes) -> bytes:
    """The secret the owner token is enrolled under in the memory whose salt
    is ``salt``: BLAKE2b keyed by the salt, so it exists only while both the
    token and main's key ring's salt do (schema.sql, "memory_salts")."""
    return hashlib.blake2b(secret, key=salt, digest_size=32, person=b"stash.mem.owner").digest()


def number_of(conn: sqlite3.Connection) -> int:
    """This memory's number, from its key ring (main's has none: 0)."""
    row = conn.execute("SELECT value FROM keyring_meta WHERE name = ?", (NUMBER,)).fetchone()
    try:
        return int(row[0]) if row else 0
    except ValueError:
        return -1


LAST_WRITE = "last_write"  # key ring meta: the day of the memory's last write, hex, sealed to its owner
_WRITTEN: dict[str, str] = {}


def note_write_day(ring: Keyring, day: str) -> None:
    """Record ``day`` as the memory's last write, sealed to its owner key
    (so a thief of the key ring does not learn when it was last used):
    written once a day per process and key ring, best effort like the key
    ring's other copies (a full disk must not refuse a write that committed)."""
    path = str(ring.conn.execute("PRAGMA database_list").fetchone()[2])
    if _WRITTEN.get(path) == day:
        return
    public = ring.owner_public()
    if public is None:
        return
    value = owner_seal.seal(ring.user_id, public, LAST_WRITE, day.encode()).hex()
    try:
        with write_transaction(ring.conn):
            ring.conn.execute(
                "INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                (LAST_WRITE, value),
            )
    except (sqlite3.Error, OSError):
        return
    if len(_WRITTEN) > 100_000:
        _WRITTEN.clear()
    _WRITTEN[path] = day


def write_day(ring: Keyring, owner: OwnerKeys | None) -> str | None:
    """The memory's last write day, opened with its owner keys (None: not recorded, or no keys)."""
    text = ring.meta(LAST_WRITE)
    if text is None or owner is None:
        return None
    try:
        return owner.open(bytes.fromhex(text), LAST_WRITE).decode()
    except (ValueError, UnicodeDecodeError):
        return None
