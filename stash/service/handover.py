"""An owner rotation, in every memory of the identity: the one place the
old owner token's window is closed (docs/DESIGN.md, "Key epochs").

``POST /rotate`` files the new owner grant in main's key ring and leaves the
old token the owner everywhere until the new one is first used, so a lost
answer never leaves the owner without a working token. In the same
transaction it leaves, in main's key ring, one row per memory
(storage/keyring/owner_handover.py): the first grant ids minted from then on and,
for each memory but main, the secret the old token is enrolled under there,
sealed to the new grant's public key. A memory the old token creates or
forks in the window gets its row when it is made, from the pending
successor's public key (the new token's secret is not there yet).

The new token's first use then takes every memory over: main by retiring
the old owner grant (Keyring.retire_owner), every other memory by opening
its row with the new token's key and, in that memory's key ring, one new
epoch that revokes the old token's enrolment and every capability minted in
the window and enrols the new token, with an audit event there and in main.
Each memory's row is deleted only after its take-over committed, so a crash
in between leaves the row; the next owner request that needs it (an owner
route in main, or any owner request on that memory) finishes the work.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nacl.public import PrivateKey

from ..core.errors import StashError, Unauthorized
from ..crypto import aead, epochs, tokens
from ..crypto.epochs import KeyChain
from ..storage import memfile, memories
from ..storage.disk_errors import DB_ERRORS
from ..storage.keyring import Grant, Keyring, StaleGrant, inbox, open_keyring, owner_handover
from ..storage.keyring.owner_handover import Handover
from ..storage.memories import MAIN, MemoryFiles
from ..storage.sqlite.transactions import write_transaction

# service/access.py's Vault and Session: access imports this module, so they are named, not imported
# (the package's import graph has no cycle, tests/unit/test_layers.py).
Vault = Any
Session = Any

EVENT = "takeover"  # the audit event of a take-over (service/audit.py EVENTS)
# What one memory's take-over may fail with; the memory is then left as it is, named by the owner's listings.
_FAILURES: tuple[type[Exception], ...] = (StashError, aead.Unsealable, StaleGrant, ValueError, OSError, *DB_ERRORS)


def _public_of(main: Keyring, grant_id: int) -> bytes | None:
    return next((g.pub for g in main.grants() if g.id == grant_id and g.wrapped is not None), None)


def _floors(vault: Vault, user_id: str, number: int, name: str | None) -> tuple[int, int]:
    """The first read/full and append grant ids memory ``number`` mints
    from now on. A memory not yet published counts whole; one whose key ring
    does not open counts nothing (it can mint nothing meanwhile either)."""
    base = number * memories.GRANT_ID_SPAN
    if name is None:
        return base, base + memories.APPEND_ID_OFFSET
    try:
        with open_keyring(
            MemoryFiles(vault.data_dir, user_id, name).keyring, memories.store_id(user_id, name), vault.pool
        ) as ring:
            ids = [g.id for g in ring.grants()]
            return max([base, *ids]) + 1, inbox.next_id(ring.conn, number)
    except _FAILURES:
        top = base + memories.GRANT_ID_SPAN
        return top, top


def seal_rotation(vault: Vault, session: Session, successor: int, opening: bool) -> None:
    """In a rotation's transaction in main's key ring (``successor``: the new
    owner grant just filed): every memory's row, each box sealed to the new
    grant. ``opening``: no rotation was pending, so the window starts now
    (rows left by an earlier window are replaced); otherwise (a rotation sent
    again before any new token was used) each row keeps where its window
    started and whether its memory was made in it, and only its box moves
    to the newest successor."""
    main = session.keyring
    user_id = session.user_id
    public = _public_of(main, successor)
    assert public is not None  # just filed in format 2
    memories.sweep(vault.data_dir, user_id, main.conn)  # a published memory a crash left unnamed gets its name
    kept = {} if opening else owner_handover.all_of(main.conn)
    if opening:
        owner_handover.drop(main.conn)
    owner_handover.put(main.conn, kept.get(0) or Handover(0, successor, inbox.next_id(main.conn, 0), False, None))
    for number, salt, name in memories.salted(main.conn):
        row = kept.get(number)
        if row is None:
            grants, appends = _floors(vault, user_id, number, name)
            row = Handover(number, grants, appends, False, None)
        box = epochs.seal_for(
            public,
            owner_handover.context(user_id, number, successor),
            memories.owner_secret(session.owner_secret, salt),
        )
        owner_handover.put(main.conn, replace(row, box=box))


def seal_made(main: Keyring, user_id: str, number: int, salt: bytes, owner_secret: bytes) -> None:
    """A memory made (created or forked) while a rotation waits for its new
    token (inside the making's transaction in main's key ring, by the owner
    token whose secret is ``owner_secret``): its row, every capability of it
    counted in the window, its box sealed to the pending successor. Nothing
    while no rotation is pending; refused (401) when the maker is no longer
    the owner, its successor's first use having retired it since this
    request began, so no memory is made that only a retired token is
    enrolled in."""
    pending = main.pending_owner()
    maker = main.find(tokens.lookup_tag(user_id, owner_secret))
    if maker is None or maker.wrapped is None or maker.scope != "owner":
        raise Unauthorized()
    if pending is None:
        return
    public = _public_of(main, pending[1])
    if public is None:
        return  # the successor was ended meanwhile; a later rotation writes the row
    base = number * memories.GRANT_ID_SPAN
    box = epochs.seal_for(
        public, owner_handover.context(user_id, number, pending[1]), memories.owner_secret(owner_secret, salt)
    )
    owner_handover.put(main.conn, Handover(number, base, base + memories.APPEND_ID_OFFSET, True, box))


def retire(ring: Keyring, chain: KeyChain, grant: Grant, kek: bytes) -> KeyChain | None:
    """Main's take-over, at the successor's first use: the old owner grant
    retired, and every read, full and append grant minted in the window
    ended, with the audit event, in one transaction (Keyring.retire_owner).
    The new chain, or None when another request retired it first."""
    with write_transaction(ring.conn):
        row = owner_handover.of(ring.conn, 0)
        done = ring.retire_owner(chain, grant, kek, None if row is None else row.grants)
        if done is None:
            return None
        new, ended = done
        if row is not None:
            for a in inbox.grants(ring.conn):
                if a.revoked is None and a.id >= row.appends:
                    inbox.revoke(ring.conn, a.id)
                    ended.append(a.id)
        owner_handover.drop(ring.conn, 0)
        if ended:
            ring.record(grant.id, EVENT, {"memory": MAIN, "revoked": sorted(ended), "epoch": new.epoch}, new)
    return new


def due(main: Keyring, grant: Grant, target: str) -> bool:
    """Whether an owner request on memory ``target`` (not main) must first
    let main's session retire the old owner or take ``target`` over: the
    grant is a successor not yet used, or ``target`` still has a row."""
    if grant.scope != "owner":
        return False
    pending = main.pending_owner()
    if pending is not None:
        return pending[1] == grant.id
    number = memories.numbered(main.conn).get(target)
    return number is not None and owner_handover.of(main.conn, number) is not None


def take_over_all(vault: Vault, main: Keyring, grant: Grant, kek: bytes, secret: bytes, chain: KeyChain) -> None:
    """Take over every memory that still has a row, as the owner ``grant``
    (opened with ``kek``; ``secret``: its token's; ``chain``: main's keys):
    nothing while a rotation still waits for its new token. A memory that
    cannot be taken over now keeps its row and is left as it is."""
    if main.pending_owner() is not None:
        return
    rows = [r for n, r in sorted(owner_handover.all_of(main.conn).items()) if n != 0]
    if not rows:
        return
    memories.sweep(vault.data_dir, main.user_id, main.conn)
    private = epochs.capability_private_key(kek)
    for row in rows:
        try:
            _take_over(vault, main, grant.id, private, secret, chain, row)
        except _FAILURES:
            continue


def _take_over(
    vault: Vault, main: Keyring, successor: int, private: PrivateKey, secret: bytes, chain: KeyChain, row: Handover
) -> None:
    user_id = main.user_id
    salt = memories.salt_of(main.conn, row.number)
    name = memories.name_of(main.conn, row.number)
    if salt is None:
        owner_handover.drop(main.conn, row.number)  # deleted: nothing to take over
        return
    if name is None:
        return  # not published yet (a create or fork still building): its row waits for it
    files = MemoryFiles(vault.data_dir, user_id, name)
    if not files.exists():
        return
    new = memories.owner_secret(secret, salt)
    with open_keyring(files.keyring, memories.store_id(user_id, name), vault.pool) as ring:
        if memories.number_of(ring.conn) != row.number:
            return
        mine = ring.find(tokens.lookup_tag(user_id, new))
        if mine is not None and mine.wrapped is not None and mine.scope == "owner":
            # Taken over already, by a request a crash cut before it deleted the row.
            ended = [g.id for g in ring.grants() if g.revoked is not None and g.id >= row.grants and g.scope != "owner"]
            ended += [a.id for a in inbox.grants(ring.conn) if a.revoked is not None and a.id >= row.appends]
        else:
            ended, tags, moved = _move(vault, ring, files, user_id, successor, private, new, row)
            for tag in tags:
                memories.drop_tags(main.conn, tag=tag)
            vault.reseal(files, ring, moved)  # its memory file follows to the new epoch
    with write_transaction(main.conn):
        if owner_handover.of(main.conn, row.number) is None:
            return  # another request (another worker) finished this memory meanwhile
        if row.made or ended:
            main.record(successor, EVENT, {"memory": name, "made_in_window": row.made, "revoked": sorted(ended)}, chain)
        owner_handover.drop(main.conn, row.number)


def _move(
    vault: Vault,
    ring: Keyring,
    files: MemoryFiles,
    user_id: str,
    successor: int,
    private: PrivateKey,
    new: bytes,
    row: Handover,
) -> tuple[list[int], list[bytes], KeyChain]:
    """One memory's key ring moved to the new owner, in one transaction: a
    new epoch revoking the old owner's enrolment and every capability minted
    in the window, the new owner enrolled with the owner keys (a fresh seed
    added), the old owner's Idempotency-Key records deleted, and the event.
    The capabilities ended, their lookup tags (to drop from main's) and the
    memory's new keys."""
    if row.box is None:
        raise aead.Unsealable("the row holds no box")
    old = epochs.open_for(private, owner_handover.context(user_id, row.number, successor), row.box)
    was = ring.find(tokens.lookup_tag(user_id, old))
    if was is None or was.wrapped is None or was.scope != "owner":
        raise aead.Unsealable("the old owner token is not enrolled in this memory")
    opened = ring.open_grant(was, old)
    # A key ring put back from before a revocation in this memory is left as it is (store.rolled_back), never
    # moved to a new epoch that would hide that it is behind its memory file.
    memfile.check_not_behind(
        memfile.FileKeys.derive(
            files.memory, ring.user_id, opened.chain, ring.meta("file_cipher") or "none", ring.memory_page_bytes()
        )
    )
    owner = ring.owner_keys(was, opened.kek, opened.chain)
    with write_transaction(ring.conn):
        window = [g.id for g in ring.grants() if g.revoked is None and g.id >= row.grants and g.id != was.id]
        appends = [a for a in inbox.grants(ring.conn) if a.revoked is None and a.id >= row.appends]
        tags = [t for t in (ring.tag_of(g) for g in window) if t is not None]
        tags += [bytes(a.tag) for a in appends if a.tag is not None]
        moved, stranded, minted = ring.advance_epoch(
            opened.chain,
            (was.id, *window),
            owner=owner,
            mint={"scope": "owner", "tag": tokens.lookup_tag(user_id, new), "secret": new, "kdf": vault.kdf},
        )
        for a in appends:
            inbox.revoke(ring.conn, a.id)
        ring.end_owner_records()
        assert minted is not None  # a grant was minted with the epoch
        memories.note_owner(ring.conn, minted, successor)  # the audit names it as GET /grants does
        ended = sorted([*window, *stranded, *(a.id for a in appends)])
        ring.record(minted, EVENT, {"made_in_window": row.made, "revoked": ended, "epoch": moved.epoch}, moved)
    return ended, tags, moved
