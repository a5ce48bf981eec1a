"""A user's key ring: the grants, and the master key wrapped once per grant.

The key ring is plain SQLite because it has to be read before the master key
is known. Nothing in it opens anything without a token's secret: a grant row
holds a keyed hash of the secret (to find the row cheaply) and the master key
sealed under the argon2id KEK of that secret, with user, grant id and scope in
the associated data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import argon2.exceptions

from ..core.errors import Conflict
from ..crypto import aead, keys
from ..crypto.chain import Head
from .files import DB_ERRORS, checkpoint, connect, write_transaction
from .idempotency import Records
from .schema import sections

SCOPES = ("read", "full", "owner")
LABEL_KEY = b"grant-labels"  # subkey purpose: the key that seals grant labels
HEAD_COPY = "log_head"


def wrap_aad(user_id: str, grant_id: int, scope: str, expires: str | None = None) -> bytes:
    """What a wrap binds. A grant with an expiry binds it too (a grant
    without one keeps the original form), so it cannot be extended or
    removed by editing the key ring."""
    aad = f"stash/v1|{user_id}|grant|{grant_id}|{scope}"
    return (aad if expires is None else f"{aad}|expires|{expires}").encode()


def label_aad(user_id: str, grant_id: int) -> bytes:
    return f"stash/v1|{user_id}|grant_label|{grant_id}".encode()


@dataclass(frozen=True)
class GrantNotes:
    label: bytes | None  # sealed
    expires: str | None
    last_used: str | None


def now_utc() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Grant:
    id: int
    scope: str
    created: str
    revoked: str | None
    kdf: str | None
    wrapped: bytes | None


class Keyring:
    def __init__(self, path: Path, user_id: str, *, create: bool = False) -> None:
        self.user_id = user_id
        self.conn = connect(path, file_key=None, cipher="none", create=create)

    @classmethod
    def create(cls, path: Path, user_id: str, file_cipher: str) -> Keyring:
        ring = cls(path, user_id, create=True)
        ring.conn.executescript(sections()["keyring"])
        ring.conn.executescript(sections()["idempotency"])
        ring.conn.execute(
            "INSERT INTO keyring_meta(name, value) VALUES ('user_id', ?), ('file_cipher', ?), ('format', '1')",
            (user_id, file_cipher),
        )
        return ring

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Keyring:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def idempotency_records(self) -> Records:
        return Records(self.conn)

    def meta(self, name: str) -> str | None:
        row = self.conn.execute("SELECT value FROM keyring_meta WHERE name = ?", (name,)).fetchone()
        return row[0] if row else None

    def log_head(self) -> Head | None:
        """The copy of the memory log's head kept here, outside the memory
        file, so that rolling back that file alone is caught."""
        text = self.meta(HEAD_COPY)
        if text is None:
            return None
        head = Head.parse(text)
        if head is None:
            raise ValueError("the key ring's copy of the log head is unreadable")
        return head

    def advance_head(self, head: Head) -> bool:
        """Record ``head`` as the copy unless the copy is already as far: it
        only moves forward, so concurrent writers finishing out of order leave
        the furthest one. Best effort (False when it could not be written, as
        on a full disk): a copy that lags is accepted by the next open when
        the log extends it, and the next write brings it up to date. For the
        same reason its commit is not fsynced (a power cut may lose it, which
        is a lag): that keeps the cost of a note at one fsync, not two."""
        try:
            self.conn.execute("PRAGMA synchronous = NORMAL")
            try:
                with self.conn:
                    self.conn.execute("BEGIN IMMEDIATE")
                    current = self.log_head()
                    if current is None or current.count < head.count:
                        self.conn.execute(
                            "INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
                            "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                            (HEAD_COPY, head.pin()),
                        )
            finally:
                self.conn.execute("PRAGMA synchronous = FULL")
        except (*DB_ERRORS, ValueError, OSError):
            return False
        return True

    def find(self, tag: bytes) -> Grant | None:
        row = self.conn.execute(
            "SELECT id, scope, created, revoked, kdf, wrapped FROM grants WHERE tag = ?", (tag,)
        ).fetchone()
        return Grant(*row) if row else None

    def add(self, *, scope: str, tag: bytes, secret: bytes, master: bytes, kdf: keys.KdfParams,
            expires: str | None = None, label: str | None = None) -> int:
        """File a new grant wrapping ``master`` under ``secret``'s KEK. The id
        is allotted first because the wrap binds it (and ``expires``, when
        given); ``label`` is sealed under a key derived from ``master``,
        bound to the user and the grant id."""
        if scope not in SCOPES:
            raise ValueError("unknown scope")
        salt = keys.new_salt()
        kek = keys.derive_kek(secret, salt, kdf)
        with write_transaction(self.conn):
            cur = self.conn.execute(
                "INSERT INTO grants(tag, scope, created) VALUES (?, ?, ?)", (tag, scope, now_utc())
            )
            grant_id = cur.lastrowid
            wrapped = aead.seal(kek, master, wrap_aad(self.user_id, grant_id, scope, expires))
            params = {**kdf.as_dict(), "salt": salt.hex()}
            self.conn.execute(
                "UPDATE grants SET kdf = ?, wrapped = ? WHERE id = ?", (json.dumps(params), wrapped, grant_id)
            )
            if expires is not None or label is not None:
                sealed = None if label is None else aead.seal(
                    keys.subkey(master, LABEL_KEY), label.encode(), label_aad(self.user_id, grant_id))
                self._ensure_notes()
                self.conn.execute("INSERT INTO grant_notes(grant_id, label, expires) VALUES (?, ?, ?)",
                                  (grant_id, sealed, expires))
        return grant_id

    def _ensure_notes(self) -> None:
        self._ensure_table("grant_notes")

    def _has_notes(self) -> bool:
        return self._has_table("grant_notes")

    def notes(self, grant_id: int) -> GrantNotes:
        """A grant's label (sealed), expiry and last-used day; all None when
        it has none (or the key ring predates them)."""
        row = None
        if self._has_notes():
            row = self.conn.execute("SELECT label, expires, last_used FROM grant_notes WHERE grant_id = ?",
                                    (grant_id,)).fetchone()
        return GrantNotes(*row) if row else GrantNotes(None, None, None)

    def _ensure_table(self, name: str) -> None:
        """A key ring made before table ``name`` existed gets it (as
        schema.sql writes it) on its first write of one."""
        keyring = sections()["keyring"]
        start = keyring.index(f"CREATE TABLE IF NOT EXISTS {name} ")
        self.conn.execute(keyring[start:keyring.index(");", start) + 2])

    def _has_table(self, name: str) -> bool:
        return self.conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None

    def record(self, grant_id: int, event: str, detail: dict) -> None:
        """Append one audit event, in the caller's transaction when there is
        one (so a key-ring write and its event commit together)."""
        with write_transaction(self.conn):
            self._ensure_table("audit")
            self.conn.execute("INSERT INTO audit(at, grant_id, event, detail) VALUES (?, ?, ?, ?)",
                              (now_utc(), grant_id, event, json.dumps(detail, sort_keys=True)))

    def events(self) -> list[dict]:
        if not self._has_table("audit"):
            return []
        rows = self.conn.execute("SELECT id, at, grant_id, event, detail FROM audit ORDER BY id")
        return [{"id": i, "at": at, "grant": g, "event": e, "detail": json.loads(d)} for i, at, g, e, d in rows]

    def label(self, grant_id: int, master: bytes) -> str | None:
        """The grant's label, opened; :class:`aead.Unsealable` when it was
        altered or moved from another grant."""
        sealed = self.notes(grant_id).label
        if sealed is None:
            return None
        return aead.open_sealed(keys.subkey(master, LABEL_KEY), sealed, label_aad(self.user_id, grant_id)).decode()

    def touch(self, grant_id: int, day: str) -> None:
        """Record ``day`` as the grant's last use, writing only when the day
        changed; best effort like :meth:`advance_head` (a full disk must not
        refuse a read), and not fsynced."""
        if self.notes(grant_id).last_used == day:
            return
        try:
            self.conn.execute("PRAGMA synchronous = NORMAL")
            try:
                with self.conn:
                    self.conn.execute("BEGIN IMMEDIATE")
                    self._ensure_notes()
                    self.conn.execute("INSERT INTO grant_notes(grant_id, last_used) VALUES (?, ?) "
                                      "ON CONFLICT(grant_id) DO UPDATE SET last_used = excluded.last_used",
                                      (grant_id, day))
            finally:
                self.conn.execute("PRAGMA synchronous = FULL")
        except (*DB_ERRORS, OSError):
            return

    def unwrap(self, grant: Grant, secret: bytes) -> bytes:
        """The master key, or :class:`aead.Unsealable` when the row was altered
        (scope, id or wrapped bytes) or belongs to someone else."""
        if grant.wrapped is None or grant.kdf is None:
            raise aead.Unsealable("grant holds no key")
        try:
            params = json.loads(grant.kdf)
            salt = bytes.fromhex(params["salt"])
            kdf = keys.KdfParams.from_dict(params)
            kek = keys.derive_kek(secret, salt, kdf)
        except (ValueError, KeyError, TypeError, OverflowError, argon2.exceptions.HashingError):
            raise aead.Unsealable("grant key derivation parameters are unreadable") from None
        expires = self.notes(grant.id).expires
        return aead.open_sealed(kek, grant.wrapped, wrap_aad(self.user_id, grant.id, grant.scope, expires))

    def checkpoint(self) -> None:
        """Fold the WAL into the file and truncate it, so a destroyed wrapped
        key is left in neither."""
        if not checkpoint(self.conn):
            raise Conflict("The key ring is busy and the revocation could not be flushed yet; it is in force — "
                           "retry the revoke shortly to flush it.", code="grants.busy")

    def grants(self) -> list[Grant]:
        rows = self.conn.execute("SELECT id, scope, created, revoked, kdf, wrapped FROM grants ORDER BY id")
        return [Grant(*r) for r in rows]

    def revoke(self, grant_id: int) -> bool:
        """Destroy the grant's wrapped key; its listing row stays. True if it was live."""
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            cur = self.conn.execute(
                "UPDATE grants SET wrapped = NULL, kdf = NULL, tag = NULL, revoked = ? "
                "WHERE id = ? AND revoked IS NULL",
                (now_utc(), grant_id),
            )
        return cur.rowcount == 1


def open_keyring(path: Path, user_id: str) -> Keyring:
    """The key ring at ``path``; :class:`MissingFile` if it is not there."""
    return Keyring(path, user_id)

