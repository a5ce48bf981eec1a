"""The key ring's file and what every part of it reads: the names of its
meta rows, the grant rows, and :class:`RingFile`, the connection with the
reads the other parts share (stash/storage/keyring/__init__.py puts the parts together;
its docstring says what the key ring holds)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Self

from ...core.errors import Conflict
from ...crypto import aead, epochs, keys
from ...crypto.epochs import KeyChain
from .. import formats
from ..disk_errors import DB_ERRORS
from ..formats import LEGACY_PAGE_BYTES, PAGE_BYTES
from ..idempotency_table import Records
from ..sqlite.connections import connect, release
from ..sqlite.pool import Pool
from ..sqlite.schema import sections
from ..sqlite.transactions import flush, write_transaction

SCOPES = ("read", "full", "owner")
LABEL_KEY = b"grant-labels"  # subkey purpose: grant labels of a key ring whose owner has no owner key yet
HEAD_COPY = "log_head"  # the key ring's copies of the memory file's state (state_copies.py)
STATE_COPY = "state_version"
# How many of the memory's memories are erased, in clear beside the copy of the log head: what the identity's
# quota subtracts for a memory whose file it does not open (storage/memories/__init__.py, ``others_usage``).
ERASED_COPY = "erased_count"
EPOCH = "epoch"
OLDER_KEYS = "epoch_keys"
OWNER_PUB = "owner_pub"  # the owner public key, hex: anyone may seal to it (crypto/owner_seal.py)
OWNER_BOX = "owner_box"  # "<owner grant id>:<hex of every owner seed sealed to that grant>"
OWNER_NEXT = "owner_next"  # "<old owner id>:<new owner id>:<hex of the owner seeds sealed to the new one>"
OWNER_SEALED = "owner_sealed"  # "1" once every label, event and last-used day is sealed to the owner
SEALED_EVENT = "sealed"  # the event column of an audit row whose whole content is sealed to the owner
SEALED_DAY = "sealed:"  # starts a last-used day sealed to the owner (hex follows)
MEMORY_PAGES = formats.MEMORY_PAGES  # the page size memory.db is read with (schema.sql, "Pages")
FORMAT = formats.current_mark(formats.KEY_RING)
_COLUMNS = "id, scope, created, revoked, kdf, wrapped, pub, box"
LABEL_PAD = 66  # a sealed label: 2-byte length + grant_label_expiry.LABEL_MAX_BYTES, so every label is one size
AUDIT_PAD = 256  # a sealed audit event's plaintext is a multiple of this (SECURITY.md, "Owner-only data")


def wrap_aad(user_id: str, grant_id: int, scope: str) -> bytes:
    """Associated data of a format-1 wrap (the store's key under the KEK)."""
    return f"stash/v1|{user_id}|grant|{grant_id}|{scope}".encode()


def label_aad(user_id: str, grant_id: int) -> bytes:
    return f"stash/v1|{user_id}|grant_label|{grant_id}".encode()


@dataclass(frozen=True)
class GrantNotes:
    label: bytes | None  # sealed to the owner key (or, before it existed, under the epoch's label key)
    expires: str | None
    last_used: str | None  # sealed to the owner key (``SEALED_DAY``…), or a day written before it existed


def cert_aad(user_id: str, grant_id: int, scope: str, expires: str | None = None) -> bytes:
    """Associated data of a certificate (the public key under the KEK). A
    grant with an expiry binds it too, so it cannot be extended or removed by
    editing the key ring."""
    aad = f"stash/v2|{user_id}|grant|{grant_id}|{scope}"
    return (aad if expires is None else f"{aad}|expires|{expires}").encode()


def label_key(chain: KeyChain) -> bytes:
    """The key that seals grant labels in the current epoch."""
    return keys.subkey(chain.current, LABEL_KEY)


def expired(expires: str | None, now: datetime) -> bool:
    """True when ``expires`` (UTC RFC 3339, as stored) is at or before ``now``."""
    return expires is not None and datetime.fromisoformat(expires.replace("Z", "+00:00")) <= now


def now_utc() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


class StaleGrant(Exception):
    """The grant's box holds an older epoch than the key ring's: the row was
    put back from an older copy (a revoked capability's), so it opens nothing."""


@dataclass(frozen=True)
class Grant:
    id: int
    scope: str
    created: str
    revoked: str | None
    kdf: str | None
    wrapped: bytes | None
    pub: bytes | None = None
    box: bytes | None = None

    @property
    def moved(self) -> bool:
        """True once the grant holds a public key and a box (format 2)."""
        return self.pub is not None


@dataclass(frozen=True)
class Opened:
    """What a token's secret opened: every epoch key, and whether the grant
    still has to move to the epoch scheme."""

    chain: KeyChain
    unmoved: bool
    kek: bytes


class RingFile:
    """One open key ring: its connection, its meta rows, its grants and the
    format upgrades a read may need; what every part of the key ring reads
    (the parts hold it: stash/storage/keyring/__init__.py)."""

    def __init__(
        self,
        path: Path,
        user_id: str,
        *,
        create: bool = False,
        pool: Pool | None = None,
        ring_page_bytes: int | None = None,
    ) -> None:
        self.user_id = user_id
        self.path = path
        self._closed = False
        self._pool = pool
        self.conn = connect(path, file_key=None, cipher="none", create=create, pool=pool, page_bytes=ring_page_bytes)

    @classmethod
    def create(
        cls,
        path: Path,
        user_id: str,
        file_cipher: str,
        page_bytes: int = PAGE_BYTES,
        pool: Pool | None = None,
        ring_page_bytes: int | None = None,
    ) -> Self:
        """A new key ring, and the page size its memory file will be made
        with (:meth:`memory_page_bytes`); ``ring_page_bytes``: its own page
        size (a memory other than main: storage/memories/__init__.py)."""
        if page_bytes not in formats.PAGE_FORMATS:
            raise ValueError("not a page size this release reads")
        ring = cls(path, user_id, create=True, pool=pool, ring_page_bytes=ring_page_bytes)
        # Only the tables every store uses; the others are made by their
        # first write (schema.sql, "Pages"), so an empty key ring is 4 pages.
        ring.conn.executescript(sections()["keyring"])
        ring.conn.execute(
            "INSERT INTO keyring_meta(name, value) VALUES ('user_id', ?), ('file_cipher', ?), ('format', ?), (?, ?)",
            (user_id, file_cipher, FORMAT, MEMORY_PAGES, str(page_bytes)),
        )
        return ring

    def close(self) -> None:
        """Done with the key ring; a second close does nothing (the
        connection may be another request's by then)."""
        if not self._closed:
            self._closed = True
            release(self.conn, self.path, None, self._pool)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def idempotency_records(self) -> Records:
        return Records(self.conn)

    def meta(self, name: str) -> str | None:
        row = self.conn.execute("SELECT value FROM keyring_meta WHERE name = ?", (name,)).fetchone()
        return row[0] if row else None

    def memory_page_bytes(self) -> int:
        """The page size of this user's memory file: recorded when the key
        ring was made; a key ring made before the record existed goes with a
        memory file of the old page size. A value edited to anything else
        only makes the memory file fail to open (damage), so it is checked
        for being a page size at all, not trusted for more."""
        text = self.meta(MEMORY_PAGES)
        if text is None:
            return LEGACY_PAGE_BYTES
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n not in formats.PAGE_FORMATS:
            raise ValueError("the key ring's record of the memory file's page size is unreadable")
        return n

    def _upgrade(self) -> None:
        """Bring a key ring of an earlier format to the current one: every
        upgrade step the format registry lists, in its order, and the format
        mark, in one transaction (once)."""
        with write_transaction(self.conn):
            for step in formats.upgrades(formats.KEY_RING):
                getattr(self, step)()
            self.conn.execute("UPDATE keyring_meta SET value = ? WHERE name = 'format'", (FORMAT,))

    def _add_epoch_columns(self) -> None:
        """Format 1 to 2: the grants' pub and box columns, where missing."""
        have = {r[1] for r in self.conn.execute("PRAGMA table_info(grants)")}
        for column in ("pub", "box"):
            if column not in have:
                self.conn.execute(f"ALTER TABLE grants ADD COLUMN {column} BLOB")

    def select(self, where: str, args: tuple[object, ...]) -> list[Grant]:
        try:
            rows = self.conn.execute(f"SELECT {_COLUMNS} FROM grants {where}", args).fetchall()
        except DB_ERRORS as exc:
            if "no such column" not in str(exc):
                raise
            try:
                self._upgrade()
            except DB_ERRORS:
                # A key ring that cannot be written (a read-only folder) is read as format 1.
                rows = self.conn.execute(
                    f"SELECT {_COLUMNS.rsplit(', ', 2)[0]}, NULL, NULL FROM grants {where}", args
                ).fetchall()
                return [Grant(*r) for r in rows]
            rows = self.conn.execute(f"SELECT {_COLUMNS} FROM grants {where}", args).fetchall()
        return [Grant(*r) for r in rows]

    def find(self, tag: bytes) -> Grant | None:
        found = self.select("WHERE tag = ?", (tag,))
        return found[0] if found else None

    def grants(self) -> list[Grant]:
        return self.select("ORDER BY id", ())

    def tag_of(self, grant_id: int) -> bytes | None:
        """A grant's lookup tag (None once revoked)."""
        row = self.conn.execute("SELECT tag FROM grants WHERE id = ?", (grant_id,)).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def epoch(self) -> int:
        text = self.meta(EPOCH)
        try:
            n = 0 if text is None else int(text)
        except ValueError:
            raise aead.Unsealable("the key ring's epoch number is unreadable") from None
        if not 0 <= n < epochs.MAX_EPOCHS:
            raise aead.Unsealable("the key ring's epoch number is out of range")
        return n

    def older_keys(self) -> bytes | None:
        text = self.meta(OLDER_KEYS)
        try:
            return None if text is None else bytes.fromhex(text)
        except ValueError:
            raise aead.Unsealable("the key ring's older epoch keys are unreadable") from None

    def check_epoch(self, chain: KeyChain) -> None:
        if self.epoch() != chain.epoch:
            raise Conflict(
                "A capability was revoked while this request ran, so nothing was changed; retry it.", code="grants.busy"
            )

    def ensure_notes(self) -> None:
        self.ensure_table("grant_notes")

    def has_notes(self) -> bool:
        return self.has_table("grant_notes")

    def notes(self, grant_id: int) -> GrantNotes:
        """A grant's label (sealed), expiry and last-used day; all None when
        it has none (or the key ring predates them)."""
        row = None
        if self.has_notes():
            row = self.conn.execute(
                "SELECT label, expires, last_used FROM grant_notes WHERE grant_id = ?", (grant_id,)
            ).fetchone()
        return GrantNotes(*row) if row else GrantNotes(None, None, None)

    def ensure_table(self, name: str) -> None:
        formats.make_on_use(self.conn, "keyring_on_use", name)

    def has_table(self, name: str) -> bool:
        return (
            self.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
            is not None
        )

    def owner_public(self) -> bytes | None:
        """The owner public key, or None before the store has one. Trusted
        only to seal to: a key edited in makes the owner's reads of what was
        sealed to it fail (damage), and gives nothing already sealed."""
        text = self.meta(OWNER_PUB)
        try:
            public = None if text is None else bytes.fromhex(text)
        except ValueError:
            public = None
        return public if public is not None and len(public) == epochs.PUBLIC_KEY_BYTES else None

    def pending_owner(self) -> tuple[int, int, bytes | None] | None:
        """``(old id, new id, owner box of the new one)`` while a rotation
        waits for its new token's first use, else None. A value edited in
        names grants the certificates and boxes must still open, so it gives
        nobody a key; an unreadable one reads as none."""
        text = self.meta(OWNER_NEXT)
        if text is None:
            return None
        old, _, rest = text.partition(":")
        new, _, hexbox = rest.partition(":")
        try:
            return int(old), int(new), bytes.fromhex(hexbox) if hexbox else None
        except ValueError:
            return None

    def unmoved_live(self) -> int:
        """How many live grants still have to move to the epoch scheme."""
        return sum(1 for g in self.select("WHERE revoked IS NULL", ()) if not g.moved)

    def flush(self) -> bool:
        """Fold the WAL into the file and truncate it, so a destroyed wrapped
        key is left in neither (:func:`files.flush`); False when it could not
        be done yet (every later close of the key ring tries again)."""
        return flush(self.conn)
