"""An in-memory index of each user's live lookup tags, so that a token is
refused before anything else is done with its request, at the same small
cost whether its user exists or not.

Without it, a wrong secret for a real user cost a key-ring open (about a
millisecond) and an unknown user cost nothing, and a request's fields were
checked in between: the answers told who exists. With it, both are refused
after one BLAKE2b and one read of a 48-byte file, and the request's body is
never read (docs/DESIGN.md, "Tokens": 401 is always the same answer).

Freshness across processes (``stash serve --workers N``) rests on the
*stamp*, ``grants.stamp`` in the user's folder: a random nonce and the digest
of the live tags seen by whoever wrote it. The rule that keeps it safe:

    Whoever changes the grants (an owner's authenticated session, or the
    creation of an identity) checks, before its answer leaves, whether the stamp's digest
    matches the tags it now sees, and if not writes a stamp with a *new*
    nonce. A process caches the tags it loaded under the nonce it read
    *before* loading them, and trusts the cache only while the stamp still
    holds that nonce.

So a tag added after a load always changes the nonce before its token can
be used, and a cache can only be stale toward revoked tags, which the full
check (the grant's row, then argon2id and the unwrap) refuses anyway. Lost or
missing stamps only cost a reload; stamps are not fsynced for that reason.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import sqlite3
import threading
from collections import OrderedDict
from datetime import UTC, datetime
from pathlib import Path

from ..storage import memories
from ..storage.keyring import expired, inbox, open_keyring
from ..storage.layout import UserFiles
from ..storage.private_files import write_private
from ..storage.sqlite.pool import Pool

STAMP = "grants.stamp"
_USER_ID = re.compile(r"[0-9a-f]{16}")
NONCE_BYTES = 16
DIGEST_BYTES = 32
MAX_USERS = 50_000  # cached users per process; about 200 bytes each, evicted least recently used


def live_tags(conn: sqlite3.Connection) -> frozenset[bytes]:
    """The lookup tags of every live grant in a key ring connection (the
    grants table's ``tag`` column: revoking sets it to NULL), with main's
    append capabilities and the capabilities of the user's other memories
    (storage/memories/__init__.py keeps their tags in main's key ring)."""
    tags = frozenset(bytes(row[0]) for row in conn.execute("SELECT tag FROM grants WHERE tag IS NOT NULL"))
    return tags | inbox.live_tags(conn) | memories.other_tags(conn)


def tags_digest(tags: frozenset[bytes]) -> bytes:
    return hashlib.blake2b(b"".join(sorted(tags)), digest_size=DIGEST_BYTES, person=b"stash.tag.index").digest()


def _read_stamp(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, NONCE_BYTES + DIGEST_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) == NONCE_BYTES + DIGEST_BYTES else None


class TagIndex:
    """``verdict(user_id, tag)``: True (a live grant has this tag), False
    (none has: refuse), or None (not known here yet: call :meth:`load`)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        # Plain strings, not pathlib: a refusal's whole budget is tens of microseconds.
        self._users = os.fspath(UserFiles(self.data_dir, "x").folder.parent)
        # user id -> (the stamp's nonce, the live tags, the expiry of those that have one)
        self._cache: OrderedDict[str, tuple[bytes, frozenset[bytes], dict[bytes, str]]] = OrderedDict()
        self._lock = threading.Lock()
        # Where a key ring read here may be kept open for the next request (Vault.keeping_files_open).
        self.pool: Pool | None = None

    def _stamp_path(self, user_id: str) -> str:
        return f"{self._users}/{user_id}/{STAMP}"

    def verdict(self, user_id: str, tag: bytes) -> bool | None:
        """The same work for every user id, known or not: one read of the
        stamp, one dictionary lookup. No key ring is opened. A tag past its
        expiry is refused here as a revoked one is (the expiry is trusted
        only to refuse: the grant's own row decides the rest)."""
        stamp = _read_stamp(self._stamp_path(user_id))
        with self._lock:
            entry = self._cache.get(user_id)
            if stamp is not None and entry is not None and entry[0] == stamp[:NONCE_BYTES]:
                self._cache.move_to_end(user_id)
                return _live(tag, entry[1], entry[2])
        if stamp is None and not os.path.isdir(f"{self._users}/{user_id}"):
            return False
        return None

    def load(self, user_id: str, conn: sqlite3.Connection) -> bool:
        """Cache the tags of ``conn`` (this user's open key ring), under the
        nonce read before them; create the stamp when there is none (an
        exclusive create, so it never overwrites a newer one). Returns
        whether the cache entry was kept."""
        path = self._stamp_path(user_id)
        stamp = _read_stamp(path)
        tags = live_tags(conn)
        expiries = memories.tag_expiries(conn)
        if stamp is None:
            stamp = secrets.token_bytes(NONCE_BYTES) + tags_digest(tags)
            if not write_private(path, stamp, exclusive=True):
                return False
        with self._lock:
            self._cache[user_id] = (stamp[:NONCE_BYTES], tags, expiries)
            self._cache.move_to_end(user_id)
            while len(self._cache) > MAX_USERS:
                self._cache.popitem(last=False)
        return True

    def load_from_disk(self, user_id: str, tag: bytes) -> bool | None:
        """The verdict after reading this user's key ring (the first request
        for a user in this process, or after its grants changed): None when
        the key ring cannot be read, which the full check then reports."""
        files = UserFiles(self.data_dir, user_id)
        if not files.exists():
            return False
        try:
            ring = open_keyring(files.keyring, user_id, self.pool)
        except Exception:
            return None
        try:
            self.load(user_id, ring.conn)
            return _live(tag, live_tags(ring.conn), memories.tag_expiries(ring.conn))
        except Exception:
            return None
        finally:
            ring.close()

    def warm(self, stop: threading.Event | None = None) -> int:
        """Load every user's tags (up to MAX_USERS), so that even the first
        refusal for a user after a start costs what every later one does.
        Run in a background thread at start; requests are served meanwhile
        (one for a user not loaded yet loads it itself). Returns how many."""
        try:
            names = os.listdir(self._users)
        except OSError:
            return 0
        done = 0
        for name in [n for n in names if _USER_ID.fullmatch(n)][:MAX_USERS]:
            if stop is not None and stop.is_set():
                break
            with self._lock:
                if name in self._cache:
                    continue
            if self.load_from_disk(name, b"") is not None:
                done += 1
        return done

    def grants_seen(self, user_id: str, conn: sqlite3.Connection) -> None:
        """Keep the rule of the module docstring: called by whoever may have
        changed the grants, before its answer leaves. A new nonce when the
        stamp's digest is not that of the tags now live; when the tags cannot
        be read, no stamp at all, so every process falls back to a load."""
        path = self._stamp_path(user_id)
        try:
            tags = live_tags(conn)
        except Exception:
            _remove(path)
            return
        stamp = _read_stamp(path)
        digest = tags_digest(tags)
        if stamp is not None and stamp[NONCE_BYTES:] == digest:
            return
        if not write_private(path, secrets.token_bytes(NONCE_BYTES) + digest):
            _remove(path)

    def forget(self, user_id: str) -> None:
        with self._lock:
            self._cache.pop(user_id, None)


def _live(tag: bytes, tags: frozenset[bytes], expiries: dict[bytes, str]) -> bool:
    if tag not in tags:
        return False
    expires = expiries.get(tag)
    try:
        return expires is None or not expired(expires, datetime.now(UTC))
    except ValueError:
        return True  # an unreadable expiry is the full check's to refuse, as a damaged key ring


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
