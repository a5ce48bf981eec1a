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

from ..core.errors import Conflict, Damaged, Forbidden, NotFound, StashError, Unauthorized, Unavailable
from ..crypto import aead, keys, tokens
from ..crypto.chain import Head
from ..crypto.epochs import KeyChain
from ..crypto.owner_seal import OwnerKeys
from ..storage import memfile, userlock
from ..storage.files import (
    LEGACY_PAGE_BYTES,
    PAGE_BYTES,
    MissingFile,
    UserFiles,
    available_file_cipher,
    can_write,
    new_pool,
    overwrite_with_zeros,
    private_folder,
    storage_error,
)
from ..storage.keyring import Grant, Keyring, Opened, StaleGrant, now_utc, open_keyring
from ..storage.memfile import KeysBehind, MemoryFile, ResealDue
from ..storage.pool import Pool
from . import grant_terms, idempotency
from .memory import Memory
from .tag_index import TagIndex

RANK = {"read": 0, "full": 1, "owner": 2}
FLUSH_LOCK_SECONDS = 5.0  # how long an erasure's flush waits for this user's requests in progress to end


def _parsed(token: str | tokens.Token | None) -> tokens.Token | None:
    """A token as parsed (:func:`tokens.parse`): its text is parsed here, a
    :class:`tokens.Token` the edge parsed already is taken as it is."""
    if isinstance(token, tokens.Token):
        return token
    return tokens.parse(token) if token else None


def capability_key(secret: bytes) -> bytes:
    """Derived from a token's secret, which is never stored: seals what only
    that capability may read back (the record of a minted token, a rotation's
    new owner token)."""
    return keys.subkey(secret, b"capability-idempotency")


@dataclass
class Session:
    """One authenticated request. The memory file is opened on first use, so
    the key-ring routes (grants, store destruction) work even when the memory
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

    @property
    def memory(self) -> Memory:
        """The memory, opened on first use and checked before anything is
        served: the end of its log against the head recorded in the file
        (MemoryFile), that head against the copy in the key ring, and, when
        the client pinned one, against the client's."""
        if self._memory is None:
            if not self.master:
                raise RuntimeError("the session has ended")
            self._lock = userlock.UserLock(self.files.folder)
            self._lock.acquire_shared()
            # The copy is read before the file is opened: it is written only
            # after the file commits, so read in this order it is never ahead
            # of the file unless the file was rolled back.
            try:
                copy = self.keyring.log_head()
                state_copy = self.keyring.state_version()
            except ValueError:
                raise Damaged("The key ring's copy of the log digest is unreadable; restore the store from a "
                              "backup.") from None
            try:
                try:
                    mf = MemoryFile(self.files.memory, self.user_id, self.keys, self.cipher,
                                    page_bytes=self.page_bytes, recorded=state_copy is not None, pool=self.pool,
                                    reseal=False)
                except ResealDue:
                    # A revocation committed and its re-seal has not run yet:
                    # run it now, alone (no request still under the old keys).
                    self._lock.release()
                    with userlock.exclusive(self.files.folder):
                        if self.pool is not None:
                            self.pool.drop_folder(self.files.folder, held=True)
                        MemoryFile(self.files.memory, self.user_id, self.keys, self.cipher,
                                   page_bytes=self.page_bytes, recorded=state_copy is not None).close()
                    self._lock.acquire_shared()
                    mf = MemoryFile(self.files.memory, self.user_id, self.keys, self.cipher,
                                    page_bytes=self.page_bytes, recorded=state_copy is not None, pool=self.pool)
            except KeysBehind:
                self._lock.release()
                self._lock = None
                if self.keyring.epoch() > self.keys.epoch:
                    raise Conflict("A capability was revoked while this request was being opened, so nothing was "
                                   "done; retry it.", code="store.rekeyed") from None
                raise
            try:
                mf.check_copy(copy)
                mf.check_state_copy(state_copy)
                if self.pin is not None:
                    mf.check_pin(self.pin)
                mf.writer = self.grant_id  # sealed into every memory and summary it writes
                self._memory = Memory(mf, writes=self.scope != "read")
            except BaseException:
                mf.close()
                raise
            self._copy = copy
            self._state_copy = state_copy
        return self._memory

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
        head, version = self._memory.mf.committed()
        if (self._copy is None or self._copy.count < head.count
                or self._state_copy is None or self._state_copy < version):
            self.keyring.advance_head(head, version)

    def flush_memory(self) -> bool:
        """Empty the memory file's WAL into the file now (after an erasure):
        this request lets go of its shared hold on the user's lock and takes
        it exclusive, so no other request of this user is reading or writing
        the file meanwhile and the flush cannot be kept busy; new requests
        wait behind it for that moment. False when the requests in progress
        did not end within FLUSH_LOCK_SECONDS (the flush stays pending)."""
        mf = self.memory.mf
        if self._lock is not None:
            self._lock.release()
        try:
            with userlock.exclusive_within(self.files.folder, FLUSH_LOCK_SECONDS) as held:
                return held and mf.flush()
        finally:
            # Held shared again until the file is closed, as by every request (userlock.py).
            self._lock = userlock.UserLock(self.files.folder)
            self._lock.acquire_shared()

    def close(self) -> None:
        """End the session: drop every key, close the file and let a backup
        in. Writes nothing."""
        self.master = b""
        self.chain = None
        self.capability_key = b""
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


class Vault:
    """All users' stores under one data directory."""

    def __init__(self, data_dir: Path, kdf: keys.KdfParams = keys.DEFAULT_KDF, file_cipher: str | None = None,
                 id_prefixes: tuple[str, ...] = (), page_bytes: int = PAGE_BYTES) -> None:
        self.data_dir = Path(data_dir)
        # The page size of the memory files this vault creates: 4 KiB; 16 KiB
        # (the old size) only for bench/pages.py, which weighs the two.
        self.page_bytes = page_bytes
        self.id_prefixes = id_prefixes  # user ids this host mints start with one of these; () is any
        self.kdf = kdf
        self.file_cipher = file_cipher or available_file_cipher()
        private_folder(self.data_dir / "users")
        self.tags = TagIndex(self.data_dir)  # refuses bad tokens before a request is read (tag_index.py)
        self.pool: Pool | None = None  # none until the server keeps files open (keeping_files_open)

    def ready(self) -> bool:
        """Readiness: a file can be created, written, synced and removed
        where the stores live (a full disk or read-only mount says no)."""
        return can_write(self.data_dir / "users")

    def create_identity(self) -> Identity:
        """A new user: folder, key ring with the owner grant, empty memory file."""
        for _ in range(8):
            user_id = tokens.new_user_id(self.id_prefixes)
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
                    ring.add(scope="owner", tag=tokens.lookup_tag(user_id, secret), secret=secret, chain=chain,
                             kdf=self.kdf)
                    mf = MemoryFile(files.memory, user_id, chain, self.file_cipher, create=True,
                                    page_bytes=ring.memory_page_bytes(), pool=self.pool)
                    head, version = mf.committed()
                    mf.close()
                    ring.advance_head(head, version)
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

    def mint_grant(self, session: Session, scope: str, label: str | None = None,
                   expires: str | None = None) -> tuple[int, str]:
        """A new capability over the session's memory: the current epoch key
        sealed to a key pair derived from a fresh secret (its expiry, when
        given, bound into its certificate; its label sealed under the epoch's
        label key). Returns ``(grant_id, token)``; the token exists only in
        this answer."""
        if scope not in ("read", "full"):
            raise ValueError("only read or full capabilities can be minted")
        token, secret = tokens.mint(session.user_id)
        grant_id = session.keyring.add(
            scope=scope, tag=tokens.lookup_tag(session.user_id, secret), secret=secret,
            chain=session.keys, kdf=self.kdf, expires=expires, label=label,
        )
        return grant_id, token

    def list_grants(self, session: Session) -> list[dict]:
        """Every grant with its label (opened), expiry and last-used day."""
        now = datetime.now(UTC)
        out = []
        for g in session.keyring.grants():
            notes = session.keyring.notes(g.id)
            try:
                label = session.keyring.label(g.id, session.keys, session.owner)
                last_used = session.keyring.last_used(g.id, session.owner)
            except (aead.Unsealable, UnicodeDecodeError):
                raise Damaged(f"The label or last-used day of capability {g.id} was altered; restore the key ring "
                              "from a backup.") from None
            is_expired = grant_terms.expired(notes.expires, now)
            out.append({"id": g.id, "scope": g.scope, "label": label, "created": g.created, "expires": notes.expires,
                        "revoked": g.revoked, "expired": is_expired, "live": g.revoked is None and not is_expired,
                        "last_used": last_used, "you": g.id == session.grant_id})
        return out

    def revoke_grant(self, session: Session, grant_id: int) -> dict:
        """Revoke one capability: destroy its key columns (its listing row
        stays) and start a new key epoch that only the other live
        capabilities reach, so nothing written from now on opens with it,
        whatever copies of the files it is given (:meth:`_new_epoch`)."""
        grant = next((g for g in session.keyring.grants() if g.id == grant_id), None)
        if grant is None:
            raise NotFound(f"No capability {grant_id}; list them with GET /grants.", code="grants.unknown")
        if grant.scope == "owner":
            raise Conflict("The owner capability is not revoked but rotated: POST /rotate gives a new owner token "
                           "and ends this one; to end this memory, DELETE /store.", code="grants.owner")
        already = grant.revoked is not None
        stranded: list[int] = []
        if not already:
            stranded = self._new_epoch(session, (grant_id,))[0]
        revoked = next(g for g in session.keyring.grants() if g.id == grant_id).revoked
        return {"id": grant_id, "scope": grant.scope, "revoked": revoked, "already": already,
                "also_revoked": stranded, "epoch": session.keyring.epoch()}

    def rotate_owner(self, session: Session) -> dict:
        """A new owner token; the calling owner capability ends as a revoked
        one does (a new key epoch the old token never reaches)."""
        if session.scope != "owner":
            raise Forbidden("Only the owner capability can be rotated; rotate a read or full one by minting a new "
                            "one (POST /grants) and revoking the old (DELETE /grants/{id}).", code="auth.scope")
        token, secret = tokens.mint(session.user_id)
        old_id = session.grant_id
        stranded, minted = self._new_epoch(session, (old_id,), mint={
            "scope": "owner", "tag": tokens.lookup_tag(session.user_id, secret), "secret": secret, "kdf": self.kdf})
        created = next(g for g in session.keyring.grants() if g.id == minted).created
        return {"id": minted, "scope": "owner", "created": created, "token": token, "revoked": old_id,
                "also_revoked": stranded, "epoch": session.keyring.epoch(),
                "note": "This token is shown once and never stored; the previous owner token no longer opens this "
                        "memory."}

    def _new_epoch(self, session: Session, revoke: tuple[int, ...], mint: dict | None = None
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
        it). The re-seal holds the user's lock exclusive for its length, so
        this user's other requests wait for it (API-REFERENCE.md, "Owner
        actions under load")."""
        if session.keyring.epoch() > session.keys.epoch:
            return session.keyring.flush()  # a newer epoch than this session's: its own finish re-seals
        new = session.keys
        try:
            # Exclusive: every request that opened the file under the old
            # epoch has closed it, and none opens it until it is re-sealed.
            with userlock.exclusive(session.files.folder):
                # This worker lets go of the files it kept open under the old epoch before the answer.
                if session.pool is not None:
                    session.pool.drop_folder(session.files.folder, held=True)
                mf = MemoryFile(session.files.memory, session.user_id, new, session.cipher,
                                page_bytes=session.page_bytes, pool=session.pool)
                mf.close()
                # Held exclusive, no request of this user is between its key ring reads and writes.
                return session.keyring.flush()
        except (StashError, MissingFile):
            return session.keyring.flush()

    def replay_rotation(self, token_text: str | tokens.Token | None, key: str) -> dict | None:
        """The recorded answer of a rotation this (now revoked) owner token
        asked for with Idempotency-Key ``key``, or None: so a rotation whose
        answer was lost, by a dropped connection or a crash after it
        committed, is delivered by resending it (idempotency.rotation_replay).
        The key ring's WAL flush is tried again, as the first answer did."""
        token = _parsed(token_text)
        if token is None:
            return None
        files = UserFiles(self.data_dir, token.user_id)
        if not files.keyring.is_file():
            return None
        with open_keyring(files.keyring, token.user_id) as ring:
            answer = idempotency.rotation_replay(ring.idempotency_records(), token.user_id,
                                                 capability_key(token.secret), key)
            return None if answer is None else {**answer.body, "flushed": ring.flush()}

    def unmoved(self, session: Session) -> int:
        return session.keyring.unmoved_live()

    def destroy_store(self, session: Session) -> dict:
        """Remove the user's whole folder: key ring (every wrapped key) and
        memory file. The key ring is overwritten before it is unlinked."""
        files = session.files
        try:
            T: int | None = session.memory.mf.count()
        except (Damaged, Unavailable, MissingFile):
            T = None  # a damaged, rolled-back or missing memory can still be destroyed
        session.close()
        session.keyring.close()
        if session.pool is not None:  # this worker's; another's finds the files gone
            session.pool.drop_folder(files.folder, held=False)
        for path in sorted(files.folder.iterdir()):
            if path.is_file() and path.name.startswith("keyring"):
                overwrite_with_zeros(path)
        files.destroy()
        return {"user_id": session.user_id, "destroyed": True, "memories": T, "at": now_utc()}

    def _authenticate(self, token_text: str | tokens.Token | None) -> tuple[tokens.Token, UserFiles, Keyring, Grant]:
        """Token to (token, files, key ring, grant) — or 401 without any key
        work: checksum, then the user's folder, then the grant's tag. A token
        the HTTP edge parsed already is taken as it is (its checksum was
        checked there), so a request parses its token and derives its tag once."""
        token = _parsed(token_text)
        if token is None:
            raise Unauthorized()
        files = UserFiles(self.data_dir, token.user_id)
        if not files.exists():
            raise Unauthorized()
        try:
            ring = open_keyring(files.keyring, token.user_id, self.pool)
        except Exception as exc:
            # The user's folder is there but its key ring cannot be opened:
            # say so, rather than blame the token.
            err = storage_error(exc, self.data_dir)
            raise err or Damaged("The key ring of this store is unreadable; restore it from a backup.") from None
        try:
            grant = ring.find(token.tag)
        except Exception as exc:
            ring.close()
            err = storage_error(exc, self.data_dir)
            if err is not None and not isinstance(err, Damaged):
                raise err from None
            raise Damaged("The key ring of this store is unreadable; restore it from a backup.") from None
        if grant is None or grant.wrapped is None:
            ring.close()
            raise Unauthorized()
        # An expired capability is refused like a revoked one, before any key
        # work. The stored expiry is trusted here only to refuse: one edited
        # to extend the grant no longer matches its wrap, which then fails.
        if grant_terms.expired(ring.notes(grant.id).expires, datetime.now(UTC)):
            ring.close()
            raise Unauthorized()
        return token, files, ring, grant

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
                self.pool = self.tags.pool = None

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

    def check_token(self, token_text: str | tokens.Token | None) -> None:
        """Refuse a token that cannot be live (the cheap part of :meth:`session`)."""
        _, _, ring, _ = self._authenticate(token_text)
        ring.close()

    @contextlib.contextmanager
    def session(self, token_text: str | tokens.Token | None, need: str, pin: Head | None = None
                ) -> Iterator[Session]:
        """An authenticated session. A storage failure inside it (a full disk,
        a read-only folder, an unreadable file) becomes the refusal that says
        so, never a bare 500."""
        try:
            with self._session(token_text, need, pin) as session:
                yield session
        except StashError:
            raise
        except Exception as exc:
            err = storage_error(exc, self.data_dir)
            if err is None:
                raise
            raise err from None

    @contextlib.contextmanager
    def _session(self, token_text: str | tokens.Token | None, need: str, pin: Head | None) -> Iterator[Session]:
        token, files, ring, grant = self._authenticate(token_text)
        try:
            try:
                opened, grant = self._open_grant(ring, grant, token)
            except StaleGrant:
                raise Unauthorized() from None
            except aead.Unsealable:
                raise Damaged(
                    "This capability's key is damaged or was altered, so nothing was opened; "
                    "ask the owner for a new capability."
                ) from None
            ring.touch(grant.id, datetime.now(UTC).date().isoformat())
            # The scope is read only after the certificate authenticated it.
            if RANK[grant.scope] < RANK[need]:
                raise Forbidden(
                    f"This capability is scoped {grant.scope}; this route needs {need}. "
                    "Ask the owner for a capability with that scope.",
                    code="auth.scope",
                )
            if opened.unmoved:
                ring.move_grant(grant, opened)  # its secret is here now, and only now
            try:
                page_bytes = ring.memory_page_bytes()
            except ValueError:
                raise Damaged("The key ring's record of the memory file's page size is unreadable; restore it "
                              "from a backup.") from None
            if need == "owner":
                # The owner routes that read only the key ring (grants, audit,
                # rotate) must not serve a key ring put back from before a
                # rotation or revocation, which the memory file's epoch shows.
                try:
                    memfile.check_not_behind(memfile.FileKeys.derive(
                        files.memory, token.user_id, opened.chain, ring.meta("file_cipher") or "none", page_bytes))
                except KeysBehind:
                    if ring.epoch() > opened.chain.epoch:
                        raise Conflict("A capability was revoked while this request was being opened, so nothing "
                                       "was done; retry it.", code="store.rekeyed") from None
                    raise
            try:
                # Only the owner routes read owner-only data; the others
                # (wake, note, recall with the owner token) skip the box.
                owner = ring.owner_keys(grant, opened.kek, opened.chain) if need == "owner" else None
            except (aead.Unsealable, UnicodeDecodeError, ValueError):
                raise Damaged("The owner's key box or the owner-only data in the key ring was altered; restore the "
                              "key ring from a backup.") from None
            session = Session(token.user_id, grant.scope, grant.id, ring, files,
                              ring.meta("file_cipher") or "none", opened.chain.base, opened.chain,
                              capability_key(token.secret), pin, page_bytes, owner, self.pool)
            del opened
            try:
                yield session
                session.publish_head()
            finally:
                session.close()
        finally:
            self.tags.grants_seen(token.user_id, ring.conn)  # before the answer leaves: tag_index.py
            ring.close()
