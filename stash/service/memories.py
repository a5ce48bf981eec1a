"""One owner, many memories: the owner's routes over an identity's memories
and the capabilities bound to each (docs/DESIGN.md, "Memories").

Each memory has its own key ring, master key and epochs (storage/memories/__init__.py
for where it lives). The owner reaches every memory because it is enrolled
in each memory's key ring as a grant of its own (its public key and a box of
that memory's epoch key), made while the owner's secret is present: when the
memory is created, forked, or the owner token rotated. A read, append or
full capability is filed only in its own memory's key ring, and in main's
key ring only its lookup tag (to find the memory it is bound to), so with its
token and every file of the identity it opens nothing of another memory.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from ..core.errors import Conflict, Damaged, Invalid, StashError, Unauthorized
from ..crypto import aead, inbox_seal, keys, owner_seal, tokens
from ..crypto.epochs import KeyChain
from ..crypto.owner_seal import OwnerKeys
from ..storage import memories, userlock
from ..storage.disk_errors import storage_error
from ..storage.keyring import LABEL_PAD, Keyring, inbox, now_utc, open_keyring
from ..storage.memfile import MemoryFile
from ..storage.memories import MAIN, MemoryFiles
from ..storage.memories import fork as fork_files
from ..storage.sqlite.transactions import write_transaction
from . import audit, grant_label_expiry, handover
from .access import Session, Vault, unknown_memory
from .append import ensure_public

DEFAULT_MAX_MEMORIES = 100
Got = TypeVar("Got")
BAD_NAME = "A memory's name is 1 to 64 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit."


def _main(session: Session) -> Keyring:
    """Main's key ring, whichever memory the owner's session is on."""
    return session.main_keyring or session.keyring


def check_name(name: object) -> str:
    if not memories.valid_name(name):
        raise Invalid(BAD_NAME, code="memory.bad_name")
    assert isinstance(name, str)
    return name


def _ring(vault: Vault, user_id: str, name: str) -> Keyring:
    return open_keyring(
        MemoryFiles(vault.data_dir, user_id, name).keyring, memories.store_id(user_id, name), vault.pool
    )


def _build(vault: Vault, session: Session, name: str) -> tuple[MemoryFiles, KeyChain, int]:
    """A new, empty memory ``name`` in a staging folder, the owner enrolled:
    its key ring (2 KiB pages), a fresh master key, its memory file. Not
    published yet. Made while a rotation waits for its new token, it passes
    to that token at its first use like every other memory."""
    main = session.main_keyring or session.keyring
    with write_transaction(main.conn):
        number = memories.next_number(main.conn)
        salt = memories.new_salt(main.conn, number)
        # Made while a rotation waits for its new token: that token's way in, sealed to it (service/handover.py).
        handover.seal_made(main, session.user_id, number, salt, session.owner_secret)
    secret = memories.owner_secret(session.owner_secret, salt)
    staged = memories.staging(vault.data_dir, session.user_id, name)
    store = memories.store_id(session.user_id, name)
    chain = KeyChain(store, (keys.new_master_key(),))
    ring = Keyring.create(
        staged.keyring, store, vault.file_cipher, vault.page_bytes, ring_page_bytes=memories.RING_PAGE_BYTES
    )
    try:
        base = number * memories.GRANT_ID_SPAN
        ring.conn.execute("BEGIN IMMEDIATE")
        try:
            # The owner's grant here takes the first id of this memory's range; later grants follow it.
            ring.conn.execute("INSERT INTO grants(id, tag, scope, created) VALUES (?, NULL, 'read', '')", (base - 1,))
            enrolled = ring.add(
                scope="owner", tag=tokens.lookup_tag(session.user_id, secret), secret=secret, chain=chain, kdf=vault.kdf
            )
            ring.conn.execute("DELETE FROM grants WHERE id = ?", (base - 1,))
            owner = main.find(tokens.lookup_tag(session.user_id, session.owner_secret))
            if owner is not None:
                memories.note_owner(ring.conn, enrolled, owner.id)
            for meta, value in (
                (memories.NUMBER, str(number)),
                (memories.CREATED, now_utc()),
                (inbox_seal.PUBLIC_META, inbox_seal.public_text(chain)),
            ):
                ring.conn.execute("INSERT INTO keyring_meta(name, value) VALUES (?, ?)", (meta, value))
        except BaseException:
            ring.conn.rollback()
            raise
        ring.conn.commit()
        mf = MemoryFile(
            staged.memory, store, chain, vault.file_cipher, create=True, page_bytes=ring.memory_page_bytes()
        )
        head, version = mf.committed()
        mf.close()
        ring.advance_head(head, version, chain=chain)
    finally:
        ring.close()
    return staged, chain, number


def _refuse_existing(vault: Vault, session: Session, name: str) -> None:
    """409 when memory ``name`` exists: a create or fork resent after a lost
    answer. It is named in main's key ring first, in case a crash cut the
    first request between its rename and its naming (storage/memories/__init__.py,
    ``name_memory``)."""
    if not memories.exists(vault.data_dir, session.user_id, name):
        return
    with _ring(vault, session.user_id, name) as ring:
        memories.name_memory(_main(session).conn, memories.number_of(ring.conn), name)
    raise Conflict(f"A memory named {name} exists already; pick another name.", code="memory.exists")


def _room(vault: Vault, session: Session, max_memories: int) -> None:
    if len(memories.names(vault.data_dir, session.user_id)) >= max_memories:
        raise Conflict(
            f"This identity holds {max_memories} memories, the most this server allows; delete one "
            "(DELETE /memories/{name}) first.",
            code="memory.too_many",
        )


def create(vault: Vault, session: Session, name: object, max_memories: int = DEFAULT_MAX_MEMORIES) -> dict[str, Any]:
    """A new empty memory, published whole by one rename (storage/memories/__init__.py)."""
    name = check_name(name)
    memories.sweep(vault.data_dir, session.user_id, _main(session).conn)
    _refuse_existing(vault, session, name)
    _room(vault, session, max_memories)
    staged, _, number = _build(vault, session, name)
    if not memories.publish(staged):
        raise Conflict(f"A memory named {name} exists already; pick another name.", code="memory.exists")
    memories.name_memory(_main(session).conn, number, name)  # published: now a restore looks for it
    return describe(vault, session.user_id, name)


def describe(vault: Vault, user_id: str, name: str, owner: OwnerKeys | None = None) -> dict[str, Any]:
    """A memory's listing row, read from its key ring (``owner``: that
    memory's owner keys, which open its last write day)."""
    files = MemoryFiles(vault.data_dir, user_id, name)
    now = datetime.now(UTC)
    with _ring(vault, user_id, name) as ring:
        head = ring.log_head()
        # Live: neither revoked nor past its expiry, as GET /grants says.
        live = [
            g
            for g in ring.grants()
            if g.revoked is None
            and g.scope != "owner"
            and not grant_label_expiry.expired(ring.notes(g.id).expires, now)
        ]
        appends = [
            g
            for g in inbox.grants(ring.conn)
            if g.revoked is None and not grant_label_expiry.expired(ring.notes(g.id).expires, now)
        ]
        created = ring.meta(memories.CREATED) or next((g.created for g in ring.grants()), "")
        pending = inbox.pending(ring.conn)
        last = memories.write_day(ring, owner)
    size = 0
    for path in files.folder.iterdir():
        if path.is_file():
            try:
                size += path.stat().st_size
            except OSError:
                pass
    return {
        "name": name,
        "T": (head.count if head else 0) + pending,
        "bytes": size,
        "created": created,
        "last_write": last,
        "grants": len(live) + len(appends),
    }


def each_other(
    vault: Vault, session: Session, token: str | None, read: Callable[[str, Session], Got]
) -> tuple[list[tuple[str, Got]], list[dict[str, Any]]]:
    """``read`` on an owner session of every memory but main, in name order:
    what each gave, and each memory that could not be opened named with the
    refusal it got (damaged, rolled back, the owner not enrolled, a file
    missing), so one memory never takes a whole listing down. A memory
    deleted meanwhile is left out."""
    done: list[tuple[str, Got]] = []
    unopened: list[dict[str, Any]] = []
    for name in memories.names(vault.data_dir, session.user_id)[1:]:
        try:
            with vault.session(token, "owner", memory=name) as other:
                done.append((name, read(name, other)))
        except Unauthorized:
            raise  # the owner token itself is refused now (rotated meanwhile): the whole answer is
        except StashError as e:
            if e.code != "memory.unknown":
                unopened.append({"name": name, "error": e.code, "message": e.message})
    return done, unopened


def listing(vault: Vault, session: Session, token: str | None) -> dict[str, Any]:
    memories.sweep(vault.data_dir, session.user_id, _main(session).conn)
    rows = [describe(vault, session.user_id, MAIN, session.owner)]

    def row(name: str, other: Session) -> dict[str, Any]:
        # A memory made before main's key ring kept names gets its name there (what restore reads).
        memories.name_memory(_main(session).conn, memories.number_of(other.keyring.conn), name)
        return describe(vault, session.user_id, name, other.owner)

    done, unopened = each_other(vault, session, token, row)
    rows += [r for _, r in done]
    rows.sort(key=lambda r: (r["created"], r["name"]))
    return {"memories": rows, "unopened": unopened}


def delete(vault: Vault, session: Session, name: str) -> dict[str, Any]:
    """Destroy one memory for good: its salt, name and capabilities' tags
    ended in main's key ring in one transaction (from then on nothing opens
    it, :func:`memories.end`), then its folder renamed away and every file
    overwritten with zeros and removed (its key ring, and with it every key,
    first). ``main`` goes only with the identity."""
    if name == MAIN:
        raise Conflict("Memory main is deleted only with the whole identity: DELETE /store.", code="memory.main")
    memories.sweep(vault.data_dir, session.user_id, _main(session).conn)
    if not memories.exists(vault.data_dir, session.user_id, name):
        raise unknown_memory()
    files = MemoryFiles(vault.data_dir, session.user_id, name)
    with _ring(vault, session.user_id, name) as ring:
        head = ring.log_head()
        number = memories.number_of(ring.conn)
        ended = [g.id for g in ring.grants() if g.revoked is None and g.scope != "owner"]
        ended += [g.id for g in inbox.grants(ring.conn) if g.revoked is None]
    main = session.main_keyring or session.keyring
    with userlock.exclusive(files.folder):
        if vault.pool is not None:
            vault.pool.drop_folder(files.folder, held=True)
        # The commit: its salt, name and tags leave main's key ring at once, so from here no token opens it,
        # nor copies of its files kept from before; a crash after it leaves a folder no salt names, which the
        # next sweep shreds. Its receipt is kept right after (as DELETE /store's, audit.deletion_receipt).
        memories.end(main.conn, number, name)
        main.flush()
        answer = audit.deletion_receipt(
            vault.data_dir,
            {
                "memory": name,
                "destroyed": True,
                "memories": head.count if head else 0,
                "grants_ended": ended,
                "at": now_utc(),
            },
            session.grant_id,
            session.user_id,
        )
        try:
            gone = memories.retire(files, number)
        except FileNotFoundError:
            gone = None  # another request's sweep found it unsalted and took it away first
    if gone is not None:
        memories.shred(gone)
    vault.tags.grants_seen(session.user_id, main.conn)
    return answer


# ------------------------------------------------------------ bound capabilities


def memory_of_grant(vault: Vault, user_id: str, grant_id: int) -> str | None:
    """Which memory a grant id belongs to (storage/memories/__init__.py, "Ids")."""
    n = grant_id // memories.GRANT_ID_SPAN
    if n == 0:
        return MAIN
    unreadable: StashError | None = None
    for name in memories.names(vault.data_dir, user_id)[1:]:
        try:
            with _ring(vault, user_id, name) as ring:
                if memories.number_of(ring.conn) == n:
                    return name
        except Exception as exc:  # one memory's damage is not the others': look on, and say so if not found
            err = storage_error(exc, vault.data_dir)
            if err is None:
                raise
            unreadable = unreadable or err
    if unreadable is not None:
        raise unreadable
    return None


def grant_ids(session: Session) -> set[int]:
    """The id of every capability the session's memory has had, live or
    revoked, read, full, append and owner alike: whose writes an owner may
    undo there."""
    ring = session.keyring
    return {g.id for g in ring.grants()} | {g.id for g in inbox.grants(ring.conn)}


def every_grant(vault: Vault, session: Session, token: str | None) -> dict[str, Any]:
    """Every capability of the identity, each memory's with its ``memory``:
    main's from this session, every other memory's from an owner session on
    it (its labels are sealed to that memory's owner keys), and the memories
    that could not be opened (:func:`each_other`). The owner's enrolment in
    each memory is not listed again."""
    rows = [{**g, "memory": MAIN} for g in vault.list_grants(session)] + _appends(session, MAIN)
    done, unopened = each_other(
        vault,
        session,
        token,
        lambda name, other: [
            *({**g, "memory": name} for g in vault.list_grants(other) if g["scope"] != "owner"),
            *_appends(other, name),
        ],
    )
    for _, theirs in done:
        rows += theirs
    return {"grants": rows, "unopened": unopened}


def every_event(vault: Vault, session: Session, token: str | None) -> dict[str, Any]:
    """The audit trail of every memory, each event naming its ``memory``:
    each memory's events live in its own key ring, sealed to its owner keys,
    so each is opened by an owner session on it; oldest first by time (then
    memory and id, which number events within one memory); and the memories
    that could not be opened (:func:`each_other`)."""
    first = audit.trail(session)
    rows = [{**e, "memory": MAIN} for e in first["events"]]
    chains = [(MAIN, first["trail"])]
    # Main's owner capabilities, but a rotation's successor not used yet: no other memory enrols it before then.
    pending = _main(session).pending_owner()
    owners = sorted(
        g.id for g in _main(session).grants() if g.scope == "owner" and (pending is None or g.id != pending[1])
    )

    def read(name: str, other: Session) -> tuple[dict[str, Any], dict[int, int]]:
        return audit.trail(other), _as_listed(other.keyring, owners)

    done, unopened = each_other(vault, session, token, read)
    for name, (theirs, listed) in done:
        rows += [{**e, "memory": name, "grant": listed.get(e["grant"], e["grant"])} for e in theirs["events"]]
        chains.append((name, theirs["trail"]))
    rows.sort(key=lambda e: (str(e["at"]), e["memory"] != MAIN, e["memory"], e["id"]))
    broken = [(name, chain["problem"]) for name, chain in chains if not chain["intact"]]
    # A memory whose trail could not be read at all is not known to be whole either.
    broken += [(d["name"], f"its trail could not be read ({d['error']})") for d in unopened]
    trail = {
        "intact": not broken,
        "chained_from": first["trail"]["chained_from"],
        "problem": f"memory {broken[0][0]}: {broken[0][1]}" if broken else None,
    }
    return {"events": rows, "trail": trail, "unopened": unopened}


def _as_listed(ring: Keyring, owners: list[int]) -> dict[int, int]:
    """Each owner enrolment of another memory's key ring as main's owner
    capability it is, the one GET /grants lists: as recorded when it was
    enrolled (memories.note_owner), else, for a memory made before that
    record, by order (a memory's enrolments are made in the order of main's
    owner capabilities, the newest of each being the current owner)."""
    known = memories.owners_of(ring.conn)
    enrolments = sorted(g.id for g in ring.grants() if g.scope == "owner")
    guessed = dict(zip(reversed(enrolments), reversed(owners)))
    return {e: known.get(e, guessed.get(e, e)) for e in enrolments}


def _appends(session: Session, name: str) -> list[dict[str, Any]]:
    """The memory's append capabilities as ``GET /grants`` lists any: the
    label opened with the owner keys, the expiry and whether it passed."""
    ring, now = session.keyring, datetime.now(UTC)
    rows = []
    for g in inbox.grants(ring.conn):
        expires = ring.notes(g.id).expires
        try:
            label = ring.label(g.id, session.keys, session.owner)
        except (aead.Unsealable, UnicodeDecodeError):
            raise Damaged(f"The label of capability {g.id} was altered; restore the key ring from a backup.") from None
        expired = grant_label_expiry.expired(expires, now)
        rows.append(
            {
                "id": g.id,
                "scope": "append",
                "label": label,
                "created": g.created,
                "expires": expires,
                "revoked": g.revoked,
                "expired": expired,
                "live": g.revoked is None and not expired,
                "last_used": None,
                "you": False,
                "memory": name,
            }
        )
    return rows


def mint_append(
    vault: Vault, session: Session, label: str | None = None, expires: str | None = None
) -> tuple[int, str]:
    """A new append capability over the session's memory: its tag and a MAC
    under the memory's keys (binding its expiry); no key at all
    (service/append.py). Its label is sealed to the owner, as a read or full
    grant's is; its expiry refuses it as theirs does."""
    token, secret = tokens.mint(session.user_id)
    tag = tokens.lookup_tag(session.user_id, secret)
    ring = session.keyring
    ensure_public(ring, session.keys)
    number = memories.number_of(ring.conn)
    public = ring.owner_public()
    if label is not None and public is None:
        raise Invalid(
            "This memory has no owner key yet to seal a label to; mint it without a label.", code="grants.bad_label"
        )
    sealed = (
        None
        if label is None or public is None
        else (lambda gid: owner_seal.seal(ring.user_id, public, f"grant_label|{gid}", label.encode(), pad=LABEL_PAD))
    )
    grant_id = inbox.add(
        ring.conn,
        max(number, 0),
        tag,
        lambda gid: inbox_seal.grant_mac(session.keys, ring.user_id, gid, tag, expires),
        expires=expires,
        label_of=sealed,
    )
    if session.memory_name != MAIN and session.main_keyring is not None:
        memories.put_tag(session.main_keyring.conn, tag, session.memory_name, expires)
    return grant_id, token


# ------------------------------------------------------------ fork


def fork(
    vault: Vault, session: Session, name: object, at: object, max_memories: int = DEFAULT_MAX_MEMORIES
) -> dict[str, Any]:
    """A new, independent memory ``name`` holding the first ``at`` memories of
    the session's memory (default all), erased ones erased, the summaries of
    every block inside them and its sizes, all sealed afresh under the new
    memory's own keys; only the owner is enrolled in it, so no capability of
    the source opens it. Built whole in a staging folder and published by
    one rename."""
    name = check_name(name)
    src = session.open_memory()
    T = src.count()
    if at is None:
        at = T
    if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at <= T:
        raise Invalid(
            f"at must be a whole number from 0 to {T}, the notes this memory's log holds.", code="memory.bad_at"
        )
    memories.sweep(vault.data_dir, session.user_id, _main(session).conn)
    _refuse_existing(vault, session, name)
    _room(vault, session, max_memories)
    staged, chain, number = _build(vault, session, name)
    store = memories.store_id(session.user_id, name)
    with open_keyring(staged.keyring, store) as ring:
        dst = MemoryFile(
            staged.memory, store, chain, vault.file_cipher, page_bytes=ring.memory_page_bytes(), recorded=True
        )
        try:
            erased = fork_files.copy_log(src.mf, dst, at)
            if erased:
                dst.erase(erased, now_utc())
            summaries = fork_files.copy_tree(src.mf, dst, at)
            config: dict[str, int | None] = {**src.mf.config()}
            if config:
                dst.set_config(config)
            head, version = dst.committed()
        finally:
            dst.close()
        ring.advance_head(head, version, chain=chain)
    if not memories.publish(staged):
        raise Conflict(f"A memory named {name} exists already; pick another name.", code="memory.exists")
    memories.name_memory(_main(session).conn, number, name)  # published: now a restore looks for it
    return {
        **describe(vault, session.user_id, name),
        "source": session.memory_name,
        "at": at,
        "erased": len(erased),
        "summaries": summaries,
    }
