"""One owner, many memories: the owner's routes over an identity's memories
and the capabilities bound to each (docs/DESIGN.md, "Memories").

Each memory has its own key ring, master key and epochs (storage/memories.py
for where it lives). The owner reaches every memory because it is enrolled
in each memory's key ring as a grant of its own (its public key and a box of
that memory's epoch key), made while the owner's secret is present: when the
memory is created, forked, or the owner token rotated. A read, append or
full capability is filed only in its own memory's key ring, and in main's
key ring only its lookup tag (to find the memory it is bound to), so with its
token and every file of the identity it opens nothing of another memory.
"""

from __future__ import annotations

from ..core.errors import Conflict, Invalid
from ..crypto import inbox_seal, keys, tokens
from ..crypto.epochs import KeyChain
from ..storage import inbox, memories, userlock
from ..storage.keyring import Keyring, now_utc, open_keyring
from ..storage.memfile import MemoryFile
from ..storage.memories import MAIN, MemoryFiles
from .access import Session, Vault, unknown_memory
from .append import ensure_public

DEFAULT_MAX_MEMORIES = 100
BAD_NAME = ("A memory's name is 1 to 64 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or "
            "digit.")


def check_name(name: object) -> str:
    if not memories.valid_name(name):
        raise Invalid(BAD_NAME, code="memory.bad_name")
    assert isinstance(name, str)
    return name


def _ring(vault: Vault, user_id: str, name: str) -> Keyring:
    return open_keyring(MemoryFiles(vault.data_dir, user_id, name).keyring, memories.store_id(user_id, name),
                        vault.pool)


def _build(vault: Vault, session: Session, name: str) -> tuple[MemoryFiles, KeyChain, int]:
    """A new, empty memory ``name`` in a staging folder, the owner enrolled:
    its key ring (2 KiB pages), a fresh master key, its memory file. Not
    published yet."""
    number = memories.next_number(session.main_keyring.conn if session.main_keyring else session.keyring.conn)
    staged = memories.staging(vault.data_dir, session.user_id, name)
    store = memories.store_id(session.user_id, name)
    chain = KeyChain(store, (keys.new_master_key(),))
    ring = Keyring.create(staged.keyring, store, vault.file_cipher, vault.page_bytes,
                          ring_page_bytes=memories.RING_PAGE_BYTES)
    try:
        base = number * memories.GRANT_ID_SPAN
        ring.conn.execute("BEGIN IMMEDIATE")
        try:
            # The owner's grant here takes the first id of this memory's range; later grants follow it.
            ring.conn.execute("INSERT INTO grants(id, tag, scope, created) VALUES (?, NULL, 'read', '')", (base - 1,))
            ring.add(scope="owner", tag=session.tag, secret=session.owner_secret, chain=chain, kdf=vault.kdf)
            ring.conn.execute("DELETE FROM grants WHERE id = ?", (base - 1,))
            for meta, value in ((memories.NUMBER, str(number)), (memories.CREATED, now_utc()),
                                (inbox_seal.PUBLIC_META, inbox_seal.public_text(chain))):
                ring.conn.execute("INSERT INTO keyring_meta(name, value) VALUES (?, ?)", (meta, value))
        except BaseException:
            ring.conn.rollback()
            raise
        ring.conn.commit()
        mf = MemoryFile(staged.memory, store, chain, vault.file_cipher, create=True,
                        page_bytes=ring.memory_page_bytes())
        head, version = mf.committed()
        mf.close()
        ring.advance_head(head, version)
    finally:
        ring.close()
    return staged, chain, number


def _room(vault: Vault, session: Session, max_memories: int) -> None:
    if len(memories.names(vault.data_dir, session.user_id)) >= max_memories:
        raise Conflict(f"This identity holds {max_memories} memories, the most this server allows; delete one "
                       "(DELETE /memories/{name}) first.", code="memory.too_many")


def create(vault: Vault, session: Session, name: object, max_memories: int = DEFAULT_MAX_MEMORIES) -> dict:
    """A new empty memory, published whole by one rename (storage/memories.py)."""
    name = check_name(name)
    memories.sweep(vault.data_dir, session.user_id)
    if memories.exists(vault.data_dir, session.user_id, name):
        raise Conflict(f"A memory named {name} exists already; pick another name.", code="memory.exists")
    _room(vault, session, max_memories)
    staged, _, _ = _build(vault, session, name)
    if not memories.publish(staged):
        raise Conflict(f"A memory named {name} exists already; pick another name.", code="memory.exists")
    return describe(vault, session.user_id, name)


def describe(vault: Vault, user_id: str, name: str) -> dict:
    """A memory's listing row, read from its key ring only (no key needed)."""
    files = MemoryFiles(vault.data_dir, user_id, name)
    with _ring(vault, user_id, name) as ring:
        head = ring.log_head()
        live = [g for g in ring.grants() if g.revoked is None and g.scope != "owner"]
        appends = [g for g in inbox.grants(ring.conn) if g.revoked is None]
        created = ring.meta(memories.CREATED) or next((g.created for g in ring.grants()), "")
        pending = inbox.pending(ring.conn)
        last = ring.meta("last_write")
    size = 0
    for path in files.folder.iterdir():
        if path.is_file():
            try:
                size += path.stat().st_size
            except OSError:
                pass
    return {"name": name, "T": (head.count if head else 0) + pending, "bytes": size, "created": created,
            "last_write": last, "grants": len(live) + len(appends)}


def listing(vault: Vault, session: Session) -> dict:
    rows = [describe(vault, session.user_id, n) for n in memories.names(vault.data_dir, session.user_id)]
    rows.sort(key=lambda r: (r["created"], r["name"]))
    return {"memories": rows}


def delete(vault: Vault, session: Session, name: str) -> dict:
    """Destroy one memory for good: renamed away in one step (from then on
    nothing opens it), every file overwritten with zeros and removed (its
    key ring, and with it every key, first), its capabilities' tags dropped
    from main's key ring. ``main`` goes only with the identity."""
    if name == MAIN:
        raise Conflict("Memory main is deleted only with the whole identity: DELETE /store.",
                       code="memory.main")
    if not memories.exists(vault.data_dir, session.user_id, name):
        raise unknown_memory()
    files = MemoryFiles(vault.data_dir, session.user_id, name)
    with _ring(vault, session.user_id, name) as ring:
        head = ring.log_head()
        ended = [g.id for g in ring.grants() if g.revoked is None and g.scope != "owner"]
        ended += [g.id for g in inbox.grants(ring.conn) if g.revoked is None]
    with userlock.exclusive(files.folder):
        if vault.pool is not None:
            vault.pool.drop_folder(files.folder, held=True)
        gone = memories.retire(files)
    memories.shred(gone)
    main = session.main_keyring or session.keyring
    memories.drop_tags(main.conn, memory=name)
    vault.tags.grants_seen(session.user_id, main.conn)
    return {"memory": name, "destroyed": True, "memories": head.count if head else 0, "grants_ended": ended,
            "at": now_utc()}


# ------------------------------------------------------------ bound capabilities


def memory_of_grant(vault: Vault, user_id: str, grant_id: int) -> str | None:
    """Which memory a grant id belongs to (storage/memories.py, "Ids")."""
    n = grant_id // memories.GRANT_ID_SPAN
    if n == 0:
        return MAIN
    for name in memories.names(vault.data_dir, user_id)[1:]:
        with _ring(vault, user_id, name) as ring:
            if memories.number_of(ring.conn) == n:
                return name
    return None


def every_grant(vault: Vault, session: Session, token: str | None) -> list[dict]:
    """Every capability of the identity, each memory's with its ``memory``:
    main's from this session, every other memory's from an owner session on
    it (its labels are sealed to that memory's owner keys). The owner's
    enrolment in each memory is not listed again."""
    rows = [{**g, "memory": MAIN} for g in vault.list_grants(session)] + _appends(session.keyring, MAIN)
    for name in memories.names(vault.data_dir, session.user_id)[1:]:
        with vault.session(token, "owner", memory=name) as other:
            rows += [{**g, "memory": name} for g in vault.list_grants(other) if g["scope"] != "owner"]
            rows += _appends(other.keyring, name)
    return rows


def _appends(ring: Keyring, name: str) -> list[dict]:
    return [{"id": g.id, "scope": "append", "label": None, "created": g.created, "expires": None,
             "revoked": g.revoked, "expired": False, "live": g.revoked is None, "last_used": None, "you": False,
             "memory": name} for g in inbox.grants(ring.conn)]


def mint_append(vault: Vault, session: Session) -> tuple[int, str]:
    """A new append capability over the session's memory: its tag and a MAC
    under the memory's keys; no key at all (service/append.py)."""
    token, secret = tokens.mint(session.user_id)
    tag = tokens.lookup_tag(session.user_id, secret)
    ring = session.keyring
    ensure_public(ring, session.keys)
    number = memories.number_of(ring.conn)
    grant_id = inbox.add(ring.conn, max(number, 0), tag,
                         lambda gid: inbox_seal.grant_mac(session.keys, ring.user_id, gid, tag))
    if session.memory_name != MAIN and session.main_keyring is not None:
        memories.put_tag(session.main_keyring.conn, tag, session.memory_name)
    return grant_id, token


def file_tag(session: Session, tag: bytes) -> None:
    """Record in main's key ring which memory a new capability is bound to."""
    if session.memory_name != MAIN and session.main_keyring is not None:
        memories.put_tag(session.main_keyring.conn, tag, session.memory_name)
