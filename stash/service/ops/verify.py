"""``stash verify``: does every user file of a data folder (or a backup of
one) open, authenticate and agree with its digest?

Without a token only what needs no key is checked: each key ring's SQLite
integrity, that it belongs to its folder and holds a live owner capability
and a readable copy of the log head; a plain memory file's integrity, its
recorded head and state version against its rows and against the key ring's
copies; an encrypted memory file's shape (not plain SQLite, whole pages, at
least as many pages as the memories the key ring's copy counts need); every
file's size against what its header and its WAL say (:func:`_check_sizes`).
With one user's token, that user's store is checked whole, as the server
opens it and more: the capability unwraps, the file's head and state version
are not behind the key ring's copies, every page and every sealed value
authenticates, and the running digest recomputed over the whole log equals
both recorded heads.

Nothing here writes into a store's files: every check runs on a private
copy of one user's files at a time (:func:`_private_copy`), so a file found
damaged stays as it was, for the operator to look at and restore; TMPDIR
needs room for the largest user's files.

A report names users and their files by name only — never a path, a key, a
token or any memory text.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.errors import StashError
from ...core.lines import plural
from ...crypto import aead, tokens
from ...crypto.chain import Head
from ...crypto.epochs import KeyChain
from ...crypto.owner_seal import OwnerKeys
from ...storage import formats, memories, safeopen, userlock
from ...storage.disk_errors import DB_ERRORS, MissingFile
from ...storage.formats import LEGACY_PAGE_BYTES
from ...storage.keyring import HEAD_COPY, MEMORY_PAGES, STATE_COPY, Keyring, StaleGrant, inbox, state_copies
from ...storage.layout import USER_ID, UserFiles, unknown_in_user, unknown_in_users
from ...storage.memfile import HEAD_META, STATE_META, FileKeys, MemoryFile, bound, erasure_record
from ...storage.private_files import data_extents, overwrite_with_zeros
from ...storage.sqlite.connections import connect
from . import every_memory
from .keyring_memfile_agree import agree

SQLITE_HEADER = b"SQLite format 3\x00"
WAL_MAGIC = (0x377F0682, 0x377F0683)  # SQLite's WAL header, big- or little-endian checksums
WAL_HEADER_BYTES, WAL_FRAME_HEADER_BYTES = 32, 24
SEALED_ROW_BYTES = min(formats.ROW_FORMATS) + aead.OVERHEAD  # the smallest sealed log row


class Failed(Exception):
    """One check failed; the message says which, in words safe to print."""


@dataclass
class Report:
    user_id: str
    ok: bool = True
    facts: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # found, not damage: the store is served as it is

    def fail(self, problem: str) -> None:
        self.ok = False
        self.problems.append(problem)


def user_folders(data_dir: Path) -> Iterator[Path]:
    users = Path(data_dir) / "users"
    if not users.is_dir():
        raise Failed("it has no users folder: it is not a Stash data folder or backup")
    for folder in sorted(users.iterdir()):
        if folder.is_dir() and USER_ID.fullmatch(folder.name):
            yield folder


def _plain(path: Path) -> sqlite3.Connection:
    return safeopen.open_plain(path)  # a crafted view or trigger is refused, never run


def _integrity(conn: sqlite3.Connection, what: str) -> None:
    rows = [r[0] for r in conn.execute("PRAGMA integrity_check")]
    if rows != ["ok"]:
        raise Failed(f"{what} fails SQLite's integrity check")


def _check_keyring(folder: Path, report: Report, store: str) -> tuple[str, Head | None, int]:
    """The key ring's file cipher, its copy of the log head, and the memory
    file's page size (``store``: the id the key ring must belong to)."""
    path = folder / "keyring.db"
    if not path.is_file():
        raise Failed("keyring.db is missing")
    try:
        conn = _plain(path)
        try:
            _integrity(conn, "keyring.db")
            meta = dict(conn.execute("SELECT name, value FROM keyring_meta"))
            grants = conn.execute("SELECT id, scope, kdf, wrapped FROM grants ORDER BY id").fetchall()
            appends = len(inbox.live_tags(conn))  # append capabilities hold no key: counted by their live tags
            columns = {r[1] for r in conn.execute("PRAGMA table_info(grants)")}
            unmoved = (
                conn.execute("SELECT COUNT(*) FROM grants WHERE wrapped IS NOT NULL AND pub IS NULL").fetchone()[0]
                if "pub" in columns
                else sum(1 for g in grants if g[3] is not None)
            )
        finally:
            conn.close()
    except DB_ERRORS:
        raise Failed("keyring.db cannot be read as a key ring") from None
    if meta.get("user_id") != store:
        raise Failed("keyring.db belongs to another user or memory (or none)")
    cipher = meta.get("file_cipher")
    if cipher not in ("sqlcipher", "none"):
        raise Failed("keyring.db names no known file cipher")
    live = 0
    for _gid, _scope, kdf, wrapped in grants:
        if wrapped is None:
            continue
        live += 1
        try:
            json.loads(kdf)
        except (TypeError, ValueError):
            raise Failed("keyring.db holds a capability whose key parameters are unreadable") from None
        if len(wrapped) != 32 + aead.OVERHEAD:
            raise Failed("keyring.db holds a wrapped key of the wrong size")
    if not any(scope == "owner" and wrapped is not None for _, scope, _, wrapped in grants):
        raise Failed("keyring.db has no live owner capability")
    copy = None
    if HEAD_COPY in meta:
        copy = Head.parse(meta[HEAD_COPY])
        if copy is None:
            raise Failed("keyring.db's copy of the log head is unreadable")
    report.facts.append(
        f"key ring ok ({plural(live + appends, 'live capability')}, key epoch {meta.get('epoch', '0')})"
    )
    # Each capability moves to key epochs when its token is next used; one
    # that has not is revoked by the next revocation or rotation.
    report.facts.append(
        f"{plural(unmoved, 'live capability')} {'has' if unmoved == 1 else 'have'} not moved to key epochs yet"
        if unmoved
        else "every live capability has moved to key epochs"
    )
    pages = meta.get(MEMORY_PAGES, str(LEGACY_PAGE_BYTES))
    if pages not in {str(n) for n in formats.PAGE_FORMATS}:
        raise Failed("keyring.db records no known page size for memory.db")
    return cipher, copy, int(pages)


def _check_plain_memory(path: Path, user_id: str, copy: Head | None, report: Report) -> None:
    # The key ring's copies are read before the memory file: a server writes
    # the file first and the copy after its commit, so on a live folder a
    # copy read first is never ahead of an honest file.
    state_copy = _state_copy(path.parent)
    try:
        conn = _plain(path)
        try:
            _integrity(conn, "memory.db")
            meta = dict(conn.execute("SELECT name, value FROM meta"))
            tables = frozenset(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
            # A log not made yet is the empty one it would be (schema.sql, "Pages").
            top = (
                conn.execute("SELECT COALESCE(MAX(id) + 1, 0), COUNT(*) FROM log").fetchone()
                if "log" in tables
                else (0, 0)
            )
            held = erasure_record.counts(conn, tables)
        finally:
            conn.close()
    except DB_ERRORS:
        raise Failed("memory.db cannot be read as a memory file") from None
    _compare_erasure_counts(meta, held)
    if meta.get("user_id") != user_id:
        raise Failed("memory.db belongs to another user or memory (or none)")
    T, rows = top
    if rows != T:
        raise Failed(f"memory.db's log has a gap: {rows} rows for {T} positions")
    if HEAD_META not in meta:
        report.facts.append(f"memory file ok ({plural(T, 'note')}; no digest yet, written on its next open)")
        return
    try:
        count = int(meta[HEAD_META].split(" ")[0])
        head = Head(count, bytes.fromhex(meta[HEAD_META].split(" ")[2]))
    except (ValueError, IndexError):
        raise Failed("memory.db's recorded head is unreadable") from None
    if head.count > T:
        raise Failed(f"memory.db's log holds {T} notes but its head records {head.count}: it was cut short")
    if head.count < T:
        raise Failed(f"memory.db's log holds {T} notes, more than the {head.count} its head records")
    _compare_copy(head, copy)
    _compare_state_copy(meta.get(STATE_META), state_copy, report)
    report.facts.append(f"memory file ok ({plural(T, 'note')}, head {head.pin()[:24]}…)")


def _compare_erasure_counts(meta: dict[str, str], held: tuple[int, int]) -> None:
    """A plain memory file's erasure record (format mark 4 on) against how many
    erased rows and receipts it holds, as every open checks them; without a
    key only the counts can be, its digest of the rows needs the token."""
    if meta.get("format") not in bound.RECORD_MARKS:
        return
    try:
        record = erasure_record.parse(meta.get(erasure_record.RECORD_META))
    except StashError:
        raise Failed("memory.db's erasure record is unreadable") from None
    want = (0, 0) if record is None else (record.erased, record.receipts)
    if held != want:
        raise Failed(
            f"memory.db holds {held[0]} erased rows and {held[1]} erasure receipts but its erasure record "
            f"counts {want[0]} and {want[1]}: a row was deleted, added or put back (the server refuses it)"
        )


def _compare_copy(head: Head, copy: Head | None) -> None:
    if copy is None:
        return
    if copy.count > head.count:
        raise Failed(
            f"memory.db records {head.count} notes but the key ring's copy records {copy.count}: "
            "the memory file was rolled back or cut short"
        )
    if copy.count == head.count and copy.digest != head.digest:
        raise Failed("memory.db's head and the key ring's copy disagree: one of the two files was replaced")


def _state_copy(folder: Path) -> int | None:
    """The key ring's copy of the memory file's state version (None: none
    recorded yet)."""
    conn = _plain(folder / "keyring.db")
    try:
        row = conn.execute("SELECT value FROM keyring_meta WHERE name = ?", (STATE_COPY,)).fetchone()
    finally:
        conn.close()
    if row is None:
        return None
    try:
        return int(row[0])
    except ValueError:
        raise Failed("keyring.db's copy of the state version is unreadable") from None


def _compare_state_copy(stored: str | None, copy: int | None, report: Report) -> None:
    """A plain memory file's state version against the key ring's copy, as
    the server compares them on open (MemoryFile.check_state_copy): a copy
    ahead of the file means the file was put back from an older copy, and
    the server refuses it; a copy behind is what a crash between the file's
    commit and the copy leaves (or an older key ring put back), and the
    server serves the file and brings the copy up at its next write."""
    if stored is None:
        if copy is not None:
            raise Failed(
                f"memory.db records no state version but the key ring's copy records {copy}: "
                "the memory file was replaced"
            )
        return
    try:
        version = int(stored.split(" ")[0])
    except ValueError:
        raise Failed("memory.db's recorded state version is unreadable") from None
    if copy is None:
        return
    if copy > version:
        raise Failed(
            f"memory.db is at state version {version} but the key ring's copy records {copy}: the memory "
            "file was rolled back or cut short (the server refuses it as store.rolled_back)"
        )
    if copy < version:
        report.facts.append(
            f"the key ring's copy of the state version ({copy}) is behind the file's ({version}): "
            "a crash between the two writes, or an older key ring put back; the server serves "
            "the file and the next write brings the copy up"
        )


def _check_encrypted_memory(path: Path, page: int, report: Report, copy: Head | None = None) -> None:
    size = path.stat().st_size
    with open(path, "rb") as f:
        start = f.read(len(SQLITE_HEADER))
    if start == SQLITE_HEADER:
        raise Failed("memory.db should be encrypted but is plain SQLite")
    if size == 0 or size % page:
        raise Failed(f"memory.db is not a whole number of {page}-byte pages: it was cut or damaged")
    _check_encrypted_floor(path, size, page, copy)
    report.facts.append(
        f"memory file present ({size // page} encrypted pages of {page // 1024} KiB; its contents need a token)"
    )


def _wal_frames(db: Path, page: int) -> int:
    """How many whole frames the WAL beside ``db`` holds (0: none, or no
    WAL); :class:`Failed` when its header is not one of SQLite's for pages of
    ``page`` bytes (SQLite would ignore it, and what it held with it)."""
    wal = Path(f"{db}-wal")
    try:
        size = wal.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(wal, "rb") as f:
        header = f.read(WAL_HEADER_BYTES)
    if len(header) < WAL_HEADER_BYTES or int.from_bytes(header[:4], "big") not in WAL_MAGIC:
        raise Failed(f"{wal.name} is not a SQLite write-ahead log: it was cut or replaced")
    if int.from_bytes(header[8:12], "big") != page:
        raise Failed(f"{wal.name} holds pages of another size than {db.name}'s: it belongs to another file")
    # A crash in the middle of a frame leaves a partial one at the end, which SQLite ignores.
    return (size - WAL_HEADER_BYTES) // (WAL_FRAME_HEADER_BYTES + page)


def _check_encrypted_floor(path: Path, size: int, page: int, copy: Head | None) -> None:
    """An encrypted memory file's header (and its page count) needs the key,
    but the key ring's copy of the log head says how many memories it holds
    at least, and each is a sealed row of a fixed size: a file with fewer
    pages than those rows need was cut short."""
    if copy is None or _wal_frames(path, page):
        return
    need = -(-copy.count // (page // SEALED_ROW_BYTES))
    if size // page < need:
        raise Failed(
            f"memory.db has {size // page} pages, too few for the {copy.count} notes the key ring's "
            "copy of the log head counts: it was cut short"
        )


def _check_plain_size(path: Path) -> int:
    """A plain SQLite file's size against its header: not empty, a whole
    number of pages, and (with nothing in its WAL) as many pages as the
    header records. Returns its page size."""
    size = path.stat().st_size
    if size == 0:
        raise Failed(f"{path.name} is empty (0 bytes): it was cut or replaced")
    with open(path, "rb") as f:
        header = f.read(100)
    if len(header) < 100 or not header.startswith(SQLITE_HEADER):
        raise Failed(f"{path.name} is not a SQLite file: it was cut or replaced")
    page = int.from_bytes(header[16:18], "big")
    page = 65536 if page == 1 else page
    if page < 512 or page & (page - 1):
        raise Failed(f"{path.name}'s header records no valid page size")
    if _wal_frames(path, page):
        return page  # the WAL holds newer pages; the file alone says nothing of the size
    if size % page:
        raise Failed(f"{path.name} is not a whole number of {page}-byte pages: it was cut or damaged")
    pages = int.from_bytes(header[28:32], "big")
    # SQLite trusts the header's page count only while this pair agrees (its file format, "In-header database size").
    if pages and header[24:28] == header[92:96] and size // page < pages:
        raise Failed(f"{path.name} has {size // page} pages but its header records {pages}: it was cut short")
    return page


def _check_sizes(folder: Path, cipher: str, page: int) -> None:
    """Every size a store's files can be checked for without a key: the key
    ring's and a plain memory file's against their headers, an encrypted
    memory file's against its page size, and each WAL's header."""
    _check_plain_size(folder / "keyring.db")
    memory = folder / "memory.db"
    if cipher == "none":
        _check_plain_size(memory)
    else:
        _wal_frames(memory, page)


def _check_with_token(folder: Path, token_text: str, copy: Head | None, report: Report) -> dict[str, object] | None:
    """Everything the owner's (or any) capability can open. Returns what the
    opened memory file shows of its format (None: the token is another
    user's)."""
    from ..access import Vault

    token = tokens.parse(token_text)
    if token is None or token.user_id != folder.name:
        return None
    conn = _plain(folder / "keyring.db")
    try:
        home = memories.home_of(conn, token.tag)
    finally:
        conn.close()
    if home is not None:  # a capability of another memory: that memory is checked with it (every_memory)
        report.facts.append("main not checked with the token (bound to another memory)")
        return None
    return _open_with_token(Vault(folder.parent.parent), token_text, token, copy, report)


COPIED = re.compile(r"(keyring|memory|recall)\.db(-wal)?")
COPY_ATTEMPTS = 3
COPY_CHUNK = 1 << 20


def _copied_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if COPIED.fullmatch(p.name) and p.is_file() and not p.is_symlink())


def _signature(folder: Path, quota_bytes: int | None) -> list[tuple[str, int, int, int]]:
    """Each file to copy, by name, size, change time and inode: what a write
    of the server (or a WAL's checkpoint and removal) changes. A file larger
    than ``quota_bytes`` (stash verify passes twice the user's quota) is refused here, before any byte of it is read."""
    out = []
    for path in _copied_files(folder):
        st = path.stat()
        if quota_bytes is not None and st.st_size > quota_bytes:
            raise Failed(
                f"{path.name} is {st.st_size:,} bytes, more than any store's file can be (twice "
                "--quota-bytes): not copied; look at it by hand"
            )
        out.append((path.name, st.st_size, st.st_mtime_ns, st.st_ino))
    return out


def copy_allocated(src: Path, dst: Path) -> None:
    """Copy ``src`` into a new ``dst`` extent by extent, as the file system
    records them (:func:`stash.storage.private_files.data_extents`): a hole stays a
    hole, so a sparse file of terabytes that holds nothing costs nothing."""
    with open(src, "rb") as f, open(dst, "xb") as out:
        size = os.fstat(f.fileno()).st_size
        for start, end in data_extents(f.fileno(), size):
            f.seek(start)
            out.seek(start)
            left = end - start
            while left > 0:
                chunk = f.read(min(COPY_CHUNK, left))
                if not chunk:
                    break
                out.write(chunk)
                left -= len(chunk)
        out.truncate(size)


@contextlib.contextmanager
def _private_copy(folder: Path, quota_bytes: int | None = None) -> Iterator[Path]:
    """This user's folder as a copy in a private temporary data folder
    (TMPDIR, mode 0700), overwritten with zeros and removed afterwards
    (:func:`stash.storage.private_files.overwrite_with_zeros`).

    Every check runs on the copy: SQLite checkpoints and deletes a WAL when a
    connection closes, and opening a store with its key may upgrade an older
    format, re-seal a file an epoch behind and record the capability's use,
    so a store verified in place would not stay as it was found.

    The copy is made of the files' bytes (a WAL and its partial last frame
    included), only their allocated extents (:func:`copy_allocated`), and
    only of files no larger than a user's quota. The user's lock (the one
    ``stash backup`` copies under) is held exclusive only for a moment before
    the copy and one after, to read each file's size, change time and inode:
    no request of a running server has the files open at either moment, and
    when both agree the files were at rest in between, so the copy is one
    consistent state; when they differ the copy is made again. The server's
    requests wait for those two moments, never for the copy, except when the
    files changed during each of the first :data:`COPY_ATTEMPTS` - 1
    copies: the last is then made with the lock held throughout, so a user
    written to without a pause is still verified. The lock is taken only
    where a server made it; nothing is created in ``folder``."""
    with tempfile.TemporaryDirectory(prefix="stash-verify-") as tmp:
        target = UserFiles(Path(tmp), folder.name).folder
        target.mkdir(parents=True, mode=0o700)
        try:
            for _ in range(COPY_ATTEMPTS - 1):
                with userlock.exclusive(folder, create=False):
                    before = _signature(folder, quota_bytes)
                try:
                    _copy_files(folder, target, before)
                except FileNotFoundError:
                    continue  # a server folded and removed a WAL between the two moments: the files changed
                with userlock.exclusive(folder, create=False):
                    if _signature(folder, quota_bytes) == before:
                        break
            else:
                # Written to all along (agents noting without a pause): the last copy is made under
                # the lock, as stash backup's is, and the user's requests wait for that one copy.
                with userlock.exclusive(folder, create=False):
                    _copy_files(folder, target, _signature(folder, quota_bytes))
            yield target
        finally:
            for path in target.iterdir():
                with contextlib.suppress(OSError):
                    overwrite_with_zeros(path)


def _copy_files(folder: Path, target: Path, listed: list[tuple[str, int, int, int]]) -> None:
    """Copy the files ``listed`` (a :func:`_signature`) of ``folder`` into
    ``target``, zeroing and removing what an earlier attempt left there."""
    for path in target.iterdir():
        overwrite_with_zeros(path)
        path.unlink()
    for name, *_rest in listed:
        copy_allocated(folder / name, target / name)


def _open_with_token(
    vault: Any, token_text: str, token: tokens.Token, copy: Head | None, report: Report
) -> dict[str, object] | None:
    try:
        _, files, ring, grant = vault._authenticate(token_text)
    except StashError:
        raise Failed("the token does not open this store (wrong, revoked, or the key ring is damaged)") from None
    try:
        try:
            opened = ring.open_grant(grant, token.secret)
        except (aead.Unsealable, StaleGrant):
            raise Failed("the token's key does not open: the key ring was altered or put back") from None
        chain = opened.chain
        if grant.scope == "owner":
            try:
                owner = ring.open_owner_keys(grant, opened.kek)
            except (aead.Unsealable, UnicodeDecodeError, ValueError, KeyError, TypeError):
                raise Failed(OWNER_DATA_ALTERED) from None
            check_owner_data(ring, chain, owner)
        cipher = ring.meta("file_cipher") or "none"
        try:
            page = ring.memory_page_bytes()
            shown = _memory_formats(files.memory, token.user_id, chain, cipher, page)
            try:
                copies = ring.copies(chain)  # their MAC, as the server checks it
            except StashError as e:
                raise Failed(f"keyring.db: {e.message}") from None
            mf = MemoryFile(
                files.memory,
                token.user_id,
                chain,
                cipher,
                page_bytes=page,
                recorded=state_copies.state_required(ring.conn, copies),
            )
        except ValueError:
            raise Failed("keyring.db records no known page size for memory.db") from None
        except StashError as e:
            raise Failed(f"memory.db does not open with the key: {e.message}") from None
        try:
            mf.check_copy(copies.head)
            mf.check_state_copy(copies.state)  # as the server checks it: a memory file put back whole
            mf.check_ring_sealed(copies.authenticated)
            report.facts.append(f"with the token: {check_rows(mf, cipher, report.warnings)}")
        except StashError as e:
            raise Failed(f"with the token: {e.message}") from None
        finally:
            mf.close()
    finally:
        ring.close()
    return shown


OWNER_DATA_ALTERED = "a label, last-used day or audit event in keyring.db was altered, or moved from another key ring"


def check_owner_data(ring: Keyring, chain: KeyChain, owner: OwnerKeys | None) -> None:
    """Every label, last-used day and audit event of one memory's key ring
    opens with its owner keys, as GET /grants and GET /audit open them, and
    the audit trail's MAC chain holds; or raises :class:`Failed`. For main
    and every other memory alike (:func:`verify_memories`)."""
    try:
        for g in ring.grants():
            ring.label(g.id, chain, owner)
            ring.last_used(g.id, owner)
        ring.events(owner)
        if owner is not None:
            _, trail = ring.trail(owner, chain)
            if not trail.intact:
                raise Failed(f"the audit trail's MAC chain does not hold: {trail.problem}")
    except (aead.Unsealable, UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise Failed(OWNER_DATA_ALTERED) from None


def check_rows(mf: MemoryFile, cipher: str, warnings: list[str]) -> str:
    """Every page and every sealed value of one opened memory file
    authenticates and the running digest recomputed over the whole log is
    its head; or raises :class:`Failed` (a StashError of a row, as the
    server would refuse it). Returns the fact to report; what is found but
    is no damage goes to ``warnings``. For main and every other memory
    alike (:func:`verify_memories`)."""
    _integrity(mf.conn, "memory.db")
    if cipher == "sqlcipher":
        bad = [r for r in mf.conn.execute("PRAGMA cipher_integrity_check")]
        if bad:
            raise Failed(f"memory.db has {len(bad)} pages that fail their authentication")
    whole, _ = mf.recompute_head()
    if whole != mf.head:
        raise Failed("the running digest recomputed over the whole log differs from the recorded head")
    backwards = _dates_backwards(mf.scan(whole.count))  # every row opened and authenticated
    if backwards:
        warnings.append(backwards)
    summaries = sum(sum(1 for _ in mf.level(size)) for size in mf.level_sizes())
    mf.config()
    mf.check_erasure_record()  # every erased row and receipt as stored, against the authenticated record
    mf.check_row_digests()  # every key chunk, summary and erased row as stored, against the authenticated tree
    mf.receipts()
    back = mf.erased_keys_back()
    if back:
        raise Failed(
            f"the keys of erased notes {', '.join(f'#{i}' for i in back[:10])} are back in "
            "memory.db (a page or row from before the erasure was put back); they are still "
            "served as erased — erase them again (stash erase) to shred the keys"
        )
    return (
        f"{plural(whole.count, 'note')} and {plural(summaries, 'summary')} all authenticate, "
        f"and the whole chain recomputes to head {whole.pin()[:24]}…"
    )


def _dates_backwards(batches: Iterator[list[str]]) -> str | None:
    """Where the log's dates go backwards, as a warning, or None. The rows
    authenticate (each date is sealed with its memory), so this is not
    damage: a release before dates were kept non-decreasing (docs/DESIGN.md,
    "Memory model") dated each note by the clock alone, and a clock set back
    left a later memory dated earlier. Such a log is served as it is, but
    its export breaks the import rule (non-decreasing dates)."""
    first: tuple[str, str, str] | None = None
    steps = 0
    prev_id, prev = "", ""
    for batch in batches:
        for line in batch:
            ident, date = line.split(" ", 2)[:2]  # "#i DATE TEXT", an erased one "#i DATE [erased]"
            if date < prev:
                steps += 1
                first = first or (ident, date, f"{prev_id}, {prev}")
            prev_id, prev = ident, date
    if first is None:
        return None
    return (
        f"the log's dates go backwards {steps} {'time' if steps == 1 else 'times'}, first at note "
        f"{first[0]} dated {first[1]} after {first[2]} (written before notes were dated on the newest "
        "note's date, under a clock set back): every note authenticates and is served as it is, but "
        "its export does not import again until those dates are raised to the one before them"
    )


def _memory_formats(path: Path, user_id: str, chain: KeyChain, cipher: str, page: int) -> dict[str, object]:
    """What the memory file shows of its format as it is, read with its key
    before :class:`MemoryFile` opens it (an open may upgrade it)."""
    fk = FileKeys.derive(path, user_id, chain, cipher, page)
    try:
        conn = connect(path, file_key=fk.file_key, cipher=cipher, page_bytes=page)
    except (MissingFile, *DB_ERRORS):  # type: ignore[misc]  # a tuple of exception classes
        raise Failed("memory.db does not open with the key") from None
    try:
        return formats.read_memory_file(conn)
    except DB_ERRORS:
        raise Failed("memory.db does not open with the key") from None
    finally:
        conn.close()


def _formats(folder: Path, cipher: str, page: int, memory: dict[str, object] | None) -> str:
    """The format registry's entries this user's files are at, as one fact;
    an encrypted memory file without a token shows only its cipher and the
    page size its key ring records."""
    conn = _plain(folder / "keyring.db")
    try:
        meta, columns, tables = formats.read_key_ring(conn)
    finally:
        conn.close()
    shown: dict[str, Any] = {"memory_pages": page, **(memory or {})}
    return formats.describe(formats.OnDisk(meta, columns, tables, cipher, **shown))


def _read_plain_memory(path: Path) -> dict[str, object]:
    conn = _plain(path)
    try:
        return formats.read_memory_file(conn)
    finally:
        conn.close()


def verify_user(folder: Path, token_text: str | None = None, quota_bytes: int | None = None) -> Report:
    """Check one user's files, on a private copy of them (:func:`_private_copy`),
    and name what its folder holds that is not Stash's (storage/layout.py)."""
    report = Report(folder.name)
    try:
        with _private_copy(folder, quota_bytes) as copied:
            verify_files(copied, token_text, report)
        strange = unknown_in_user(folder)
        if strange:
            report.fail(
                f"its folder holds files that are not Stash's: {_names(strange)} (never replicated or "
                "restored; look at them, then remove them)"
            )
    except Failed as e:
        report.fail(str(e))
    except OSError:
        report.fail("a file of this store cannot be read")
    verify_memories(folder, token_text, report)  # every other memory of this user
    return report


def _names(names: list[str], most: int = 10) -> str:
    """File names as a report shows them: quoted (repr), at most ``most``."""
    shown = ", ".join(repr(n)[:80] for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def unknown_entries(data_dir: Path) -> list[str]:
    """What the data folder's ``users/`` holds that is not a user's folder."""
    return unknown_in_users(Path(data_dir) / "users")


def verify_files(folder: Path, token_text: str | None, report: Report, store: str | None = None) -> None:
    """One memory's files in ``folder``: main's (the user's folder; ``store``
    None) checked with ``token_text`` too, or another memory's, bound to
    ``store``, whose token check is :func:`verify_memories`'."""
    is_main = store is None
    store = store or folder.name
    memory_path = folder / "memory.db"
    try:
        cipher, copy, page = _check_keyring(folder, report, store)
        if not memory_path.is_file():
            raise Failed("memory.db is missing")
        _check_sizes(folder, cipher, page)
        memory = None
        if cipher == "none":
            _check_plain_memory(memory_path, store, copy, report)
            why = agree(folder / "keyring.db", memory_path)  # what a restore asks of the pair too
            if why is not None:
                raise Failed(why)
            memory = _read_plain_memory(memory_path)
        else:
            _check_encrypted_memory(memory_path, page, report, copy)
        if token_text and is_main:
            memory = _check_with_token(folder, token_text, copy, report) or memory
        report.facts.append(_formats(folder, cipher, page, memory))
    except Failed as e:
        report.fail(str(e))
    except (OSError, *DB_ERRORS):  # type: ignore[misc]  # a tuple of exception classes
        report.fail("a file of this store cannot be read")


def verify(data_dir: Path, token_text: str | None = None, quota_bytes: int | None = None) -> list[Report]:
    return [verify_user(folder, token_text, quota_bytes) for folder in user_folders(data_dir)]


def verify_memories(folder: Path, token_text: str | None, report: Report) -> None:
    """Check every memory of ``folder``'s user but main on a private copy of
    all of them (every_memory.private_identity), each as main is: its files
    (:func:`verify_files`) and, with a token, what the token opens
    (:func:`check_rows`, :func:`check_owner_data`); one fact per memory in
    ``report``, or a problem naming it."""
    names = every_memory.others(folder)
    if not names:
        return
    from ..access import Vault

    parsed = tokens.parse(token_text) if token_text else None
    if parsed is None or parsed.user_id != folder.name:
        token_text = None  # another user's token (or none): checked as without one, as main is

    try:
        with every_memory.private_identity(folder) as data:
            vault = Vault(data)
            need = _scope_of(vault, token_text)
            for name in names:
                where = data / "users" / folder.name / memories.SUBFOLDER / name
                # The same checks as main's, of this memory's files bound to its own store id.
                files = Report(report.user_id)
                verify_files(where, None, files, memories.store_id(folder.name, name))
                report.warnings += [f"memory {name}: {w}" for w in files.warnings]
                if not files.ok:
                    report.fail(f"memory {name}: {'; '.join(files.problems)}")
                    continue
                try:
                    fact = f"memory {name}: files ok; " + "; ".join(files.facts)
                    if token_text and need is not None:
                        fact += _with_token(vault, token_text, need, name, report)
                    report.facts.append(fact)
                except (ValueError, Failed, OSError, *DB_ERRORS) as e:  # type: ignore[misc]  # a tuple of classes
                    said = e if isinstance(e, ValueError | Failed) else "a file cannot be read"
                    report.fail(f"memory {name}: {said}")
    except OSError:
        report.fail("a memory's file cannot be read")


def _scope_of(vault: Any, token_text: str | None) -> str | None:
    """What a session of the token needs to check a memory: ``owner`` for the
    owner (its owner-only data too), ``read`` for any other token (one that
    opens nothing is then refused memory by memory); None without a token."""
    if not token_text:
        return None
    try:
        _, _, ring, grant = vault._authenticate(token_text)
    except StashError:
        return "read"
    ring.close()
    return "owner" if grant.scope == "owner" else "read"


def _with_token(vault: Any, token_text: str, need: str, name: str, report: Report) -> str:
    """Memory ``name`` checked with the token as main is (:func:`check_rows`
    and, for the owner, :func:`check_owner_data`): what the report says of
    it, or raises ValueError or :class:`Failed`."""
    warnings: list[str] = []
    try:
        with vault.session(token_text, need, memory=name) as s:
            if s.scope == "owner":
                check_owner_data(s.keyring, s.keys, s.owner)
            fact = check_rows(s.open_memory().mf, s.cipher, warnings)
    except StashError as e:
        if e.code != "memory.unknown":
            raise ValueError(f"it does not open with the token ({e.code})") from None
        return ", not checked with the token (bound to another memory)"
    report.warnings += [f"memory {name}: {w}" for w in warnings]
    return f", with the token: {fact}"
