"""Who may open which memory: identities, capability checks, sessions.

A request's key material lives only inside :meth:`Vault.session`: the KEK is
derived, the capability's box opened to the current epoch key (and through it
every older one), the memory file opened with keys derived from them, and on
exit every reference is dropped. Nothing is cached across
requests. (Python cannot promise to zero freed memory; no key is kept in any
structure that outlives the request.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from ..core.errors import (
    Conflict,
    Damaged,
    Forbidden,
    Misdirected,
    Moving,
    NotFound,
    RolledBack,
    StashError,
    Unauthorized,
    Unavailable,
)
from ..crypto import aead, keys, tokens
from ..crypto.chain import Head
from ..crypto.epochs import KeyChain
from ..crypto.owner_seal import OwnerKeys
from ..storage import cipher_swap, memfile, memories, safeopen, userlock
from ..storage.disk_errors import MissingFile, storage_error
from ..storage.formats import LEGACY_PAGE_BYTES, PAGE_BYTES
from ..storage.keyring import Grant, Keyring, Opened, StaleGrant, inbox, now_utc, open_keyring, state_copies
from ..storage.layout import UserFiles
from ..storage.memfile import KeysBehind, MemoryFile, ResealDue
from ..storage.memfile.bound import BOUND_MARK
from ..storage.memories import MAIN, NAME_PATTERN, MemoryFiles, usage, valid_name
from ..storage.private_files import can_write, private_folder
from ..storage.recallcache import rendered_log
from ..storage.sqlite.connections import available_file_cipher, new_pool
from ..storage.sqlite.transactions import write_transaction

__all__ = ["MAIN", "NAME_PATTERN", "valid_name"]  # the web edge names memories through this module, never storage
from ..storage.sqlite.pool import Pool
from . import append, grant_label_expiry, handover
from .memory import Memory
from .session_end import Pending
from .tag_index import TagIndex

RANK = {"append": -1, "read": 0, "full": 1, "owner": 2}


def allowed(scope: str, need: str) -> bool:
    """Scopes nest read < full < owner; append may only note, which full and owner may too."""
    if need == "append":
        return scope in ("append", "full", "owner")
    return scope != "append" and RANK[scope] >= RANK[need]


def unknown_memory() -> NotFound:
    """One answer for a memory that is not there and one the capability is not bound to."""
    return NotFound(
        "No such memory for this capability; an owner lists them with GET /memories.", code="memory.unknown"
    )


def capability_key(secret: bytes) -> bytes:
    """Derived from a token's secret, which is never stored: seals what only
    that capability may read back (the record of a minted token, a rotation's
    new owner token)."""
    return keys.subkey(secret, b"capability-idempotency")


@dataclass
class Session:
    """One authenticated request. The memory file is opened only when asked
    (:meth:`open_memory`), so the key-ring routes (grants, store destruction) work even when the memory
    file is damaged: an owner can still revoke a leaked token."""

    user_id: str
    scope: str
    grant_id: int
    keyring: Keyring
    files: UserFiles
    cipher: str
    # Epoch 0's key: the root of the file key and the log digest's key.
    master: bytes = field(repr=False, default=b"")
    # Every epoch key; rows are sealed under the current one.
    chain: KeyChain | None = field(repr=False, default=None)
    # Derived from the token's secret, which is never stored: seals what only
    # this capability may read back (the record of a minted token).
    capability_key: bytes = field(repr=False, default=b"")
    pin: Head | None = None
    # The memory file's page size, as the key ring records it (older stores: 16 KiB).
    page_bytes: int = LEGACY_PAGE_BYTES
    # The owner keys (labels, audit, last-used days), in an owner session only.
    owner: OwnerKeys | None = field(repr=False, default=None)
    # Where the memory file's connection may be kept for the next request (Vault.keeping_files_open).
    pool: Pool | None = field(repr=False, default=None)
    # Which memory of the identity this session acts on (docs/DESIGN.md, "Memories").
    memory_name: str = "main"
    # Main's key ring (the same object as ``keyring`` for main): the tags of other memories' capabilities.
    main_keyring: Keyring | None = field(repr=False, default=None)
    # The token's secret, in an owner session only: what enrols the owner in a new memory.
    owner_secret: bytes = field(repr=False, default=b"")
    _memory: Memory | None = field(repr=False, default=None)
    _copy: Head | None = field(repr=False, default=None)
    _state_copy: int | None = field(repr=False, default=None)
    _lock: userlock.UserLock | None = field(repr=False, default=None)

    @property
    def keys(self) -> KeyChain:
        """Every epoch key, while the session lasts."""
        if self.chain is None:
            raise RuntimeError("the session has ended")
        return self.chain

    def open_memory(self) -> Memory:
        """Open the memory, once per session (a later call answers the same
        one), and check it before anything is served: the end of its log
        against the head recorded in the file (MemoryFile), that head against
        the copy in the key ring, and, when the client pinned one, against
        the client's. Opening takes the user's lock shared, finishes a cipher
        swap or a re-seal a crash left behind, and folds the append notes
        waiting in the key ring; so it is called where a request first needs
        the memory, never by the key-ring routes (a damaged memory file must
        not stop an owner revoking a leaked token)."""
        if self._memory is None:
            if self.scope == "append":
                raise Forbidden("This capability is scoped append; it may only note (POST /note).", code="auth.scope")
            if not self.master:
                raise RuntimeError("the session has ended")
            self._lock = userlock.UserLock(self.files.folder)
            self._lock.acquire_shared()
            self._settle_cipher()
            # The copy is read before the file is opened: it is written only
            # after the file commits, so read in this order it is never ahead
            # of the file unless the file was rolled back.
            copies = self.keyring.copies(self.keys)  # their MAC checked (storage/keyring/state_copies.py)
            copy, state_copy = copies.head, copies.state
            recorded = state_copies.state_required(self.keyring.conn, copies)
            try:
                try:
                    mf = MemoryFile(
                        self.files.memory,
                        self.keyring.user_id,
                        self.keys,
                        self.cipher,
                        page_bytes=self.page_bytes,
                        recorded=recorded,
                        pool=self.pool,
                        reseal=False,
                    )
                except ResealDue:
                    # A revocation committed and its re-seal has not run yet:
                    # run it now, alone (no request still under the old keys).
                    self._lock.release()
                    with userlock.exclusive(self.files.folder):
                        if self.pool is not None:
                            self.pool.drop_folder(self.files.folder, held=True)
                        MemoryFile(
                            self.files.memory,
                            self.keyring.user_id,
                            self.keys,
                            self.cipher,
                            page_bytes=self.page_bytes,
                            recorded=recorded,
                        ).close()
                    self._lock.acquire_shared()
                    mf = MemoryFile(
                        self.files.memory,
                        self.keyring.user_id,
                        self.keys,
                        self.cipher,
                        page_bytes=self.page_bytes,
                        recorded=recorded,
                        pool=self.pool,
                    )
            except KeysBehind:
                self._lock.release()
                self._lock = None
                if self.keyring.epoch() > self.keys.epoch:
                    raise Conflict(
                        "A capability was revoked while this request was being opened, so nothing was done; retry it.",
                        code="store.rekeyed",
                    ) from None
                raise
            try:
                mf.check_copy(copy)
                mf.check_state_copy(state_copy)
                mf.check_ring_sealed(copies.authenticated)
                if not copies.authenticated or mf.format_mark() != BOUND_MARK:
                    # An older store: its copies sealed first, then the file's
                    # format authenticated (in that order: storage/keyring/state_copies.py).
                    head, version = mf.committed()
                    if self.keyring.advance_head(head, version, chain=self.keys):
                        mf.authenticate_format()
                if self.pin is not None:
                    mf.check_pin(self.pin)
                mf.writer = self.grant_id  # sealed into every memory and summary it writes
                append.fold(self, mf)  # an append capability's notes join the log before anything is read
                self._memory = Memory(mf, writes=self.scope != "read")
            except BaseException:
                mf.close()
                raise
            self._copy = copy
            self._state_copy = state_copy
        return self._memory

    def _settle_cipher(self) -> None:
        """Read the file's cipher again under the lock: ``stash migrate`` may
        have made it plain since the key ring was read (storage/cipher_swap.py),
        and a move a crash stopped after its commit is finished here first."""
        assert self._lock is not None
        self.cipher = self.keyring.meta("file_cipher") or "none"
        if self.cipher == "none" and cipher_swap.pending(self.files.folder):
            self._lock.release()
            with userlock.exclusive(self.files.folder):
                if self.pool is not None:
                    self.pool.drop_folder(self.files.folder, held=True)
                if (self.keyring.meta("file_cipher") or "none") == "none":
                    cipher_swap.finish(self.files.folder)
            self._lock.acquire_shared()

    def publish_head(self) -> None:
        """Bring the key ring's copy of the head and state version up to what
        the memory file has committed (after a write, or for a store that had
        none): read back from the file (MemoryFile.committed), never taken
        from what this request meant to write, so a rolled-back write leaves
        no trace in the copy. Called once the request's work is done; best
        effort, since a copy that lags is accepted by the next open
        (Keyring.advance_head)."""
        if self._memory is None or self.chain is None or self._memory.mf.conn.in_transaction:
            return  # nothing opened, the session ended early (a destroyed store), or a write is still open
        mf = self._memory.mf
        head, version = mf.committed()
        if (
            self._copy is None
            or self._copy.count < head.count
            or self._state_copy is None
            or self._state_copy < version
        ):
            erased = len(mf.erased_ids)
            if erased != self.keyring.erased_count():
                usage.forget_usage(self.user_id)  # the quota's room changed
            self.keyring.advance_head(head, version, chain=self.chain, erased=erased)
            memories.note_write_day(self.keyring, datetime.now(UTC).date().isoformat())

    def flush_memory(self) -> bool:
        """After an erasure committed, leave nothing of what it erased in
        any file of the memory's folder: the WALs of the memory file (the
        page versions that held the destroyed keys), of its key ring (where
        an append capability's notes waited, sealed to a key every
        read-capable holder has) and of the recall cache (its pieces) are
        folded into their files and truncated; the pages freed in them were
        zeroed as they were freed (``secure_delete``). Every erasure ends
        here: POST /erase, /erase/undo and /memories/erase, in any memory.

        It takes no lock of its own beyond the shared hold of the user's lock
        every request has: each file's flush holds that file's other writers
        back for a bounded moment at a time, never its readers
        (:func:`files.flush`), so an agent's note waits at most that moment.
        False when a reader kept a WAL busy past the flush's wait (the
        erasure is in force; every later close of the file retries it)."""
        mf = self.open_memory().mf
        done = [mf.flush(), self.keyring.flush(), rendered_log.flush(self.files.folder)]
        return all(done)

    def close(self) -> None:
        """End the session: drop every key, close the file and let a backup
        in. Writes nothing."""
        self.master = b""
        self.chain = None
        self.capability_key = b""
        self.owner_secret = b""
        try:
            if self._memory is not None:
                self._memory.mf.close()
        finally:
            if self._lock is not None:
                self._lock.release()


@dataclass(frozen=True)
class Identity:
    user_id: str
    token: str
    file_cipher: str


class Placed(Protocol):
    """What a host of a fleet holds now (stash/fleet/host.py, ``Adopted``)."""

    def held(self) -> frozenset[str]:
        """The first hex digits of the user ids this host serves."""
        ...

    def epoch(self) -> int | None:
        """The epoch of the placement it serves by (None: none yet)."""
        ...

    def draining(self) -> frozenset[str]:
        """The first hex digits of the held shards on their way to another host."""
        ...

    def drained(self) -> dict[str, Any] | None:
        """Which draining shards have everything written in their replica, and at which epoch."""
        ...

    def restoring(self, user_id: str) -> bool:
        """Whether the user belongs to a shard being restored here and is not back yet."""
        ...


ELSEWHERE = "This host does not serve this user's shard now; send requests through the fleet's router."
MOVING = "This user's shard is moving to another host of the fleet; nothing was done. Send the request again shortly."
MOVING_WAIT_S = 2
RESTORING = (
    "This user's shard has just come to this host and this user is being restored now; nothing was done. "
    "Send the request again in a second."
)
RESTORING_WAIT_S = 1
NO_SHARD = "This host holds no shard now, so it mints no identity; send /init through the fleet's router."


class Vault:
    """All users' stores under one data directory."""

    def __init__(
        self,
        data_dir: Path,
        kdf: keys.KdfParams = keys.DEFAULT_KDF,
        file_cipher: str | None = None,
        id_prefixes: tuple[str, ...] = (),
        page_bytes: int = PAGE_BYTES,
        placed: Placed | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.placed = placed  # a host of a fleet: the shards it holds now; None: every user is served here
        # The page size of the memory files this vault creates: 4 KiB; 16 KiB
        # (the old size) only for bench/pages.py, which weighs the two.
        self.page_bytes = page_bytes
        self.id_prefixes = id_prefixes  # user ids this host mints start with one of these; () is any
        self.kdf = kdf
        self.file_cipher = file_cipher or available_file_cipher()
        private_folder(self.data_dir / "users")
        self.tags = TagIndex(self.data_dir)  # refuses bad tokens before a request is read (tag_index.py)
        self.after = Pending()  # sessions ending after their answers (session_end.py)
        self.pool: Pool | None = None  # none until the server keeps files open (keeping_files_open)

    def ready(self) -> bool:
        """Readiness: a file can be created, written, synced and removed
        where the stores live (a full disk or read-only mount says no)."""
        return can_write(self.data_dir / "users")

    def serves(self, user_id: str) -> None:
        """Refuse a user of a shard this host does not hold now (421
        ``fleet.elsewhere``): asked before any file of the user is opened, by
        :meth:`_files`, the one way this class reaches a user's files (every
        session and token check, and a capability withdrawn without its
        owner), and by the web edge's first look at a token; so a host a
        placement took a shard from serves none of it, whoever sends the
        request."""
        if self.placed is not None and user_id[:1] not in self.placed.held():
            raise Misdirected(ELSEWHERE, code="fleet.elsewhere")
        if self.placed is not None and user_id[:1] in self.placed.draining():
            # Its writes must stop before the last sync of the move; reads stop with them, for a few seconds.
            raise Moving(MOVING, MOVING_WAIT_S)
        if self.placed is not None and self.placed.restoring(user_id):
            # Served once its restore (which this request puts first) has moved it in whole.
            raise Moving(RESTORING, RESTORING_WAIT_S)

    def replicating(self) -> bool:
        """Whether this host of a fleet replicates now: while it holds a shard."""
        return self.placed is not None and bool(self.placed.held())

    def drained(self) -> dict[str, Any] | None:
        """The shards this host finished draining for a move (None: none draining)."""
        return self.placed.drained() if self.placed is not None else None

    def placement_epoch(self) -> int | None:
        """The epoch of the placement this host serves by (None: not a host of a fleet)."""
        return self.placed.epoch() if self.placed is not None else None

    def create_identity(self) -> Identity:
        """A new user: folder, key ring with the owner grant, empty memory
        file; on a host of a fleet, of a shard the host holds."""
        prefixes = self.id_prefixes
        if self.placed is not None:
            prefixes = tuple(sorted(self.placed.held() - self.placed.draining()))
            if not prefixes:
                raise Misdirected(NO_SHARD, code="fleet.elsewhere")
        for _ in range(8):
            user_id = tokens.new_user_id(prefixes)
            files = UserFiles(self.data_dir, user_id)
            try:
                files.create_folder()
                break
            except FileExistsError:
                continue
            except OSError as exc:
                raise storage_error(exc, self.data_dir) or exc from None
        else:  # pragma: no cover - 2**64 ids
            raise RuntimeError("could not allot a user id")
        token, secret = tokens.mint(user_id)
        chain = KeyChain(user_id, (keys.new_master_key(),))
        try:
            # Held while the files are made, so a backup sees a user whole or not at all.
            with userlock.shared(files.folder):
                ring = Keyring.create(files.keyring, user_id, self.file_cipher, self.page_bytes, pool=self.pool)
                try:
                    ring.add(
                        scope="owner", tag=tokens.lookup_tag(user_id, secret), secret=secret, chain=chain, kdf=self.kdf
                    )
                    mf = MemoryFile(
                        files.memory,
                        user_id,
                        chain,
                        self.file_cipher,
                        create=True,
                        page_bytes=ring.memory_page_bytes(),
                        pool=self.pool,
                    )
                    head, version = mf.committed()
                    mf.close()
                    ring.advance_head(head, version, chain=chain)
                    self.tags.grants_seen(user_id, ring.conn)
                finally:
                    ring.close()
        except BaseException as exc:
            # Half a user is no user: without its files nobody could ever open it.
            files.destroy_quietly()
            err = storage_error(exc, self.data_dir) if isinstance(exc, Exception) else None
            if err is not None:
                raise err from None
            raise
        return Identity(user_id, token, self.file_cipher)

    def mint_grant(
        self, session: Session, scope: str, label: str | None = None, expires: str | None = None
    ) -> tuple[int, str]:
        """A new capability over the session's memory: the current epoch key
        sealed to a key pair derived from a fresh secret (its expiry, when
        given, bound into its certificate; its label sealed under the epoch's
        label key), in a memory other than main filed in main's key ring by
        its tag too, so that its token finds the memory it is bound to.
        Returns ``(grant_id, token)``; the token exists only in this answer."""
        if scope not in ("read", "full"):
            raise ValueError("only read or full capabilities can be minted")
        token, secret = tokens.mint(session.user_id)
        tag = tokens.lookup_tag(session.user_id, secret)
        grant_id = session.keyring.add(
            scope=scope,
            tag=tag,
            secret=secret,
            chain=session.keys,
            kdf=self.kdf,
            expires=expires,
            label=label,
        )
        if session.memory_name != MAIN and session.main_keyring is not None:
            memories.put_tag(session.main_keyring.conn, tag, session.memory_name, expires)
        return grant_id, token

    def list_grants(self, session: Session) -> list[dict[str, Any]]:
        """Every grant with its label (opened), expiry and last-used day."""
        now = datetime.now(UTC)
        out = []
        for g in session.keyring.grants():
            notes = session.keyring.notes(g.id)
            try:
                label = session.keyring.label(g.id, session.keys, session.owner)
                last_used = session.keyring.last_used(g.id, session.owner)
            except (aead.Unsealable, UnicodeDecodeError):
                raise Damaged(
                    f"The label or last-used day of capability {g.id} was altered; restore the key ring from a backup."
                ) from None
            is_expired = grant_label_expiry.expired(notes.expires, now)
            out.append(
                {
                    "id": g.id,
                    "scope": g.scope,
                    "label": label,
                    "created": g.created,
                    "expires": notes.expires,
                    "revoked": g.revoked,
                    "expired": is_expired,
                    "live": g.revoked is None and not is_expired,
                    "last_used": last_used,
                    "you": g.id == session.grant_id,
                }
            )
        return out

    def revoke_grant(self, session: Session, grant_id: int) -> dict[str, Any]:
        """Revoke one capability: destroy its key columns (its listing row
        stays) and start a new key epoch that only the other live
        capabilities reach, so nothing written from now on opens with it,
        whatever copies of the files it is given (:meth:`_new_epoch`)."""
        grant = next((g for g in session.keyring.grants() if g.id == grant_id), None)
        if grant is None:
            found = next((g for g in inbox.grants(session.keyring.conn) if g.id == grant_id), None)
            if found is None:
                raise NotFound(f"No capability {grant_id}; list them with GET /grants.", code="grants.unknown")
            # An append capability holds no key: ending it needs no new epoch.
            at = inbox.revoke(session.keyring.conn, grant_id)
            if at is not None and found.tag is not None and session.main_keyring is not None:
                memories.drop_tags(session.main_keyring.conn, tag=bytes(found.tag))
            return {
                "id": grant_id,
                "scope": "append",
                "revoked": at or found.revoked,
                "already": at is None,
                "also_revoked": [],
                "epoch": session.keyring.epoch(),
            }
        if grant.scope == "owner" and session.memory_name != MAIN:
            grant = None  # the owner's enrolment in this memory is not a capability of its own
            raise NotFound(f"No capability {grant_id}; list them with GET /grants.", code="grants.unknown")
        if grant.scope == "owner":
            raise Conflict(
                "The owner capability is not revoked but rotated: POST /rotate gives a new owner token "
                "and ends this one; to end this memory, DELETE /store.",
                code="grants.owner",
            )
        already = grant.revoked is not None
        stranded: list[int] = []
        if not already:
            tag = session.keyring.tag_of(grant_id)
            stranded = self._new_epoch(session, (grant_id,))[0]
            if tag is not None and session.memory_name != MAIN and session.main_keyring is not None:
                memories.drop_tags(session.main_keyring.conn, tag=tag)
        revoked = next(g for g in session.keyring.grants() if g.id == grant_id).revoked
        return {
            "id": grant_id,
            "scope": grant.scope,
            "revoked": revoked,
            "already": already,
            "also_revoked": stranded,
            "epoch": session.keyring.epoch(),
        }

    def rotate_owner(self, session: Session) -> dict[str, Any]:
        """A new owner token. The calling owner capability stays the owner,
        in every memory, until the new token is first presented, and that
        first use retires it as a revocation does (a new key epoch the old
        token never reaches, in each memory: :meth:`_retire_predecessor`,
        service/handover.py). So whatever instant the answer is lost (a
        crash, a cut connection, no Idempotency-Key), the old token still
        works and can simply rotate again; a successor never presented is
        revoked by the next rotation."""
        if session.scope != "owner":
            raise Forbidden(
                "Only the owner capability can be rotated; rotate a read or full one by minting a new "
                "one (POST /grants) and revoking the old (DELETE /grants/{id}).",
                code="auth.scope",
            )
        token, secret = tokens.mint(session.user_id)
        old_id = session.grant_id
        with write_transaction(session.keyring.conn):
            pending = session.keyring.pending_owner()
            session.chain, stranded, minted = session.keyring.rotate_owner(
                session.keys,
                old_id,
                mint={
                    "scope": "owner",
                    "tag": tokens.lookup_tag(session.user_id, secret),
                    "secret": secret,
                    "kdf": self.kdf,
                },
                owner=session.owner,
            )
            # Every other memory's way to the new token, in the same transaction (service/handover.py).
            handover.seal_rotation(self, session, minted, opening=pending is None or pending[0] != old_id)
        created = next(g for g in session.keyring.grants() if g.id == minted).created
        return {
            "id": minted,
            "scope": "owner",
            "created": created,
            "token": token,
            "retires": old_id,
            "also_revoked": stranded,
            "epoch": session.keyring.epoch(),
            "note": "This token is shown once and never stored. The previous owner token keeps working until "
            "this one is first used (any request), which ends it as a revocation does.",
        }

    def _retire_predecessor(
        self, ring: Keyring, grant: Grant, token: tokens.Token, opened: Opened
    ) -> tuple[Opened, Grant, bool]:
        """When ``grant`` is a rotation's successor presented for the first
        time, retire the owner grant it succeeds, and end what it minted in
        the window (handover.retire), and return the grant opened in the new
        epoch; True when this request retired it (its key-ring WAL and memory
        file then move to the new epoch before it goes on, :meth:`finish_epoch`,
        and the other memories to the new token, handover.take_over_all)."""
        pending = ring.pending_owner()
        if pending is None or pending[1] != grant.id:
            return opened, grant, False
        new = handover.retire(ring, opened.chain, grant, opened.kek)
        again = ring.find(token.tag)
        if again is None or again.wrapped is None:
            raise StaleGrant()  # a newer rotation revoked it meanwhile
        return ring.open_grant(again, token.secret), again, new is not None

    def _new_epoch(
        self, session: Session, revoke: tuple[int, ...], mint: dict[str, Any] | None = None
    ) -> tuple[list[int], int | None]:
        """Move the store to a new key epoch in the key ring (one transaction,
        which may be the caller's: grants revoked, the new key boxed to every
        other live capability). The memory file follows in
        :meth:`finish_epoch`, once that transaction has committed; until then,
        or if it never runs (a crash), the next request that opens the file
        re-seals it before anything is read or written."""
        new, stranded, minted = session.keyring.advance_epoch(session.keys, revoke, mint=mint, owner=session.owner)
        session.chain = new
        return stranded, minted

    def finish_epoch(self, session: Session) -> bool:
        """After a revocation or rotation committed: re-seal the memory file
        under the new epoch now, and flush the key ring's WAL so the destroyed
        key columns are left in no file. True when the flush is done (False:
        it is still pending, and every later close of the key ring retries
        it). The move holds the user's lock exclusive for one transaction of
        constant work (MemoryFile.reseal), so this user's other requests wait
        only a moment (API-REFERENCE.md, "Owner actions under load")."""
        if session.keyring.epoch() > session.keys.epoch:
            return session.keyring.flush()  # a newer epoch than this session's: its own finish re-seals
        return self.reseal(session.files, session.keyring, session.keys, session.cipher, session.page_bytes)

    def reseal(
        self, files: UserFiles, ring: Keyring, new: KeyChain, cipher: str | None = None, page_bytes: int | None = None
    ) -> bool:
        """Move the memory file of ``files`` to epoch ``new``, just committed
        in ``ring`` (its cipher and page size as the key ring records them
        when not given), and flush the key ring's WAL: :meth:`finish_epoch`."""
        try:
            cipher = cipher or ring.meta("file_cipher") or "none"
            page_bytes = page_bytes or ring.memory_page_bytes()
            # Exclusive: every request that opened the file under the old
            # epoch has closed it, and none opens it until it is re-sealed.
            with userlock.exclusive(files.folder):
                # This worker lets go of the files it kept open under the old epoch before the answer.
                if self.pool is not None:
                    self.pool.drop_folder(files.folder, held=True)
                mf = MemoryFile(files.memory, ring.user_id, new, cipher, page_bytes=page_bytes, pool=self.pool)
                mf.close()
                # Held exclusive, no request of this user is between its key ring reads and writes.
                return ring.flush()
        except (StashError, MissingFile, ValueError):
            return ring.flush()

    def unmoved(self, session: Session) -> int:
        return session.keyring.unmoved_live()

    def destroy_store(self, session: Session) -> dict[str, Any]:
        """Remove the user's whole folder: every memory's key ring (every
        wrapped key) and memory file. Each key ring is overwritten before it
        is unlinked."""
        files = session.files
        try:
            T: int | None = session.open_memory().mf.count()
        except (Damaged, Unavailable, MissingFile):
            T = None  # a damaged, rolled-back or missing memory can still be destroyed
        session.close()
        session.keyring.close()
        if session.pool is not None:  # this worker's; another's finds the files gone
            session.pool.drop_folder(files.folder, held=False)
        memories.overwrite_keyrings(files.folder)  # every memory's, not only main's
        files.destroy()
        return {"user_id": session.user_id, "destroyed": True, "memories": T, "at": now_utc()}

    def _files(self, user_id: str, memory: str = MAIN) -> MemoryFiles:
        """The files of ``user_id``'s ``memory``, once :meth:`serves` says
        this host holds the user (421 or 503 otherwise, before anything of
        the user is looked at)."""
        self.serves(user_id)
        return MemoryFiles(self.data_dir, user_id, memory)

    def _open_ring(self, files: UserFiles, store: str) -> Keyring:
        try:
            return open_keyring(files.keyring, store, self.pool)
        except Exception as exc:
            # The user's folder is there but its key ring cannot be opened:
            # say so, rather than blame the token.
            err = storage_error(exc, self.data_dir)
            raise err or Damaged("The key ring of this store is unreadable; restore it from a backup.") from None

    @staticmethod
    def _find(ring: Keyring, tag: bytes) -> Grant | None:
        """The grant filed under ``tag`` in ``ring``: a read, full or owner
        one, or an append one (which holds no key: wrapped is None)."""
        try:
            grant = ring.find(tag)
            if grant is None:
                found = inbox.find(ring.conn, tag)
                if found is not None and found.tag is not None:
                    grant = Grant(found.id, "append", found.created, found.revoked, None, None)
        except Exception as exc:
            err = storage_error(exc)
            if err is not None and not isinstance(err, Damaged):
                raise err from None
            raise Damaged("The key ring of this store is unreadable; restore it from a backup.") from None
        return grant

    def _authenticate(self, token_text: str | tokens.Token | None) -> tuple[tokens.Token, MemoryFiles, Keyring, Grant]:
        """Token to (token, files, key ring, grant) of the memory it is bound to, or 401 (:meth:`_capability`)."""
        token, files, ring, grant, main, _ = self._capability(token_text)
        if ring is not main:
            main.close()
        return token, files, ring, grant

    def _capability(
        self, token_text: str | tokens.Token | None
    ) -> tuple[tokens.Token, MemoryFiles, Keyring, Grant, Keyring, str]:
        """Token to (token, files, key ring, grant, main's key ring, the
        memory it is bound to) — or 401 without any key work: checksum, then
        the user's folder, then the grant's tag, in main's key ring or, for a
        capability bound to another memory, in that memory's (found by its
        tag in main's, storage/memories/__init__.py)."""
        token = _parsed(token_text)
        if token is None:
            raise Unauthorized()
        files = self._files(token.user_id)
        self.after.run_for(token.user_id)  # what this user's last sessions here left, first
        if not files.exists():
            raise Unauthorized()
        main = ring = self._open_ring(files, token.user_id)
        tag = token.tag
        home = MAIN
        try:
            grant = self._find(main, tag)
            if grant is None:
                name = memories.home_of(main.conn, tag)
                if name is None or not memories.exists(self.data_dir, token.user_id, name):
                    raise Unauthorized()
                files = self._files(token.user_id, name)
                ring = self._open_ring(files, memories.store_id(token.user_id, name))
                home = name
                grant = self._find(ring, tag)
                if grant is not None and grant.scope == "owner":
                    # The owner is found in main's key ring; a row of another memory that main files as a
                    # capability and that says otherwise was edited, and its scope must steer nothing.
                    raise Damaged(
                        "A capability's row in a memory's key ring was altered; restore the identity from a backup."
                    )
            if grant is None or (grant.wrapped is None and grant.scope != "append"):
                raise Unauthorized()
            # An expired capability is refused like a revoked one, before any key
            # work. The stored expiry is trusted here only to refuse: one edited
            # to extend the grant no longer matches its wrap, which then fails.
            if grant_label_expiry.expired(ring.notes(grant.id).expires, datetime.now(UTC)):
                raise Unauthorized()
        except BaseException:
            if ring is not main:
                ring.close()
            main.close()
            raise
        return token, files, ring, grant, main, home

    @contextlib.contextmanager
    def keeping_files_open(self, seconds: float) -> Iterator[Pool]:
        """For the block (a server's life): keep users' files open
        ``seconds`` after each request (0: close them after every request)
        in a pool built here, which every session, key ring and tag load of
        this vault uses; on exit the pool is closed, and with it every file
        still open. Outside such a block the vault keeps nothing open."""
        with new_pool(seconds) as kept:
            self.pool = self.tags.pool = kept
            try:
                yield kept
            finally:
                self.after.run_all()
                self.pool = self.tags.pool = None

    @staticmethod
    def interrupt_work(stop: bool = True) -> None:
        """Process-wide: with ``stop``, end every statement still running
        over any user's file in this process, and every long one started from
        now on (storage/safeopen.py, ``stop_all``), so that a worker thread
        caught in a file cannot keep a stopping server alive; without it,
        let them run again (a server started anew in the same process)."""
        if stop:
            safeopen.stop_all()
        else:
            safeopen.resume_all()

    @staticmethod
    def _open_grant(ring: Keyring, grant: Grant, token: tokens.Token) -> tuple[Opened, Grant]:
        """Open ``grant``, read a moment earlier. A revocation or rotation that
        committed in between moved the epoch past the row as read (its box,
        the older keys), which would look like a stale or altered row; so a
        refusal is final only when the row read again is the same (or gone:
        revoked meanwhile). Then the grant as opened."""
        try:
            return ring.open_grant(grant, token.secret), grant
        except (StaleGrant, aead.Unsealable):
            again = ring.find(token.tag)
            if again is None or again.wrapped is None:
                raise StaleGrant() from None  # revoked meanwhile: refused as a revoked token is
            if again == grant:
                raise
        return ring.open_grant(again, token.secret), again

    def check_token(self, token_text: str | tokens.Token | None) -> str:
        """Refuse a token that cannot be live (the cheap part of :meth:`session`);
        the scope its grant's row names, not yet authenticated: only
        :meth:`scope_of` may act on it."""
        try:
            _, _, ring, grant, main, _ = self._capability(token_text)
        except StashError:
            raise
        except Exception as exc:
            err = storage_error(exc, self.data_dir)
            if err is None:
                raise
            raise err from None
        if ring is not main:
            ring.close()
        main.close()
        return grant.scope

    def withdraw(self, user_id: str, memory: str, grant_id: int) -> bool:
        """End capability ``grant_id`` of ``memory`` without the owner: one
        whose token nobody may hold, an MCP host's approval never redeemed or
        redeemed twice (service/oauth.py; Keyring.withdraw says what it does
        and what waits for the owner's next epoch). True when it was live;
        refused as :meth:`serves` refuses for a user this host does not hold
        now, never a silent no-op."""
        files = self._files(user_id)
        if not files.exists():
            return False
        with userlock.shared(files.folder):
            main = self._open_ring(files, user_id)
            try:
                ring = main
                if memory != MAIN:
                    if not memories.exists(self.data_dir, user_id, memory):
                        return False
                    ring = self._open_ring(self._files(user_id, memory), memories.store_id(user_id, memory))
                try:
                    appended = next((g for g in inbox.grants(ring.conn) if g.id == grant_id), None)
                    if appended is not None:
                        ended = inbox.revoke(ring.conn, grant_id) is not None
                        tag = bytes(appended.tag) if ended and appended.tag is not None else None
                    else:
                        tag = ring.withdraw(grant_id)
                        ended = tag is not None
                    if tag is not None and memory != MAIN:
                        memories.drop_tags(main.conn, tag=tag)
                    self.tags.grants_seen(user_id, main.conn)
                finally:
                    if ring is not main:
                        ring.close()
            finally:
                main.close()
        return ended

    def scope_of(self, token_text: str | tokens.Token | None, memory: str | None = None) -> str:
        """The scope ``token_text`` holds on ``memory`` (None: the memory it is
        bound to), read once its grant has opened, so a row edited to claim
        more opens nothing: what an MCP host is shown it may call. Refused as
        a session on that memory is."""
        claimed = self.check_token(token_text)
        with self.session(token_text, claimed, None, memory) as session:
            return session.scope

    @contextlib.contextmanager
    def session(
        self,
        token_text: str | tokens.Token | None,
        need: str,
        pin: Head | None = None,
        memory: str | None = None,
        route: str | None = None,
    ) -> Iterator[Session]:
        """An authenticated session on ``memory`` (None: the one the
        capability is bound to; the owner's is main); ``route``, the request's
        (``"POST /config"``), is what a scope refusal names. A storage failure
        inside it (a full disk, a read-only folder, an unreadable file)
        becomes the refusal that says so, never a bare 500."""
        try:
            with self._session(token_text, need, pin, memory, route) as session:
                yield session
        except StashError:
            raise
        except Exception as exc:
            err = storage_error(exc, self.data_dir)
            if err is None:
                raise
            raise err from None

    @contextlib.contextmanager
    def _session(
        self,
        token_text: str | tokens.Token | None,
        need: str,
        pin: Head | None,
        memory: str | None,
        route: str | None = None,
    ) -> Iterator[Session]:
        token, files, ring, grant, main, home = self._capability(token_text)
        if memory not in (None, MAIN) and handover.due(main, grant, memory):
            # The owner's new token first used on another memory, or that memory's take-over cut short:
            # main's session retires the old owner and takes every memory over first (service/handover.py).
            main.close()
            with self._session(token, "owner", None, MAIN):
                pass
            token, files, ring, grant, main, home = self._capability(token)
        rings = [main] if ring is main else [ring, main]
        enrolled = token
        # Only an owner's session can add or end a capability (mint, revoke, rotate, a rotation's first
        # use, a memory made or deleted), so only it keeps the stamp's rule (service/tag_index.py); the
        # others' requests, most of them, skip reading every live tag.
        may_change_tags = grant.scope == "owner"
        try:
            target = memory if memory is not None else (MAIN if grant.scope == "owner" else home)
            if target != home:
                # Bound by keys: only the owner is enrolled in every memory's key ring. An owner route
                # asked by another capability is refused for its scope, whichever memory it names.
                if grant.scope != "owner" and need == "owner":
                    raise Forbidden(
                        f"This capability is scoped {grant.scope}; this route needs owner. "
                        "Ask the owner for a capability with that scope.",
                        code="auth.scope",
                    )
                if grant.scope != "owner" or not memories.exists(self.data_dir, token.user_id, target):
                    raise unknown_memory()
                files = self._files(token.user_id, target)
                ring = self._open_ring(files, memories.store_id(token.user_id, target))
                rings.append(ring)
                number = memories.number_of(ring.conn)
                salt = memories.salt_of(main.conn, number)
                named = memories.numbered(main.conn).get(target)
                if named is not None and named != number:
                    # Not the memory main's key ring names so: an older folder of a memory of that name put
                    # back, or another memory's files. Named as such, so the owner's listings can say so.
                    if salt is None:
                        raise RolledBack(
                            f"Memory {target}'s files are from before it was deleted and made again; "
                            f"they are not served. Restore it from a backup or delete it "
                            f"(DELETE /memories/{target})."
                        )
                    raise Damaged(
                        f"Memory {target}'s files belong to another memory of this identity; they are "
                        f"not served. Restore it from a backup or delete it (DELETE /memories/{target})."
                    )
                if salt is None:
                    raise unknown_memory()  # deleted: its salt is gone, and with it the owner's way in
                enrolled = tokens.Token(token.user_id, memories.owner_secret(token.secret, salt))
                grant_in = self._find(ring, enrolled.tag)
                if grant_in is None or grant_in.scope != "owner" or grant_in.wrapped is None:
                    raise Damaged(
                        f"The owner capability is not enrolled in memory {target}'s key ring; restore "
                        f"it from a backup or delete it (DELETE /memories/{target})."
                    )
                grant = grant_in
            if grant.scope == "append":
                if not allowed(grant.scope, need):
                    raise Forbidden(
                        f"This capability is scoped append; this route needs {need}. An append "
                        "capability may only note (POST /note).",
                        code="auth.scope",
                    )
                session = Session(
                    token.user_id,
                    "append",
                    grant.id,
                    ring,
                    files,
                    ring.meta("file_cipher") or "none",
                    capability_key=capability_key(token.secret),
                    pool=self.pool,
                    memory_name=target,
                    main_keyring=main,
                )
                try:
                    yield session
                finally:
                    session.close()
                return
            yield from self._opened(
                enrolled if target != home else token, files, ring, grant, need, pin, target, main, token.secret, route
            )
        finally:
            if may_change_tags:
                self.tags.grants_seen(token.user_id, main.conn)  # before the answer leaves: tag_index.py
            for r in rings:
                r.close()

    def _opened(
        self,
        token: tokens.Token,
        files: MemoryFiles,
        ring: Keyring,
        grant: Grant,
        need: str,
        pin: Head | None,
        target: str,
        main: Keyring,
        secret: bytes,
        route: str | None = None,
    ) -> Iterator[Session]:
        """The session of ``grant``, opened with ``token`` (for the owner in a
        memory other than main: the secret it is enrolled under there);
        ``secret`` is the token's own."""
        try:
            opened, grant = self._open_grant(ring, grant, token)
            retired = False
            if target == MAIN:  # a rotation's successor retires its predecessor at its first use, in main
                opened, grant, retired = self._retire_predecessor(ring, grant, token, opened)
        except StaleGrant:
            if grant.scope == "owner" and target != MAIN:
                # The owner's enrolment in another memory, from an older epoch than that memory's key ring:
                # its row was put back from an older copy. The memory's damage, not a refused token.
                raise RolledBack(
                    f"The owner's key in memory {target}'s key ring is from an older copy; it is "
                    f"not served. Restore it from a backup or delete it "
                    f"(DELETE /memories/{target})."
                ) from None
            raise Unauthorized() from None
        except aead.Unsealable:
            raise Damaged(
                "This capability's key is damaged or was altered, so nothing was opened; "
                "ask the owner for a new capability."
            ) from None
        if target == MAIN and grant.scope == "owner" and (retired or need == "owner"):
            # The other memories pass to this owner token (its first use), or finish passing (a take-over a
            # crash cut short): nothing to do, at the cost of one read of main's key ring, otherwise.
            handover.take_over_all(self, ring, grant, opened.kek, secret, opened.chain)
        if grant.scope != "owner" or target == MAIN:
            # The owner's enrolment in another memory is never listed, so its day is not kept: a memory
            # the owner only looks at stays four key ring pages (docs/DESIGN.md, "Memories").
            ring.touch(grant.id, datetime.now(UTC).date().isoformat())
        # The scope is read only after the certificate authenticated it.
        if not allowed(grant.scope, need):
            raise Forbidden(scope_refusal(grant.scope, need, route), code="auth.scope")
        if opened.unmoved:
            ring.move_grant(grant, opened)  # its secret is here now, and only now
        try:
            page_bytes = ring.memory_page_bytes()
        except ValueError:
            raise Damaged(
                "The key ring's record of the memory file's page size is unreadable; restore it from a backup."
            ) from None
        if need == "owner":
            # The owner routes that read only the key ring (grants, audit,
            # rotate) must not serve a key ring put back from before a
            # rotation or revocation, which the memory file's epoch shows.
            try:
                memfile.check_not_behind(
                    memfile.FileKeys.derive(
                        files.memory, token.user_id, opened.chain, ring.meta("file_cipher") or "none", page_bytes
                    )
                )
            except KeysBehind:
                if ring.epoch() > opened.chain.epoch:
                    raise Conflict(
                        "A capability was revoked while this request was being opened, so nothing was done; retry it.",
                        code="store.rekeyed",
                    ) from None
                raise
        try:
            # Only the owner routes read owner-only data; the others
            # (wake, note, recall with the owner token) skip the box.
            owner = ring.owner_keys(grant, opened.kek, opened.chain) if need == "owner" else None
        except (aead.Unsealable, UnicodeDecodeError, ValueError):
            raise Damaged(
                "The owner's key box or the owner-only data in the key ring was altered; restore the "
                "key ring from a backup."
            ) from None
        session = Session(
            token.user_id,
            grant.scope,
            grant.id,
            ring,
            files,
            ring.meta("file_cipher") or "none",
            opened.chain.base,
            opened.chain,
            capability_key(token.secret),
            pin,
            page_bytes,
            owner,
            self.pool,
            memory_name=target,
            main_keyring=main,
            owner_secret=secret if grant.scope == "owner" else b"",
        )
        del opened
        try:
            if retired:
                self.finish_epoch(session)
            yield session
            session.publish_head()
        finally:
            session.close()


def _parsed(token: str | tokens.Token | None) -> tokens.Token | None:
    """A request's token, parsed: the web edge hands over the one its
    precheck parsed (with its lookup tag derived), so a request parses its
    token and derives its tag once (issue 27); a caller with the text (the
    CLI, a library, the tests) has it parsed here."""
    if isinstance(token, tokens.Token):
        return token
    return tokens.parse(token) if token else None


def scope_refusal(scope: str, need: str, route: str | None = None) -> str:
    """The 403 for a capability of ``scope`` on ``route`` (``"POST /note"``;
    None: unnamed), which needs ``need``, saying what its agent's block says
    to do: a read capability tells the user what should be remembered
    (skill/AGENTS-read.md), or asks the owner for another change; a full one
    asks the owner for what only the owner may do."""
    if scope == "read" and need in ("append", "full"):
        if route is None or route.endswith(" /note"):
            return (
                "This capability is scoped read; this route needs full. Tell the user (the memory's owner) "
                "what should be remembered instead of writing it."
            )
        return (
            f"This capability is scoped read; {route} changes the memory and needs full. A read capability "
            "may look, not change anything: ask the memory's owner to make this change."
        )
    if need == "owner":
        return (
            f"This capability is scoped {scope}; this route needs owner, which is never handed on. Ask the "
            "owner to do it."
        )
    return (
        f"This capability is scoped {scope}; this route needs {need}. Ask the owner for a capability with that scope."
    )
