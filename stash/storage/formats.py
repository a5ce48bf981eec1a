"""Every on-disk format a user's two files have had, in order, with how each
is told on disk and the reader or upgrade step that handles it
(docs/DESIGN.md, "Formats").

This registry is the one place that knows the order of the formats: the key
ring's and the memory file's format marks, the upgrade steps that move a file
from one mark to the next (:func:`upgrades`, :func:`upgrade_of`), the page
sizes and row lengths each release wrote, and which tables a file makes on
first use (:func:`make_on_use`). It reads files (``stash verify`` reports a
user's formats from it, :func:`formats_of`) and never writes one except
through those steps.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache

from ..crypto import aead
from .sqlite.schema import sections

# The page size of every file this release creates. An empty identity is a
# handful of pages (schema.sql, "Layout on disk"), so the page is what its
# size is counted in: 4 KiB, the filesystem's block, not the 16 KiB of
# earlier releases (bench/pages.py weighs the two).
PAGE_BYTES = 4096
# The page size of every file made before 4 KiB pages. A plain SQLite file
# records its own page size in its header, but a SQLCipher file does not (its
# header is encrypted too), so an open must be told: the key ring says which
# (Keyring.memory_page_bytes), and a key ring that does not say is older than
# the change, so its memory file has these.
LEGACY_PAGE_BYTES = 16384

KEY_RING = "key ring"
MEMORY_FILE = "memory file"
MEMORY_PAGES = "memory_page_bytes"  # the key ring's record of the memory file's page size
RELEASES = ("before 0.1.0", "0.1.0", "0.2.0", "0.3.0", "0.4.0", "unreleased")

# A memory's plaintext: 2-byte length + "YYYY-MM-DD " + up to 280 bytes, padded,
# then the writer (297 bytes at most). Rows of 0.3.0 and 0.4.0 are all 312
# bytes, of earlier releases 320; since "rows in buckets" each is padded to its
# bucket (:func:`bucket`), 312 the largest. Every length opens.
MEMORY_PLAINTEXT_BYTES = 312
OLDER_MEMORY_PLAINTEXT_BYTES = 320
SUMMARY_PLAINTEXT_BYTES = 288
SUMMARY_VERSION_BYTES = 8  # a summary's plaintext starts with the state version it was written at
BUCKET_BYTES = 32
"""What a sealed log row's or summary's size shows of its text: its padded
plaintext is the smallest multiple of this that holds it, up to the format's
largest (SECURITY.md, "What a replicated store shows")."""
SHORT_ROW_OVERHEAD = aead.OVERHEAD + 1
"""What a one-size memory row stored short adds to the bytes it keeps: its
first byte (which full length it stands for), nonce and tag
(memfile/short_rows.py). Kept ``32·k - 4`` bytes and the last 4, it is
``32·k + 41`` bytes long, a length no full row has."""
BUCKETED_MARK = 0xFFFF
"""The first two bytes of a bucketed summary's version field: a version of
a summary padded to one size never reaches 2**48, so a release that knows
only those reads a bucketed summary as unversioned, whose length field this
makes impossible, and refuses it as damage instead of serving it wrongly."""


def bucket(n: int, largest: int) -> int:
    """The padded length of a plaintext of ``n`` bytes: ``n`` rounded up to
    a multiple of :data:`BUCKET_BYTES`, at most ``largest`` (which holds
    every plaintext the format allows)."""
    if n > largest:
        raise ValueError(f"a plaintext of {n} bytes does not fit {largest}")
    return min(-(-n // BUCKET_BYTES) * BUCKET_BYTES, largest)


def buckets(largest: int) -> tuple[int, ...]:
    """Every padded length :func:`bucket` gives below ``largest``, and it."""
    return tuple(range(BUCKET_BYTES, largest, BUCKET_BYTES)) + (largest,)


ROW_BUCKETS = buckets(MEMORY_PLAINTEXT_BYTES)  # a log row's plaintext lengths
SUMMARY_BUCKETS = tuple(SUMMARY_VERSION_BYTES + n for n in buckets(SUMMARY_PLAINTEXT_BYTES))  # a summary's
# Each layout is told by its plaintext's length alone: an unversioned summary
# (288) is no bucketed one, and no bucket is a row length of 0.1.0 (320).
assert SUMMARY_PLAINTEXT_BYTES not in SUMMARY_BUCKETS and OLDER_MEMORY_PLAINTEXT_BYTES not in ROW_BUCKETS


@dataclass(frozen=True)
class OnDisk:
    """What a user's files show of their format, read without changing them
    (:func:`read_key_ring`, :func:`read_memory_file`). A field is None when it
    cannot be read: an encrypted memory file's contents without a key."""

    keyring_meta: Mapping[str, str]
    keyring_columns: frozenset[str]
    keyring_tables: frozenset[str]
    cipher: str
    memory_pages: int
    memory_meta: Mapping[str, str] | None = None
    memory_tables: frozenset[str] | None = None
    row_bytes: frozenset[int] | None = None  # sealed log row lengths
    summary_bytes: frozenset[int] | None = None  # sealed summary lengths


@dataclass(frozen=True)
class Format:
    """One format of one file: ``name`` as ``stash verify`` prints it,
    ``what`` it is, how it is ``recognised`` on disk, the ``handler`` (a
    qualified name under ``stash.``) that reads or upgrades it, the
    ``release`` whose stores first had it, and ``shows``: whether a user's
    files are at it (None: not told without the key). ``mark`` is the file's
    ``format`` meta value at this format; ``upgrade`` names the method of the
    file's class that brings a file at this mark to the next one."""

    file: str
    name: str
    what: str
    recognised: str
    handler: str
    release: str
    shows: Callable[[OnDisk], bool | None]
    mark: str | None = None
    upgrade: str | None = None


def _memory(test: Callable[[Mapping[str, str]], bool]) -> Callable[[OnDisk], bool | None]:
    return lambda d: None if d.memory_meta is None else test(d.memory_meta)


def _sealed(field: str, plain: int) -> Callable[[OnDisk], bool | None]:
    def shows(d: OnDisk) -> bool | None:
        lengths: frozenset[int] | None = getattr(d, field)
        return None if lengths is None else plain + aead.OVERHEAD in lengths

    return shows


def _lacks_one(made_on_use: str) -> Callable[[OnDisk], bool | None]:
    """A store made since tables are made on first use (its key ring records
    the page size, which came with it) that lacks a table of section
    ``made_on_use``; one holding them all cannot be told from an older one,
    and an older key ring lacks the tables its release did not have."""

    def shows(d: OnDisk) -> bool | None:
        tables = d.keyring_tables if made_on_use == "keyring_on_use" else d.memory_tables
        if tables is None or MEMORY_PAGES not in d.keyring_meta:
            return None
        return not on_use_tables(made_on_use) <= tables or None

    return shows


LOG_TABLES = frozenset({"log", "memory_keys", "summaries"})  # made on use since "log made on use"


def _lacks_log_tables(d: OnDisk) -> bool | None:
    """A memory file made since the log, its key chunks and its summaries
    are made on use, lacking one of them (one never written to, or never
    napped); one holding all three cannot be told from an older one."""
    if d.memory_tables is None:
        return None
    return not LOG_TABLES <= d.memory_tables or None


def _bucketed(d: OnDisk) -> bool | None:
    """A memory file holding a log row or a summary padded to a bucket below
    the largest; one whose rows all fill the largest cannot be told from an
    older one (nor need it be: they open alike)."""
    if d.row_bytes is None or d.summary_bytes is None:
        return None
    rows = {n + aead.OVERHEAD for n in ROW_BUCKETS[:-1]}
    summaries = {n + aead.OVERHEAD for n in SUMMARY_BUCKETS[:-1]}
    return bool(rows & d.row_bytes or summaries & d.summary_bytes) or None


def _short(d: OnDisk) -> bool | None:
    """A memory file holding a row stored short (memfile/short_rows.py): its
    length is 32·k + 41, which no full row has."""
    if d.row_bytes is None:
        return None
    return any(n % BUCKET_BYTES == SHORT_ROW_OVERHEAD % BUCKET_BYTES for n in d.row_bytes) or None


def _pages(n: int, release: str, recognised: str) -> Format:
    return Format(
        MEMORY_FILE,
        f"{n // 1024} KiB pages",
        f"pages of {n} bytes",
        f"PRAGMA page_size ({recognised})",
        "storage.keyring.Keyring.memory_page_bytes",
        release,
        lambda d: d.memory_pages == n,
    )


def _rows(plain: int, handler: str, release: str) -> Format:
    return Format(
        MEMORY_FILE,
        f"rows {plain} B",
        f"memory plaintexts of {plain} bytes",
        f"sealed log rows of {plain + aead.OVERHEAD} bytes",
        handler,
        release,
        _sealed("row_bytes", plain),
    )


KEY_RING_FORMATS = (
    Format(
        KEY_RING,
        "format 1",
        "each capability's master key wrapped under its token, no key epochs",
        "keyring_meta 'format' is 1; grants has no pub and box columns",
        "storage.keyring.Keyring._add_epoch_columns",
        "0.1.0",
        lambda d: d.keyring_meta.get("format") == "1" or "pub" not in d.keyring_columns,
        mark="1",
        upgrade="_add_epoch_columns",
    ),
    Format(
        KEY_RING,
        "format 2 (key epochs)",
        "each capability opens the key chain sealed to it (pub, box); grants move one by one when "
        "each token is next used",
        "keyring_meta 'format' is 2; grants has pub and box columns",
        "storage.keyring.Keyring.move_grant",
        "0.2.0",
        lambda d: d.keyring_meta.get("format") == "2" and "pub" in d.keyring_columns,
        mark="2",
    ),
    Format(
        KEY_RING,
        "memory page size recorded",
        "the key ring records the memory file's page size",
        "keyring_meta 'memory_page_bytes' (absent: the memory file has 16 KiB pages)",
        "storage.keyring.Keyring.memory_page_bytes",
        "0.3.0",
        lambda d: MEMORY_PAGES in d.keyring_meta,
    ),
    Format(
        KEY_RING,
        "tables made on use",
        "grant_notes and audit are made by their first row",
        "a table of schema.sql's keyring_on_use section is absent",
        "storage.formats.make_on_use",
        "0.3.0",
        _lacks_one("keyring_on_use"),
    ),
    Format(
        KEY_RING,
        "owner-sealed labels",
        "every label, last-used day and audit event sealed to the owner key",
        "keyring_meta 'owner_sealed' is 1 (before: labels under the epoch's label key, the rest in clear, "
        "sealed on the owner's next request)",
        "storage.keyring.Keyring.owner_keys",
        "0.4.0",
        lambda d: d.keyring_meta.get("owner_sealed") == "1",
    ),
    Format(
        KEY_RING,
        "sealed copies",
        "the copies of the memory's log head and state version and the audit head "
        "carry a MAC under the current epoch's key; the audit events are MAC-chained",
        "keyring_meta 'copies_mac' (before: the copies in clear, sealed by the first session that opens the memory)",
        "storage.keyring.state_copies.read",
        "unreleased",
        lambda d: "copies_mac" in d.keyring_meta,
    ),
    Format(
        KEY_RING,
        "memories",
        "an identity holds named memories: main's key ring numbers them and keeps their "
        "capabilities' tags and, in one row each, their owner salts and names (memory_tags, memory_salts); another "
        "memory's key ring, in "
        "m/<name>/ with 2 KiB pages, records its number; append capabilities and their waiting notes "
        "(append_grants, inbox) in each memory's",
        "keyring_meta 'memories_made' (main) or 'memory_number' (another memory)",
        "storage.memories.names",
        "unreleased",
        lambda d: "memories_made" in d.keyring_meta or "memory_number" in d.keyring_meta,
    ),
)

MEMORY_FORMATS = (
    Format(
        MEMORY_FILE,
        "format 1",
        "a log without a running digest",
        "meta has no 'log_head' ('format' is 1 or absent)",
        "storage.memfile.MemoryFile.migrate_head",
        "before 0.1.0",
        _memory(lambda m: "log_head" not in m),
        mark="1",
        upgrade="migrate_head",
    ),
    Format(
        MEMORY_FILE,
        "SQLCipher",
        "every page encrypted under the file key, every row sealed too",
        "the key ring's 'file_cipher' is sqlcipher; the file has no SQLite header",
        "storage.sqlite.connections.connect",
        "0.1.0",
        lambda d: d.cipher == "sqlcipher",
    ),
    Format(
        MEMORY_FILE,
        "plain SQLite",
        "pages in clear, every row sealed (where SQLCipher is missing, and on a replicated host)",
        "the key ring's 'file_cipher' is none; the file starts with SQLite's header",
        "storage.sqlite.connections.connect",
        "0.1.0",
        lambda d: d.cipher == "none",
    ),
    Format(
        MEMORY_FILE,
        "format 2 (running digest)",
        "the log's head: count, previous digest, digest",
        "meta 'log_head' and 'format' 2",
        "storage.memfile.head.LogChain.verified_head",
        "0.1.0",
        _memory(lambda m: "log_head" in m),
        mark="2",
        upgrade="authenticate_format",
    ),
    _pages(LEGACY_PAGE_BYTES, "0.1.0", "SQLCipher: the key ring records no page size, or 16384"),
    _rows(OLDER_MEMORY_PLAINTEXT_BYTES, "storage.memfile.MemoryFile.scan", "0.1.0"),
    Format(
        MEMORY_FILE,
        "unversioned summaries",
        f"summary plaintexts of {SUMMARY_PLAINTEXT_BYTES} bytes",
        f"sealed summaries of {SUMMARY_PLAINTEXT_BYTES + aead.OVERHEAD} bytes",
        "storage.memfile.tree.SummaryTree.summary_text",
        "0.1.0",
        _sealed("summary_bytes", SUMMARY_PLAINTEXT_BYTES),
    ),
    Format(
        MEMORY_FILE,
        "key epochs",
        "rows sealed under the key of the epoch meta names",
        "meta 'epoch' (absent: epoch 0)",
        "storage.memfile.reseal.Epochs.match",
        "0.2.0",
        _memory(lambda m: "epoch" in m),
    ),
    Format(
        MEMORY_FILE,
        "authenticated state",
        "a MAC over the whole state and its version",
        "meta 'state' (absent: written once on open, unless the key ring holds a copy of its version)",
        "storage.memfile.state.State.check",
        "0.2.0",
        _memory(lambda m: "state" in m),
    ),
    Format(
        MEMORY_FILE,
        "versioned summaries",
        "each summary's plaintext starts with the state version it was written at",
        f"sealed summaries of {SUMMARY_VERSION_BYTES + SUMMARY_PLAINTEXT_BYTES + aead.OVERHEAD} bytes",
        "storage.memfile.tree.SummaryTree.summary_text",
        "0.2.0",
        _sealed("summary_bytes", SUMMARY_VERSION_BYTES + SUMMARY_PLAINTEXT_BYTES),
    ),
    _pages(PAGE_BYTES, "0.3.0", "SQLCipher: the key ring's 'memory_page_bytes'"),
    _rows(MEMORY_PLAINTEXT_BYTES, "storage.memfile.MemoryFile.append", "0.3.0"),
    Format(
        MEMORY_FILE,
        "tables made on use",
        "config, erased and erasures are made by their first row",
        "a table of schema.sql's memory_on_use section is absent",
        "storage.formats.make_on_use",
        "0.3.0",
        _lacks_one("memory_on_use"),
    ),
    Format(
        MEMORY_FILE,
        "authenticated format",
        "the format mark inside the state MAC, and the key ring's copies "
        "sealed; no state head is then damage, as is any layout of 0.2.0 on without one",
        "meta 'format' 3 (a file at 2 moves to it once its key ring's copies are sealed)",
        "storage.memfile.MemoryFile.authenticate_format",
        "unreleased",
        _memory(lambda m: m.get("format") == "3"),
        mark="3",
        upgrade="authenticate_format",
    ),
    # The upgrade is the file's first new epoch from this release on (it adds
    # the columns, constant work): a file that never has one stays as it is.
    Format(
        MEMORY_FILE,
        "row epochs",
        "each sealed row records the key epoch that sealed it, so a new epoch "
        "re-seals one key chunk instead of every row",
        "meta 'sealed_base' (the epoch of rows whose epoch is "
        "NULL); memory_keys, summaries, config, erased and erasures have an epoch column",
        "storage.memfile.MemoryFile.reseal",
        "unreleased",
        _memory(lambda m: "sealed_base" in m),
    ),
    # Its step is the same session step as mark 3's (a file at 2 or 3 moves
    # here at once), run once the key ring's copies are sealed.
    Format(
        MEMORY_FILE,
        "erasure record",
        "the state MAC covers one record of the erasures (counts, a digest of "
        "every erased row and receipt, the erased ids as runs) instead of every row, so an open costs the same "
        "whatever was erased; verify and the receipts listing recompute it in full",
        "meta 'format' 4 and meta 'erasure_record' (absent: nothing erased yet)",
        "storage.memfile.MemoryFile.check_erasure_record",
        "unreleased",
        _memory(lambda m: m.get("format") == "4"),
        mark="4",
        upgrade="authenticate_format",
    ),
    # No step: a file of an earlier release has the three tables from its
    # start, and a missing one reads as the empty table it would be.
    Format(
        MEMORY_FILE,
        "log made on use",
        "the log (with its append-only triggers), the memory key chunks and "
        "the summaries are made by their first row, so an empty memory file is two pages (the schema and meta)",
        "a table of log, memory_keys and summaries is absent",
        "storage.formats.make_on_use",
        "unreleased",
        _lacks_log_tables,
    ),
    # No session step: rows of earlier lengths open as they are. The log is
    # append-only and its running digest covers every row's sealed bytes, so
    # its rows are never re-sealed (the next entry shortens how they are
    # kept); the summaries move to their buckets by the operator's `stash
    # compact` (MemoryFile.rebucket_summaries, then VACUUM).
    Format(
        MEMORY_FILE,
        "rows in buckets",
        f"each new memory's and summary's plaintext padded to the smallest "
        f"multiple of {BUCKET_BYTES} bytes that holds it (at most {MEMORY_PLAINTEXT_BYTES} and "
        f"{SUMMARY_VERSION_BYTES + SUMMARY_PLAINTEXT_BYTES}), not all to the largest; a summary's version field "
        "starts with 0xFFFF",
        f"sealed log rows or summaries of a length below the largest that is "
        f"{BUCKET_BYTES}·k + {aead.OVERHEAD} (rows) or {BUCKET_BYTES}·k + "
        f"{SUMMARY_VERSION_BYTES + aead.OVERHEAD} (summaries)",
        "storage.memfile.rows.RowCodec.memory_plain",
        "unreleased",
        _bucketed,
    ),
    # No session step and no mark: `stash compact` stores one-size rows short
    # (MemoryFile.shorten_rows), each rebuilt to the same sealed bytes when
    # read, so the running digest, every head and every pin stay as they were.
    # A release before it cannot rebuild one and refuses the file as damaged.
    Format(
        MEMORY_FILE,
        "rows stored short",
        f"a memory row of {MEMORY_PLAINTEXT_BYTES} or "
        f"{OLDER_MEMORY_PLAINTEXT_BYTES} bytes of plaintext kept without the ciphertext of its padding's zeros, "
        "which the memory's key gives back (the erasure of its key records those bytes first, in log_tails)",
        f"sealed log rows of {BUCKET_BYTES}·k + {SHORT_ROW_OVERHEAD} bytes",
        "storage.memfile.MemoryFile.shorten_rows",
        "unreleased",
        _short,
    ),
    # Its step is the session step of marks 3 and 4 (a file at 2, 3 or 4
    # moves here at once): the tree made whole from the rows, once.
    Format(
        MEMORY_FILE,
        "rows bound",
        "every key chunk, summary and erased row has its digest in a tree whose root "
        "the state MAC covers, so a row of another copy of the memory put in its place is refused, not served",
        "meta 'format' 5, meta 'open_chunk' and the row_digests table (made by the first summary, erasure "
        "row or full key chunk)",
        "storage.memfile.bound.RowDigests.open_bound",
        "unreleased",
        _memory(lambda m: m.get("format") == "5"),
        mark="5",
    ),
)

FORMATS = KEY_RING_FORMATS + MEMORY_FORMATS


def _named(name: str) -> Format:
    (found,) = [f for f in MEMORY_FORMATS if f.name == name]
    return found


PAGE_FORMATS = {LEGACY_PAGE_BYTES: _named("16 KiB pages"), PAGE_BYTES: _named("4 KiB pages")}
# A log row's plaintext length -> the entry that names it.
ROW_FORMATS = {
    OLDER_MEMORY_PLAINTEXT_BYTES: _named("rows 320 B"),
    MEMORY_PLAINTEXT_BYTES: _named("rows 312 B"),
    **{n: _named("rows in buckets") for n in ROW_BUCKETS[:-1]},
}


def of_file(file: str) -> tuple[Format, ...]:
    return tuple(f for f in FORMATS if f.file == file)


def current_mark(file: str) -> str:
    """The ``format`` meta value a new file of ``file`` is written with."""
    return [f.mark for f in of_file(file) if f.mark is not None][-1]


def next_mark(file: str, mark: str) -> str:
    """The mark after ``mark``: what an upgrade step from ``mark`` writes
    (the later marks each have a step of their own)."""
    marks = [f.mark for f in of_file(file) if f.mark is not None]
    return marks[marks.index(mark) + 1]


def upgrades(file: str) -> list[str]:
    """Every upgrade step of ``file``, oldest first: each is idempotent, so a
    file at any earlier format runs them all, in this order."""
    return [f.upgrade for f in of_file(file) if f.upgrade is not None]


def upgrade_of(file: str, mark: str | None) -> str | None:
    """The step that brings a file whose ``format`` meta is ``mark`` (None:
    no such row, the oldest) to the next mark; None when the mark needs none
    or is not one of this registry's."""
    marked = [f for f in of_file(file) if f.mark is not None]
    found = marked[0] if mark is None else next((f for f in marked if f.mark == mark), None)
    return None if found is None else found.upgrade


def on_use_tables(section: str) -> frozenset[str]:
    """The tables of schema.sql's ``section`` that a file makes by their first row."""
    text = sections()[section]
    return frozenset(part.split(" ", 1)[0] for part in text.split("CREATE TABLE IF NOT EXISTS ")[1:])


@cache
def _statements_of(section: str, name: str) -> tuple[str, ...]:
    """The statements of schema.sql's ``section`` that make table ``name``:
    the table, then each trigger on it, each as schema.sql writes it."""
    found: list[str] = []
    pending = ""
    for line in sections()[section].splitlines(keepends=True):
        if not pending and (not line.strip() or line.lstrip().startswith("--")):
            continue
        pending += line
        if sqlite3.complete_statement(pending):
            statement = pending.strip()
            pending = ""
            if statement.startswith(f"CREATE TABLE IF NOT EXISTS {name} ") or re.match(
                rf"CREATE TRIGGER IF NOT EXISTS \w+ [A-Z ]+ ON {name}\s", statement
            ):
                found.append(statement)
    if not found or not found[0].startswith("CREATE TABLE"):
        raise KeyError(f"schema.sql's section {section} makes no table {name}")
    return tuple(found)


def make_on_use(conn: sqlite3.Connection, section: str, name: str) -> None:
    """Make table ``name`` of schema.sql's ``section`` and its triggers as
    schema.sql writes them, inside the caller's write transaction, before its
    first row: a file of an earlier release has it from its start, a newer
    one only once written to. A no-op for a table the file has."""
    for statement in _statements_of(section, name):
        conn.execute(statement)


def _tables(conn: sqlite3.Connection) -> frozenset[str]:
    return frozenset(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))


def read_key_ring(conn: sqlite3.Connection) -> tuple[dict[str, str], frozenset[str], frozenset[str]]:
    """A key ring's meta, its grants' columns and its tables."""
    meta = dict(conn.execute("SELECT name, value FROM keyring_meta"))
    columns = frozenset(r[1] for r in conn.execute("PRAGMA table_info(grants)"))
    return meta, columns, _tables(conn)


def read_memory_file(conn: sqlite3.Connection) -> dict[str, object]:
    """What a readable memory file shows of its format: the fields of
    :class:`OnDisk` named ``memory_*``, ``row_bytes`` and ``summary_bytes``."""
    tables = _tables(conn)

    def lengths(table: str) -> frozenset[int]:  # a table not made yet holds none
        if table not in tables:
            return frozenset()
        return frozenset(r[0] for r in conn.execute(f"SELECT DISTINCT length(sealed) FROM {table}"))

    return {
        "memory_pages": int(conn.execute("PRAGMA page_size").fetchone()[0]),
        "memory_meta": dict(conn.execute("SELECT name, value FROM meta")),
        "memory_tables": tables,
        "row_bytes": lengths("log"),
        "summary_bytes": lengths("summaries"),
    }


def formats_of(disk: OnDisk) -> list[Format]:
    """The registry's entries a user's files show, in the registry's order."""
    return [f for f in FORMATS if f.shows(disk)]


def describe(disk: OnDisk) -> str:
    """One line per user for ``stash verify``: each file's formats by name."""
    found = formats_of(disk)
    parts = []
    for file in (KEY_RING, MEMORY_FILE):
        names = [f.name for f in found if f.file == file] or ["not told without a token"]
        parts.append(f"{file}: {', '.join(names)}")
    unread = "" if disk.memory_meta is not None else " (the memory file's rows need a token)"
    return f"formats: {'; '.join(parts)}{unread}"
