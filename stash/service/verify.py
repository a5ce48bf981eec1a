"""``stash verify``: does every user file of a data folder (or a backup of
one) open, authenticate and agree with its digest?

Without a token only what needs no key is checked: each key ring's SQLite
integrity, that it belongs to its folder and holds a live owner capability
and a readable copy of the log head; a plain memory file's integrity, its
recorded head against its rows and against the key ring's copy; an encrypted
memory file's shape (not plain SQLite, whole pages). With one user's token,
that user's store is checked whole: the capability unwraps, every page and
every sealed value authenticates, and the running digest recomputed over the
whole log equals both recorded heads.

A report names users and their files by name only — never a path, a key, a
token or any memory text.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import StashError
from ..crypto import aead, tokens
from ..crypto.chain import Head
from ..storage.files import DB_ERRORS, LEGACY_PAGE_BYTES, PAGE_BYTES, UserFiles
from ..storage.keyring import HEAD_COPY, MEMORY_PAGES, StaleGrant
from ..storage.memfile import HEAD_META, MemoryFile

SQLITE_HEADER = b"SQLite format 3\x00"
USER_ID = re.compile(r"[0-9a-f]{16}")


class Failed(Exception):
    """One check failed; the message says which, in words safe to print."""


@dataclass
class Report:
    user_id: str
    ok: bool = True
    facts: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

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
    return sqlite3.connect(str(path), isolation_level=None)


def _integrity(conn, what: str) -> None:
    rows = [r[0] for r in conn.execute("PRAGMA integrity_check")]
    if rows != ["ok"]:
        raise Failed(f"{what} fails SQLite's integrity check")


def _check_keyring(folder: Path, report: Report) -> tuple[str, Head | None, int]:
    """The key ring's file cipher, its copy of the log head, and the memory
    file's page size."""
    path = folder / "keyring.db"
    if not path.is_file():
        raise Failed("keyring.db is missing")
    try:
        conn = _plain(path)
        try:
            _integrity(conn, "keyring.db")
            meta = dict(conn.execute("SELECT name, value FROM keyring_meta"))
            grants = conn.execute("SELECT id, scope, kdf, wrapped FROM grants ORDER BY id").fetchall()
            columns = {r[1] for r in conn.execute("PRAGMA table_info(grants)")}
            unmoved = (conn.execute("SELECT COUNT(*) FROM grants WHERE wrapped IS NOT NULL AND pub IS NULL")
                       .fetchone()[0] if "pub" in columns else sum(1 for g in grants if g[3] is not None))
        finally:
            conn.close()
    except DB_ERRORS:
        raise Failed("keyring.db cannot be read as a key ring") from None
    if meta.get("user_id") != folder.name:
        raise Failed("keyring.db belongs to another user (or none)")
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
    report.facts.append(f"key ring ok ({live} live capabilities, key epoch {meta.get('epoch', '0')})")
    # Each capability moves to key epochs when its token is next used; one
    # that has not is revoked by the next revocation or rotation.
    report.facts.append(f"{unmoved} live capabilities have not moved to key epochs yet" if unmoved else
                        "every live capability has moved to key epochs")
    pages = meta.get(MEMORY_PAGES, str(LEGACY_PAGE_BYTES))
    if pages not in (str(PAGE_BYTES), str(LEGACY_PAGE_BYTES)):
        raise Failed("keyring.db records no known page size for memory.db")
    return cipher, copy, int(pages)


def _check_plain_memory(path: Path, user_id: str, copy: Head | None, report: Report) -> None:
    try:
        conn = _plain(path)
        try:
            _integrity(conn, "memory.db")
            meta = dict(conn.execute("SELECT name, value FROM meta"))
            top = conn.execute("SELECT COALESCE(MAX(id) + 1, 0), COUNT(*) FROM log").fetchone()
        finally:
            conn.close()
    except DB_ERRORS:
        raise Failed("memory.db cannot be read as a memory file") from None
    if meta.get("user_id") != user_id:
        raise Failed("memory.db belongs to another user (or none)")
    T, rows = top
    if rows != T:
        raise Failed(f"memory.db's log has a gap: {rows} rows for {T} positions")
    if HEAD_META not in meta:
        report.facts.append(f"memory file ok ({T} memories; no digest yet, written on its next open)")
        return
    try:
        count = int(meta[HEAD_META].split(" ")[0])
        head = Head(count, bytes.fromhex(meta[HEAD_META].split(" ")[2]))
    except (ValueError, IndexError):
        raise Failed("memory.db's recorded head is unreadable") from None
    if head.count > T:
        raise Failed(f"memory.db's log holds {T} memories but its head records {head.count}: it was cut short")
    if head.count < T:
        raise Failed(f"memory.db's log holds {T} memories, more than the {head.count} its head records")
    _compare_copy(head, copy)
    report.facts.append(f"memory file ok ({T} memories, head {head.pin()[:24]}…)")


def _compare_copy(head: Head, copy: Head | None) -> None:
    if copy is None:
        return
    if copy.count > head.count:
        raise Failed(f"memory.db records {head.count} memories but the key ring's copy records {copy.count}: "
                     "the memory file was rolled back or cut short")
    if copy.count == head.count and copy.digest != head.digest:
        raise Failed("memory.db's head and the key ring's copy disagree: one of the two files was replaced")


def _check_encrypted_memory(path: Path, page: int, report: Report) -> None:
    size = path.stat().st_size
    with open(path, "rb") as f:
        start = f.read(len(SQLITE_HEADER))
    if start == SQLITE_HEADER:
        raise Failed("memory.db should be encrypted but is plain SQLite")
    if size == 0 or size % page:
        raise Failed(f"memory.db is not a whole number of {page}-byte pages: it was cut or damaged")
    report.facts.append(f"memory file present ({size // page} encrypted pages of {page // 1024} KiB; its contents "
                        "need a token)")


def _check_with_token(data_dir: Path, folder: Path, token_text: str, copy: Head | None, report: Report) -> None:
    """Everything the owner's (or any) capability can open."""
    from .access import Vault

    token = tokens.parse(token_text)
    if token is None or token.user_id != folder.name:
        return
    vault = Vault(data_dir)
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
            # Owner-only data, as GET /grants and GET /audit open it.
            try:
                owner = ring.open_owner_keys(grant, opened.kek)
                for g in ring.grants():
                    ring.label(g.id, chain, owner)
                    ring.last_used(g.id, owner)
                ring.events(owner)
            except (aead.Unsealable, UnicodeDecodeError, ValueError, KeyError, TypeError):
                raise Failed("a label, last-used day or audit event in keyring.db was altered, or moved from "
                             "another key ring") from None
        cipher = ring.meta("file_cipher") or "none"
        try:
            mf = MemoryFile(files.memory, token.user_id, chain, cipher, page_bytes=ring.memory_page_bytes())
        except ValueError:
            raise Failed("keyring.db records no known page size for memory.db") from None
        except StashError as e:
            raise Failed(f"memory.db does not open with the key: {e.message}") from None
        try:
            mf.check_copy(copy)
            try:
                state_copy = ring.state_version()
            except ValueError:
                raise Failed("keyring.db's copy of the state version is unreadable") from None
            mf.check_state_copy(state_copy)  # as the server checks it: a memory file put back whole
            _integrity(mf.conn, "memory.db")
            if cipher == "sqlcipher":
                bad = [r for r in mf.conn.execute("PRAGMA cipher_integrity_check")]
                if bad:
                    raise Failed(f"memory.db has {len(bad)} pages that fail their authentication")
            whole, _ = mf.recompute_head()
            if whole != mf.head:
                raise Failed("the running digest recomputed over the whole log differs from the recorded head")
            for _batch in mf.scan(whole.count):
                pass  # every row opened and authenticated
            summaries = sum(sum(1 for _ in mf.level(size)) for size in mf.level_sizes())
            mf.config()
            mf.receipts()
            back = mf.erased_keys_back()
            if back:
                raise Failed(f"the keys of erased memories {', '.join(f'#{i}' for i in back[:10])} are back in "
                             "memory.db (a page or row from before the erasure was put back); they are still "
                             "served as erased — erase them again (stash erase) to shred the keys")
        except StashError as e:
            raise Failed(f"with the token: {e.message}") from None
        finally:
            mf.close()
        report.facts.append(f"with the token: all {whole.count} memories and {summaries} summaries authenticate, "
                            f"and the whole chain recomputes to head {whole.pin()[:24]}…")
    finally:
        ring.close()


def verify_user(data_dir: Path, folder: Path, token_text: str | None = None) -> Report:
    report = Report(folder.name)
    files = UserFiles(Path(data_dir), folder.name)
    try:
        cipher, copy, page = _check_keyring(folder, report)
        if not files.memory.is_file():
            raise Failed("memory.db is missing")
        if cipher == "none":
            _check_plain_memory(files.memory, folder.name, copy, report)
        else:
            _check_encrypted_memory(files.memory, page, report)
        if token_text:
            _check_with_token(data_dir, folder, token_text, copy, report)
    except Failed as e:
        report.fail(str(e))
    except (OSError, *DB_ERRORS):  # type: ignore[misc]  # a tuple of exception classes
        report.fail("a file of this store cannot be read")
    return report


def verify(data_dir: Path, token_text: str | None = None) -> list[Report]:
    return [verify_user(data_dir, folder, token_text) for folder in user_folders(data_dir)]
