"""A user's key ring: the grants, and the key of the current epoch sealed to each.

The key ring is plain SQLite because it has to be read before any key is
known. Nothing in it opens anything without a token's secret. A grant row holds
a keyed hash of the secret (to find the row cheaply), the capability's X25519
public key, a *certificate* (the public key sealed under the argon2id KEK of the
secret, with user, grant id and scope in the associated data, so editing the
scope or swapping the public key makes it fail), and a *box*: the current
epoch's key sealed to that public key (stash/crypto/epochs.py). The older
epochs' keys are kept in keyring_meta, sealed under the current epoch's key.

Format 1 (before epochs) held the store's one key wrapped under each KEK in
``wrapped`` and had no ``pub``/``box`` columns; such a grant is *unmoved*. Its
key is epoch 0's key, so it keeps working until a revocation, and it moves to
the new scheme the next time its token is used (the only moment its secret is
present): :meth:`Keyring.move_grant`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import argon2.exceptions

from ..core.errors import Conflict
from ..crypto import aead, epochs, keys
from ..crypto.chain import Head
from ..crypto.epochs import KeyChain
from .files import DB_ERRORS, LEGACY_PAGE_BYTES, PAGE_BYTES, connect, flush, release, write_transaction
from .idempotency import Records
from .schema import sections

SCOPES = ("read", "full", "owner")
LABEL_KEY = b"grant-labels"  # subkey purpose: the key that seals grant labels
HEAD_COPY = "log_head"
STATE_COPY = "state_version"
EPOCH = "epoch"
OLDER_KEYS = "epoch_keys"
MEMORY_PAGES = "memory_page_bytes"  # the page size memory.db is read with (schema.sql, "Pages")
FORMAT = "2"
_COLUMNS = "id, scope, created, revoked, kdf, wrapped, pub, box"


def wrap_aad(user_id: str, grant_id: int, scope: str) -> bytes:
    """Associated data of a format-1 wrap (the store's key under the KEK)."""
    return f"stash/v1|{user_id}|grant|{grant_id}|{scope}".encode()


def label_aad(user_id: str, grant_id: int) -> bytes:
    return f"stash/v1|{user_id}|grant_label|{grant_id}".encode()


@dataclass(frozen=True)
class GrantNotes:
    label: bytes | None  # sealed under the current epoch's label key
    expires: str | None
    last_used: str | None


def cert_aad(user_id: str, grant_id: int, scope: str, expires: str | None = None) -> bytes:
    """Associated data of a certificate (the public key under the KEK). A
    grant with an expiry binds it too, so it cannot be extended or removed by
    editing the key ring."""
    aad = f"stash/v2|{user_id}|grant|{grant_id}|{scope}"
    return (aad if expires is None else f"{aad}|expires|{expires}").encode()


def label_key(chain: KeyChain) -> bytes:
    """The key that seals grant labels in the current epoch."""
    return keys.subkey(chain.current, LABEL_KEY)


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


class Keyring:
    def __init__(self, path: Path, user_id: str, *, create: bool = False) -> None:
        self.user_id = user_id
        self._path = path
        self._closed = False
        self.conn = connect(path, file_key=None, cipher="none", create=create)

    @classmethod
    def create(cls, path: Path, user_id: str, file_cipher: str, page_bytes: int = PAGE_BYTES) -> Keyring:
        """A new key ring, and the page size its memory file will be made
        with (:meth:`memory_page_bytes`)."""
        if page_bytes not in (PAGE_BYTES, LEGACY_PAGE_BYTES):
            raise ValueError("not a page size this release reads")
        ring = cls(path, user_id, create=True)
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
            release(self.conn, self._path, None)

    def __enter__(self) -> Keyring:
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
        if n not in (PAGE_BYTES, LEGACY_PAGE_BYTES):
            raise ValueError("the key ring's record of the memory file's page size is unreadable")
        return n

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

    def state_version(self) -> int | None:
        """The copy of the memory file's state version kept here (see
        MemoryFile._state_digest), or None before the file had one."""
        text = self.meta(STATE_COPY)
        try:
            return None if text is None else int(text)
        except ValueError:
            raise ValueError("the key ring's copy of the state version is unreadable") from None

    def advance_head(self, head: Head, state_version: int | None = None) -> bool:
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
                with write_transaction(self.conn):
                    current = self.log_head()
                    if current is None or current.count < head.count:
                        self.conn.execute(
                            "INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
                            "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                            (HEAD_COPY, head.pin()),
                        )
                    copy = self.state_version()
                    if state_version is not None and (copy is None or copy < state_version):
                        self.conn.execute(
                            "INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
                            "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                            (STATE_COPY, str(state_version)),
                        )
            finally:
                self.conn.execute("PRAGMA synchronous = FULL")
        except (*DB_ERRORS, ValueError, OSError):  # type: ignore[misc]  # a tuple of exception classes
            return False
        return True

    def _upgrade(self) -> None:
        """Give a format-1 key ring the columns of format 2 (once; the ALTERs
        and the format mark commit together)."""
        with write_transaction(self.conn):
            have = {r[1] for r in self.conn.execute("PRAGMA table_info(grants)")}
            for column in ("pub", "box"):
                if column not in have:
                    self.conn.execute(f"ALTER TABLE grants ADD COLUMN {column} BLOB")
            self.conn.execute("UPDATE keyring_meta SET value = ? WHERE name = 'format'", (FORMAT,))

    def _select(self, where: str, args: tuple[object, ...]) -> list[Grant]:
        try:
            rows = self.conn.execute(f"SELECT {_COLUMNS} FROM grants {where}", args).fetchall()
        except DB_ERRORS as exc:
            if "no such column" not in str(exc):
                raise
            try:
                self._upgrade()
            except DB_ERRORS:
                # A key ring that cannot be written (a read-only folder) is read as format 1.
                rows = self.conn.execute(f"SELECT {_COLUMNS.rsplit(', ', 2)[0]}, NULL, NULL FROM grants {where}",
                                         args).fetchall()
                return [Grant(*r) for r in rows]
            rows = self.conn.execute(f"SELECT {_COLUMNS} FROM grants {where}", args).fetchall()
        return [Grant(*r) for r in rows]

    def find(self, tag: bytes) -> Grant | None:
        found = self._select("WHERE tag = ?", (tag,))
        return found[0] if found else None

    def epoch(self) -> int:
        text = self.meta(EPOCH)
        try:
            n = 0 if text is None else int(text)
        except ValueError:
            raise aead.Unsealable("the key ring's epoch number is unreadable") from None
        if not 0 <= n < epochs.MAX_EPOCHS:
            raise aead.Unsealable("the key ring's epoch number is out of range")
        return n

    def _older(self) -> bytes | None:
        text = self.meta(OLDER_KEYS)
        try:
            return None if text is None else bytes.fromhex(text)
        except ValueError:
            raise aead.Unsealable("the key ring's older epoch keys are unreadable") from None

    def _insert(self, *, scope: str, tag: bytes, secret: bytes, chain: KeyChain, kdf: keys.KdfParams,
                expires: str | None = None, label: str | None = None) -> int:
        """File a grant whose box holds ``chain``'s current key (inside a
        write transaction). The id is allotted first because the certificate
        binds it (and ``expires``, when given); ``label`` is sealed under the
        current epoch's label key, bound to the user and the grant id."""
        if scope not in SCOPES:
            raise ValueError("unknown scope")
        salt = keys.new_salt()
        kek = keys.derive_kek(secret, salt, kdf)
        pub = bytes(epochs.capability_private_key(kek).public_key)
        cur = self.conn.execute("INSERT INTO grants(tag, scope, created) VALUES (?, ?, ?)", (tag, scope, now_utc()))
        grant_id = int(cur.lastrowid or 0)
        self.conn.execute(
            "UPDATE grants SET kdf = ?, wrapped = ?, pub = ?, box = ? WHERE id = ?",
            (json.dumps({**kdf.as_dict(), "salt": salt.hex()}),
             aead.seal(kek, pub, cert_aad(self.user_id, grant_id, scope, expires)), pub,
             epochs.box_epoch(pub, chain.epoch, chain.current), grant_id),
        )
        if expires is not None or label is not None:
            sealed = None if label is None else aead.seal(
                label_key(chain), label.encode(), label_aad(self.user_id, grant_id))
            self._ensure_notes()
            self.conn.execute("INSERT INTO grant_notes(grant_id, label, expires) VALUES (?, ?, ?)",
                              (grant_id, sealed, expires))
        return grant_id

    def _check_epoch(self, chain: KeyChain) -> None:
        if self.epoch() != chain.epoch:
            raise Conflict("A capability was revoked while this request ran, so nothing was changed; retry it.",
                           code="grants.busy")

    def add(self, *, scope: str, tag: bytes, secret: bytes, chain: KeyChain, kdf: keys.KdfParams,
            expires: str | None = None, label: str | None = None) -> int:
        """A new capability that reaches the current epoch. Refused (409) if a
        revocation moved the epoch since ``chain`` was opened: the new box
        would hold a key that is no longer current."""
        with write_transaction(self.conn):
            self._select("LIMIT 0", ())  # a format-1 ring gets its columns first
            self._check_epoch(chain)
            return self._insert(scope=scope, tag=tag, secret=secret, chain=chain, kdf=kdf, expires=expires,
                                label=label)

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
        keyring = sections()["keyring_on_use"]
        start = keyring.index(f"CREATE TABLE IF NOT EXISTS {name} ")
        self.conn.execute(keyring[start:keyring.index(");", start) + 2])

    def _has_table(self, name: str) -> bool:
        return self.conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None

    def record(self, grant_id: int, event: str, detail: dict[str, object]) -> None:
        """Append one audit event, in the caller's transaction when there is
        one (so a key-ring write and its event commit together)."""
        with write_transaction(self.conn):
            self._ensure_table("audit")
            self.conn.execute("INSERT INTO audit(at, grant_id, event, detail) VALUES (?, ?, ?, ?)",
                              (now_utc(), grant_id, event, json.dumps(detail, sort_keys=True)))

    def events(self) -> list[dict[str, object]]:
        if not self._has_table("audit"):
            return []
        rows = self.conn.execute("SELECT id, at, grant_id, event, detail FROM audit ORDER BY id")
        return [{"id": i, "at": at, "grant": g, "event": e, "detail": json.loads(d)} for i, at, g, e, d in rows]

    def label(self, grant_id: int, chain: KeyChain) -> str | None:
        """The grant's label, opened; :class:`aead.Unsealable` when it was
        altered or moved from another grant."""
        sealed = self.notes(grant_id).label
        if sealed is None:
            return None
        return aead.open_sealed(label_key(chain), sealed, label_aad(self.user_id, grant_id)).decode()

    def _reseal_labels(self, old: KeyChain, new: KeyChain) -> None:
        """Move every label to the new epoch's label key (inside the epoch's
        write transaction), so a revoked capability reads no label minted or
        kept after its revocation."""
        if not self._has_notes():
            return
        rows = self.conn.execute("SELECT grant_id, label FROM grant_notes WHERE label IS NOT NULL").fetchall()
        for grant_id, sealed in rows:
            aad = label_aad(self.user_id, grant_id)
            plain = aead.open_sealed(label_key(old), sealed, aad)
            self.conn.execute("UPDATE grant_notes SET label = ? WHERE grant_id = ?",
                              (aead.seal(label_key(new), plain, aad), grant_id))

    def touch(self, grant_id: int, day: str) -> None:
        """Record ``day`` as the grant's last use, writing only when the day
        changed; best effort like :meth:`advance_head` (a full disk must not
        refuse a read), and not fsynced."""
        if self.notes(grant_id).last_used == day:
            return
        try:
            self.conn.execute("PRAGMA synchronous = NORMAL")
            try:
                with write_transaction(self.conn):
                    self._ensure_notes()
                    self.conn.execute("INSERT INTO grant_notes(grant_id, last_used) VALUES (?, ?) "
                                      "ON CONFLICT(grant_id) DO UPDATE SET last_used = excluded.last_used",
                                      (grant_id, day))
            finally:
                self.conn.execute("PRAGMA synchronous = FULL")
        except (*DB_ERRORS, OSError):  # type: ignore[misc]  # a tuple of exception classes
            return

    def open_grant(self, grant: Grant, secret: bytes) -> Opened:
        """Every epoch key this grant reaches, or :class:`aead.Unsealable` when
        the row was altered (scope, id, public key, certificate or box) or
        belongs to someone else, or :class:`StaleGrant` when its box is from
        an older epoch than the key ring's (a revoked row put back)."""
        if grant.wrapped is None or grant.kdf is None:
            raise aead.Unsealable("grant holds no key")
        try:
            params = json.loads(grant.kdf)
            salt = bytes.fromhex(params["salt"])
            kdf = keys.KdfParams.from_dict(params)
            kek = keys.derive_kek(secret, salt, kdf)
        except (ValueError, KeyError, TypeError, OverflowError, argon2.exceptions.HashingError):
            raise aead.Unsealable("grant key derivation parameters are unreadable") from None
        n = self.epoch()
        if not grant.moved:
            key = aead.open_sealed(kek, grant.wrapped, wrap_aad(self.user_id, grant.id, grant.scope))
            if n != 0:
                # A revocation revokes every unmoved grant with it, so a live
                # one past epoch 0 was put back from an older copy.
                raise StaleGrant()
            return Opened(KeyChain(self.user_id, (key,)), True, kek)
        private = epochs.capability_private_key(kek)
        expires = self.notes(grant.id).expires
        pub = aead.open_sealed(kek, grant.wrapped, cert_aad(self.user_id, grant.id, grant.scope, expires))
        if pub != grant.pub or pub != bytes(private.public_key) or grant.box is None:
            raise aead.Unsealable("the grant's public key does not match its certificate")
        boxed, current = epochs.open_box(private, grant.box)
        if boxed < n:
            raise StaleGrant()
        if boxed != n:
            raise aead.Unsealable("the grant's box is from an epoch the key ring has not reached")
        return Opened(KeyChain.open(self.user_id, n, current, self._older()), False, kek)

    def move_grant(self, grant: Grant, opened: Opened) -> bool:
        """Move an unmoved (format-1) grant to the epoch scheme: public key,
        certificate and a box of epoch 0, replacing the wrap of the store's
        key. Only while the key ring is at epoch 0 (past it an unmoved grant
        is revoked). Best effort: False when the ring cannot be written now;
        the next use tries again."""
        if grant.moved or opened.chain.epoch != 0:
            return False
        pub = bytes(epochs.capability_private_key(opened.kek).public_key)
        try:
            with write_transaction(self.conn):
                if self.epoch() != 0:
                    return False
                cur = self.conn.execute(
                    "UPDATE grants SET wrapped = ?, pub = ?, box = ? WHERE id = ? AND wrapped = ? AND pub IS NULL",
                    (aead.seal(opened.kek, pub, cert_aad(self.user_id, grant.id, grant.scope)), pub,
                     epochs.box_epoch(pub, 0, opened.chain.current), grant.id, grant.wrapped),
                )
        except DB_ERRORS:
            return False
        return cur.rowcount == 1

    def advance_epoch(self, chain: KeyChain, revoke: tuple[int, ...], *,
                      mint: dict[str, Any] | None = None) -> tuple[KeyChain, list[int], int | None]:
        """Start a new epoch: revoke the grants ``revoke`` (destroying their
        key columns), seal a fresh epoch key to every other live grant, keep
        the older keys under it, and with ``mint`` (keyword arguments of
        :meth:`_insert`) file a new grant in the same transaction (an owner
        rotation). Unmoved live grants cannot be reached without their
        secrets, so they are revoked too and returned. One transaction: a
        crash leaves the old epoch or the new one, whole. Returns the new
        chain, the unmoved grants revoked with it, and the minted grant id."""
        new = chain.advance()
        at = now_utc()
        stranded: list[int] = []
        minted = None
        with write_transaction(self.conn):
            self._select("LIMIT 0", ())
            self._check_epoch(chain)
            for g in self._select("WHERE revoked IS NULL ORDER BY id", ()):
                if g.id in revoke or not g.moved:
                    self.conn.execute(
                        "UPDATE grants SET wrapped = NULL, kdf = NULL, tag = NULL, pub = NULL, box = NULL, "
                        "revoked = ? WHERE id = ?", (at, g.id))
                    if g.id not in revoke:
                        stranded.append(g.id)
                else:
                    assert g.pub is not None  # a moved grant has its public key
                    self.conn.execute("UPDATE grants SET box = ? WHERE id = ?",
                                      (epochs.box_epoch(g.pub, new.epoch, new.current), g.id))
            self._reseal_labels(chain, new)
            older = new.seal_older()
            assert older is not None  # a new epoch is past epoch 0
            for name, value in ((EPOCH, str(new.epoch)), (OLDER_KEYS, older.hex())):
                self.conn.execute("INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
                                  "ON CONFLICT(name) DO UPDATE SET value = excluded.value", (name, value))
            if mint is not None:
                minted = self._insert(chain=new, **mint)
        return new, stranded, minted

    def unmoved_live(self) -> int:
        """How many live grants still have to move to the epoch scheme."""
        return sum(1 for g in self._select("WHERE revoked IS NULL", ()) if not g.moved)

    def flush(self) -> bool:
        """Fold the WAL into the file and truncate it, so a destroyed wrapped
        key is left in neither (:func:`files.flush`); False when it could not
        be done yet (every later close of the key ring tries again)."""
        return flush(self.conn)

    def grants(self) -> list[Grant]:
        return self._select("ORDER BY id", ())


def open_keyring(path: Path, user_id: str) -> Keyring:
    """The key ring at ``path``; :class:`MissingFile` if it is not there."""
    return Keyring(path, user_id)

