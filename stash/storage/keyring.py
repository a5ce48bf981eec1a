"""A user's key ring: the grants, and the key of the current epoch sealed to each.

The key ring is plain SQLite because it has to be read before any key is
known. Nothing in it opens anything without a token's secret. A grant row holds
a keyed hash of the secret (to find the row cheaply), the capability's X25519
public key, a *certificate* (the public key sealed under the argon2id KEK of the
secret, with user, grant id and scope in the associated data, so editing the
scope or swapping the public key makes it fail), and a *box*: the current
epoch's key sealed to that public key (stash/crypto/epochs.py). The older
epochs' keys are kept in keyring_meta, sealed under the current epoch's key.
Labels, last-used days and audit events are sealed to the owner key
(stash/crypto/owner_seal.py), which no epoch key opens.

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

from ..core.errors import Conflict, Damaged
from ..crypto import aead, epochs, inbox_seal, keys
from ..crypto.chain import Head
from ..crypto.epochs import KeyChain
from ..crypto.owner_seal import OwnerKeys, is_sealed
from ..crypto.owner_seal import seal as seal_to_owner
from . import audit_chain, formats, ring_copies
from .files import DB_ERRORS, LEGACY_PAGE_BYTES, PAGE_BYTES, connect, flush, release, write_transaction
from .idempotency import Records
from .pool import Pool
from .schema import sections

SCOPES = ("read", "full", "owner")
LABEL_KEY = b"grant-labels"  # subkey purpose: grant labels of a key ring whose owner has no owner key yet
HEAD_COPY = ring_copies.HEAD_COPY
STATE_COPY = ring_copies.STATE_COPY
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
LABEL_PAD = 66  # a sealed label's plaintext: 2-byte length + grant_terms.LABEL_MAX_BYTES, so every label is one size
AUDIT_PAD = 256  # a sealed audit event's plaintext is a multiple of this (SECURITY.md, "What the files show")


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


# The day each grant was last recorded as used by this process, so a sealed
# day (which no request but the owner's can read back) is written once a day
# per process rather than on every request.
_TOUCHED: dict[tuple[str, str, int], str] = {}


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


class Keyring:
    def __init__(self, path: Path, user_id: str, *, create: bool = False, pool: Pool | None = None,
                 ring_page_bytes: int | None = None) -> None:
        self.user_id = user_id
        self._path = path
        self._closed = False
        self._pool = pool
        self.conn = connect(path, file_key=None, cipher="none", create=create, pool=pool, page_bytes=ring_page_bytes)

    @classmethod
    def create(cls, path: Path, user_id: str, file_cipher: str, page_bytes: int = PAGE_BYTES,
               pool: Pool | None = None, ring_page_bytes: int | None = None) -> Keyring:
        """A new key ring, and the page size its memory file will be made
        with (:meth:`memory_page_bytes`); ``ring_page_bytes``: its own page
        size (a memory other than main: storage/memories.py)."""
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
            release(self.conn, self._path, None, self._pool)

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
        if n not in formats.PAGE_FORMATS:
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

    def advance_head(self, head: Head, state_version: int | None = None, *, chain: KeyChain | None = None) -> bool:
        """Record ``head`` as the copy unless the copy is already as far: it
        only moves forward, so concurrent writers finishing out of order leave
        the furthest one. Best effort (False when it could not be written, as
        on a full disk): a copy that lags is accepted by the next open when
        the log extends it, and the next write brings it up to date. For the
        same reason its commit is not fsynced (a power cut may lose it, which
        is a lag): that keeps the cost of a note at one fsync, not two.
        With ``chain`` the copies are sealed too (:mod:`ring_copies`);
        without it, a key ring whose copies are sealed is left as it is (a
        lag), never given a copy its MAC does not cover."""
        try:
            self.conn.execute("PRAGMA synchronous = NORMAL")
            try:
                with write_transaction(self.conn):
                    if chain is not None:
                        return self._advance_sealed_copies(head, state_version, chain)
                    if self.meta(ring_copies.COPIES_MAC) is not None:
                        return False
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

    def _advance_sealed_copies(self, head: Head, state_version: int | None, chain: KeyChain) -> bool:
        """:meth:`advance_head`'s work with the copies sealed, inside its
        transaction: each copy only moves forward, and the MAC is written
        even when neither moves (a key ring whose copies were never sealed)."""
        try:
            copies = ring_copies.read(self.conn, self.user_id, chain)
        except (Damaged, Conflict):
            return False  # altered meanwhile, or a newer epoch's: the next open says which
        changes = {}
        if copies.head is None or copies.head.count < head.count:
            changes[HEAD_COPY] = head.pin()
        if state_version is not None and (copies.state is None or copies.state < state_version):
            changes[STATE_COPY] = str(state_version)
        if changes or not copies.authenticated:
            ring_copies.put(self.conn, self.user_id, chain, changes)
        return True

    def copies(self, chain: KeyChain) -> ring_copies.Copies:
        """The copies kept here, checked against their MAC (:mod:`ring_copies`)."""
        return ring_copies.read(self.conn, self.user_id, chain)

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
            sealed = None if label is None else self._seal_label(grant_id, label.encode(), chain)
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
            grant_id = self._insert(scope=scope, tag=tag, secret=secret, chain=chain, kdf=kdf, expires=expires,
                                    label=label)
            if scope == "owner" and self.meta(OWNER_BOX) is None:
                # A new store's owner key, from its first moment, so that no
                # event or day is ever written in clear.
                (grant,) = self._select("WHERE id = ?", (grant_id,))
                assert grant.pub is not None  # just filed in format 2
                self._put_owner_keys(grant_id, grant.pub, OwnerKeys.new(self.user_id))
                self._mark_owner_sealed()
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
        formats.make_on_use(self.conn, "keyring_on_use", name)

    def _has_table(self, name: str) -> bool:
        return self.conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None

    def record(self, grant_id: int, event: str, detail: dict[str, object], chain: KeyChain | None = None) -> None:
        """Append one audit event, in the caller's transaction when there is
        one (so a key-ring write and its event commit together). Its time,
        grant, kind and detail are sealed to the owner key, padded
        (:data:`AUDIT_PAD`), and with ``chain`` linked to the trail's MAC
        chain (:mod:`audit_chain`); in clear only in a store whose owner has
        not made a request since this release (the owner's next request
        seals them, :meth:`owner_keys`)."""
        public = self.owner_public()
        with write_transaction(self.conn):
            self._ensure_table("audit")
            if public is None:
                row = (now_utc(), grant_id, event, json.dumps(detail, sort_keys=True))
            else:
                row = ("", 0, SEALED_EVENT, self._sealed_event(public, now_utc(), grant_id, event, detail))
            cur = self.conn.execute("INSERT INTO audit(at, grant_id, event, detail) VALUES (?, ?, ?, ?)", row)
            if public is not None and chain is not None:
                try:
                    audit_chain.append(self.conn, self.user_id, chain, int(cur.lastrowid or 0), row[3])
                except (Conflict, Damaged, ValueError):
                    # The event stays, unlinked: the write it records may have
                    # committed already, and the trail then says it is not
                    # intact (SECURITY.md, "Owner-only data").
                    pass

    def trail(self, owner: OwnerKeys, chain: KeyChain) -> tuple[list[dict[str, object]], audit_chain.Trail]:
        """Every audit event (:meth:`events`) and what the MAC chain says of
        them, read in one snapshot."""
        self.conn.execute("BEGIN")  # one snapshot for the rows and the head
        try:
            out = self.events(owner)
            rows = self.conn.execute("SELECT id, at, detail FROM audit ORDER BY id").fetchall() \
                if self._has_table("audit") else []
            head = self.meta(ring_copies.AUDIT_HEAD)
        finally:
            self.conn.execute("COMMIT")
        return out, audit_chain.check(rows, head, self.user_id, chain)

    def events(self, owner: OwnerKeys | None = None) -> list[dict[str, object]]:
        """Every audit event, oldest first; :class:`aead.Unsealable` when one
        sealed to the owner does not open with ``owner``."""
        if not self._has_table("audit"):
            return []
        out: list[dict[str, object]] = []
        for i, at, g, e, d in self.conn.execute("SELECT id, at, grant_id, event, detail FROM audit ORDER BY id"):
            if e != SEALED_EVENT:
                out.append({"id": i, "at": at, "grant": g, "event": e, "detail": json.loads(d)})
                continue
            if owner is None:
                raise aead.Unsealable("the audit opens with the owner capability only")
            try:
                sealed = bytes.fromhex(d)
            except ValueError:
                raise aead.Unsealable("a sealed audit event is unreadable") from None
            row = json.loads(owner.open(sealed, "audit"))
            out.append({"id": i, "at": row["at"], "grant": row["grant"], "event": row["event"],
                        "detail": row["detail"]})
        return out

    def label(self, grant_id: int, chain: KeyChain, owner: OwnerKeys | None = None) -> str | None:
        """The grant's label, opened; :class:`aead.Unsealable` when it was
        altered or moved from another grant, or is sealed to the owner and
        ``owner`` is not given."""
        sealed = self.notes(grant_id).label
        if sealed is None:
            return None
        if is_sealed(sealed):
            if owner is None:
                raise aead.Unsealable("a label opens with the owner capability only")
            return owner.open(sealed, f"grant_label|{grant_id}").decode()
        return aead.open_sealed(label_key(chain), sealed, label_aad(self.user_id, grant_id)).decode()

    def _seal_label(self, grant_id: int, plain: bytes, chain: KeyChain) -> bytes:
        """A label sealed to the owner key; under the epoch's label key only
        in a store whose owner has not yet been given one."""
        public = self.owner_public()
        if public is not None:
            return seal_to_owner(self.user_id, public, f"grant_label|{grant_id}", plain, pad=LABEL_PAD)
        return aead.seal(label_key(chain), plain, label_aad(self.user_id, grant_id))

    def _reseal_labels(self, old: KeyChain, new: KeyChain) -> None:
        """Move every label still under the epoch's label key to the new
        epoch's (inside the epoch's write transaction), so a revoked
        capability reads no label minted or kept after its revocation. A
        label sealed to the owner stays as it is: no epoch key opens it."""
        if not self._has_notes():
            return
        rows = self.conn.execute("SELECT grant_id, label FROM grant_notes WHERE label IS NOT NULL").fetchall()
        for grant_id, sealed in rows:
            if is_sealed(sealed):
                continue
            aad = label_aad(self.user_id, grant_id)
            plain = aead.open_sealed(label_key(old), sealed, aad)
            self.conn.execute("UPDATE grant_notes SET label = ? WHERE grant_id = ?",
                              (aead.seal(label_key(new), plain, aad), grant_id))

    # ------------------------------------------------------------ owner-only data

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

    def open_owner_keys(self, grant: Grant, kek: bytes) -> OwnerKeys | None:
        """The owner seeds in the owner box, when it is this grant's; None
        when the store has no box yet or it is another grant's."""
        text = self.meta(OWNER_BOX)
        if text is None:
            return None
        gid, _, hexbox = text.partition(":")
        pending = self.pending_owner()
        if gid != str(grant.id) and pending is not None and pending[1] == grant.id and pending[2] is not None:
            # A rotation's successor not yet presented (stash verify --token):
            # its copy of the owner seeds, boxed to it at the rotation.
            return OwnerKeys.unbox(self.user_id, grant.id, epochs.capability_private_key(kek), pending[2])
        if gid != str(grant.id):
            return None
        try:
            box = bytes.fromhex(hexbox)
        except ValueError:
            raise aead.Unsealable("the owner box is unreadable") from None
        return OwnerKeys.unbox(self.user_id, grant.id, epochs.capability_private_key(kek), box)

    def _put_owner_keys(self, grant_id: int, grant_public: bytes, owner: OwnerKeys) -> None:
        for name, value in ((OWNER_PUB, owner.public.hex()),
                            (OWNER_BOX, f"{grant_id}:{owner.box(grant_id, grant_public).hex()}")):
            self.conn.execute("INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
                              "ON CONFLICT(name) DO UPDATE SET value = excluded.value", (name, value))

    def owner_keys(self, grant: Grant, kek: bytes, chain: KeyChain) -> OwnerKeys | None:
        """The owner keys, for an owner grant: made with the store, or for a
        store made before them on the owner's first request to an owner route
        (boxed to its public key), and every
        label, audit event and last-used day written before then moved under
        them, in one transaction, once. None when the key ring cannot be
        written now (the data stays as it is, and the next owner request
        tries again) or ``grant`` is not the owner's."""
        if grant.scope != "owner":
            return None
        owner = self.open_owner_keys(grant, kek)
        if owner is not None and self.meta(OWNER_SEALED) == "1":
            return owner
        try:
            with write_transaction(self.conn):
                owner = self.open_owner_keys(grant, kek)
                if owner is None:
                    owner = OwnerKeys.new(self.user_id)
                    self._put_owner_keys(grant.id, bytes(epochs.capability_private_key(kek).public_key), owner)
                self._seal_owner_data(owner, chain)
                self._mark_owner_sealed()
        except DB_ERRORS:
            return self.open_owner_keys(grant, kek)
        return owner

    def _mark_owner_sealed(self) -> None:
        self.conn.execute("INSERT INTO keyring_meta(name, value) VALUES (?, '1') "
                          "ON CONFLICT(name) DO UPDATE SET value = excluded.value", (OWNER_SEALED,))

    def _seal_owner_data(self, owner: OwnerKeys, chain: KeyChain) -> None:
        """Seal to ``owner`` every label, audit event and last-used day still
        in clear or under an epoch key (inside the caller's transaction).
        secure_delete overwrites the cells they leave."""
        public = owner.public
        if self._has_notes():
            for grant_id, label, day in self.conn.execute(
                    "SELECT grant_id, label, last_used FROM grant_notes").fetchall():
                if label is not None and not is_sealed(label):
                    plain = aead.open_sealed(label_key(chain), label, label_aad(self.user_id, grant_id))
                    self.conn.execute("UPDATE grant_notes SET label = ? WHERE grant_id = ?",
                                      (seal_to_owner(self.user_id, public, f"grant_label|{grant_id}", plain,
                                                     pad=LABEL_PAD),
                                       grant_id))
                if day is not None and not day.startswith(SEALED_DAY):
                    self.conn.execute("UPDATE grant_notes SET last_used = ? WHERE grant_id = ?",
                                      (self._sealed_day(public, grant_id, day), grant_id))
        if self._has_table("audit"):
            for rid, at, grant_id, event, detail in self.conn.execute(
                    "SELECT id, at, grant_id, event, detail FROM audit WHERE event != ?", (SEALED_EVENT,)).fetchall():
                self.conn.execute("UPDATE audit SET at = '', grant_id = 0, event = ?, detail = ? WHERE id = ?",
                                  (SEALED_EVENT, self._sealed_event(public, at, grant_id, event,
                                                                    json.loads(detail)), rid))

    def _sealed_day(self, public: bytes, grant_id: int, day: str) -> str:
        return SEALED_DAY + seal_to_owner(self.user_id, public, f"last_used|{grant_id}", day.encode()).hex()

    def _sealed_event(self, public: bytes, at: str, grant_id: int, event: str, detail: object) -> str:
        plain = json.dumps({"at": at, "grant": grant_id, "event": event, "detail": detail}, sort_keys=True)
        return seal_to_owner(self.user_id, public, "audit", plain.encode(), pad=AUDIT_PAD).hex()

    def last_used(self, grant_id: int, owner: OwnerKeys | None) -> str | None:
        """The grant's last-used day, opened with the owner keys."""
        day = self.notes(grant_id).last_used
        if day is None or not day.startswith(SEALED_DAY):
            return day
        if owner is None:
            raise aead.Unsealable("a last-used day opens with the owner capability only")
        try:
            value = bytes.fromhex(day[len(SEALED_DAY):])
        except ValueError:
            raise aead.Unsealable("a sealed last-used day is unreadable") from None
        return owner.open(value, f"last_used|{grant_id}").decode()

    def touch(self, grant_id: int, day: str) -> None:
        """Record ``day`` as the grant's last use, sealed to the owner key:
        written once a day per grant and process (a sealed day cannot be
        read back to compare), best effort like :meth:`advance_head` (a full
        disk must not refuse a read), and not fsynced."""
        memo = (str(self._path), self.user_id, grant_id)
        if _TOUCHED.get(memo) == day:
            return
        public = self.owner_public()
        if public is None and self.notes(grant_id).last_used == day:
            _TOUCHED[memo] = day
            return
        value = day if public is None else self._sealed_day(public, grant_id, day)
        try:
            self.conn.execute("PRAGMA synchronous = NORMAL")
            try:
                with write_transaction(self.conn):
                    self._ensure_notes()
                    self.conn.execute("INSERT INTO grant_notes(grant_id, last_used) VALUES (?, ?) "
                                      "ON CONFLICT(grant_id) DO UPDATE SET last_used = excluded.last_used",
                                      (grant_id, value))
            finally:
                self.conn.execute("PRAGMA synchronous = FULL")
        except (*DB_ERRORS, OSError):  # type: ignore[misc]  # a tuple of exception classes
            return
        if len(_TOUCHED) > 100_000:
            _TOUCHED.clear()
        _TOUCHED[memo] = day

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
                      mint: dict[str, Any] | None = None, owner: OwnerKeys | None = None,
                      now: datetime | None = None) -> tuple[KeyChain, list[int], int | None]:
        """Start a new epoch: revoke the grants ``revoke`` (destroying their
        key columns), seal a fresh epoch key to every other live grant, keep
        the older keys under it, and with ``mint`` (keyword arguments of
        :meth:`_insert`) file a new grant in the same transaction (an owner
        rotation). Unmoved live grants cannot be reached without their
        secrets, so they are revoked too and returned. A grant whose expiry
        is at or before ``now`` (the clock when None) is revoked as well: it
        receives no key of this epoch or any later one, whatever clock a
        server that later opens these files keeps. One transaction: a crash
        leaves the old epoch or the new one, whole. Returns the new chain,
        the unmoved grants revoked with it, and the minted grant id. With
        ``owner`` (the owner keys, on a rotation) the minted owner grant gets
        them with a fresh seed added, and the labels move to that seed, so the
        rotated-away owner token opens nothing sealed to the owner after it."""
        if mint is not None and mint.get("scope") == "owner" and owner is None and self.meta(OWNER_BOX) is not None:
            # The new owner grant would get no owner box, and everything
            # sealed to the owner so far would stay closed to it.
            raise ValueError("an owner rotation needs the owner keys")
        new = chain.advance()
        now = datetime.now(UTC) if now is None else now
        at = now.replace(microsecond=0).isoformat().replace("+00:00", "Z")
        stranded: list[int] = []
        minted = None
        with write_transaction(self.conn):
            self._select("LIMIT 0", ())
            self._check_epoch(chain)
            for g in self._select("WHERE revoked IS NULL ORDER BY id", ()):
                if g.id in revoke or not g.moved or expired(self.notes(g.id).expires, now):
                    self.conn.execute(
                        "UPDATE grants SET wrapped = NULL, kdf = NULL, tag = NULL, pub = NULL, box = NULL, "
                        "revoked = ? WHERE id = ?", (at, g.id))
                    if g.id not in revoke and not g.moved:
                        stranded.append(g.id)
                else:
                    assert g.pub is not None  # a moved grant has its public key
                    self.conn.execute("UPDATE grants SET box = ? WHERE id = ?",
                                      (epochs.box_epoch(g.pub, new.epoch, new.current), g.id))
            self._reseal_labels(chain, new)
            older = new.seal_older()
            assert older is not None  # a new epoch is past epoch 0
            for name, value in ((EPOCH, str(new.epoch)), (OLDER_KEYS, older.hex()),
                                (inbox_seal.PUBLIC_META, inbox_seal.public_text(new))):
                self.conn.execute("INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
                                  "ON CONFLICT(name) DO UPDATE SET value = excluded.value", (name, value))
            ring_copies.rekey(self.conn, self.user_id, chain, new)  # a copy from before this epoch fails its MAC
            if mint is not None:
                minted = self._insert(chain=new, **mint)
                if owner is not None and mint.get("scope") == "owner":
                    fresh = owner.advance()
                    (grant,) = self._select("WHERE id = ?", (minted,))
                    assert grant.pub is not None  # just minted in format 2
                    self._put_owner_keys(minted, grant.pub, fresh)
                    self._reseal_owner_labels(owner, fresh)
        return new, stranded, minted

    def _reseal_owner_labels(self, old: OwnerKeys, new: OwnerKeys) -> None:
        if not self._has_notes():
            return
        for grant_id, label in self.conn.execute(
                "SELECT grant_id, label FROM grant_notes WHERE label IS NOT NULL").fetchall():
            if is_sealed(label):
                what = f"grant_label|{grant_id}"
                self.conn.execute("UPDATE grant_notes SET label = ? WHERE grant_id = ?",
                                  (seal_to_owner(self.user_id, new.public, what, old.open(label, what),
                                                 pad=LABEL_PAD),
                                   grant_id))

    # ------------------------------------------------------------ owner rotation

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

    def rotate_owner(self, chain: KeyChain, old_id: int, mint: dict[str, Any],
                     owner: OwnerKeys | None) -> tuple[KeyChain, list[int], int]:
        """File a successor to owner grant ``old_id`` (keyword arguments of
        :meth:`_insert`) that reaches the current epoch, and record it as
        pending (:data:`OWNER_NEXT`, with the owner seeds boxed to it), in one
        transaction. The old grant stays the owner until the successor is first
        presented (:meth:`retire_owner`), so an answer lost to a crash or a cut
        connection never leaves the owner without a working token. A successor
        of an earlier rotation that was never presented is revoked here, with
        a new epoch, since its token may be in a lost answer. Returns the chain
        now current, the grants revoked with it and the successor's id."""
        if owner is None and self.meta(OWNER_BOX) is not None:
            raise ValueError("an owner rotation needs the owner keys")
        with write_transaction(self.conn):
            self._select("LIMIT 0", ())
            self._check_epoch(chain)
            stranded: list[int] = []
            pending = self.pending_owner()
            earlier = [] if pending is None or pending[0] != old_id else [pending[1]]
            live_earlier = [g for g in earlier if any(x.id == g for x in self._select(
                "WHERE id = ? AND revoked IS NULL", (g,)))]
            if live_earlier:
                chain, stranded, _ = self.advance_epoch(chain, tuple(live_earlier))
                stranded = [*live_earlier, *stranded]
            minted = self._insert(chain=chain, **mint)
            (grant,) = self._select("WHERE id = ?", (minted,))
            assert grant.pub is not None  # just filed in format 2
            box = "" if owner is None else owner.box(minted, grant.pub).hex()
            self.conn.execute("INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
                              "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                              (OWNER_NEXT, f"{old_id}:{minted}:{box}"))
        return chain, stranded, minted

    def retire_owner(self, chain: KeyChain, grant: Grant, kek: bytes) -> KeyChain | None:
        """The first use of a rotation's successor ``grant`` (opened with
        ``kek``): revoke the owner grant it succeeds with a new epoch, hand
        it the owner keys with a fresh seed and re-seal the labels to it (so
        the rotated-away token opens nothing sealed to the owner, or written,
        from now on), in one transaction. Returns the new chain, or None when
        ``grant`` is no pending successor (retired already, by a concurrent
        first use: the caller opens the grant again)."""
        with write_transaction(self.conn):
            pending = self.pending_owner()
            if pending is None or pending[1] != grant.id or self.epoch() != chain.epoch:
                return None
            old_id = pending[0]
            owner = self.open_owner_keys(grant, kek)
            new, _, _ = self.advance_epoch(chain, (old_id,))
            (fresh_grant,) = self._select("WHERE id = ?", (grant.id,))
            if owner is not None:
                assert fresh_grant.pub is not None
                fresh = owner.advance()
                self._put_owner_keys(grant.id, fresh_grant.pub, fresh)
                self._reseal_owner_labels(owner, fresh)
            self.conn.execute("DELETE FROM keyring_meta WHERE name = ?", (OWNER_NEXT,))
            if self._has_table("idempotency"):
                # Every record here is an owner route's, sealed to the retired
                # token: the rotation's (holding the new token) must not
                # outlive the moment its old token stops being the owner.
                self.conn.execute("DELETE FROM idempotency")
        return new

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


def open_keyring(path: Path, user_id: str, pool: Pool | None = None) -> Keyring:
    """The key ring at ``path``; :class:`MissingFile` if it is not there.
    ``pool``: where its connection may be kept between requests."""
    return Keyring(path, user_id, pool=pool)

