"""The append scope: notes written by a capability that holds no key
(docs/DESIGN.md, "Memories").

Under SQLCipher the memory file is encrypted with a key derived from the
memory's master key, and its rows, digest and state head are keyed too, so a
capability that holds no key cannot write into it. Its note is sealed to the
epoch's inbox public key and left in the memory's key ring (``inbox``); the
next read-capable open folds the waiting notes into the log, in order,
before it reads anything, so read-capable holders see them at once.

Ids stay exact positions: a note's answer names ``claim`` = the log's length
as the key ring's copy of the head records it plus the notes already
waiting, taken under the memory's lock held exclusive (so no write and no
fold runs meanwhile), and the fold appends every waiting note before any
other write can. A fold cut short by a crash is finished by the next one: a
note whose claim is already in the log, written by its grant with its day
and text, was folded and is not written twice. Only when the copy of the
head lags the file (a crash between a write's commit and the copy, or a
full disk) can a claim be low; the fold then appends the note at the end,
so nothing is lost, and its id is the one the log shows.
"""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from ..core import lines
from ..core.errors import Conflict, Damaged
from ..crypto import aead, inbox_seal
from ..storage import userlock
from ..storage.keyring import Keyring, inbox
from . import quotas


def ensure_public(ring: Keyring, chain: Any) -> None:
    """Record the current epoch's inbox public key when the key ring's
    record is missing or from another epoch (best effort: key rings made
    before the append scope, or before this release's revocations)."""
    want = inbox_seal.public_text(chain)
    if ring.meta(inbox_seal.PUBLIC_META) == want or ring.epoch() != chain.epoch:
        return
    try:
        with ring.conn:
            ring.conn.execute(
                "INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                (inbox_seal.PUBLIC_META, want),
            )
    except Exception:
        return


@contextlib.contextmanager
def noting(session: Any) -> Iterator[None]:
    """What :func:`note` runs inside: the memory's lock held exclusive, taken
    before the note's transaction on the key ring begins (its Idempotency-Key
    record, service/operation.py). Every read-capable request takes them in
    that order (it holds the lock shared while it writes the key ring: the
    fold, the copy of the head, an audit event); a note that held the key
    ring's write lock while it waited for the memory's lock would deadlock
    with it until SQLite's busy timeout."""
    with userlock.exclusive(session.files.folder):
        yield


def note(session: Any, text: object, limits: Any = None) -> dict[str, object]:
    """Leave one note for the memory, sealed to its inbox key; the answer
    carries its id and nothing of the memory (``nap`` is always null). Runs
    inside :func:`noting`."""
    text = lines.check_written(text, inbox_seal.TEXT_BYTES)
    ring: Keyring = session.keyring
    day = datetime.now(UTC).date().isoformat()
    public = inbox_seal.parse_public(ring.meta(inbox_seal.PUBLIC_META))
    if public is None or public[0] != ring.epoch():
        raise Conflict(
            "This memory has not been opened since its keys changed, so an append note cannot be "
            "sealed yet; retry after its owner or a read-capable agent has used it.",
            code="append.not_ready",
        )
    head = ring.log_head()
    claim = (head.count if head is not None else 0) + inbox.pending(ring.conn)
    if limits is not None:
        quotas.identity_room(session, claim - ring.erased_count(), 1, limits.memories, limits.bytes)
    sealed = inbox_seal.seal(public[1], ring.user_id, session.grant_id, claim, day, text)
    inbox.put(ring.conn, session.grant_id, public[0], claim, sealed)
    return {"id": claim, "nap": None}


def fold(session: Any, mf: Any) -> None:
    """Fold the waiting append notes into the log of ``mf`` (opened by a
    read-capable session, which holds its memory's lock shared): done with
    the lock held exclusive, then held shared again."""
    ring: Keyring = session.keyring
    ensure_public(ring, session.keys)
    if not inbox.pending(ring.conn):
        return
    lock = session._lock
    lock.release()
    try:
        with userlock.exclusive(session.files.folder):
            _fold(ring, mf, session.keys)
    finally:
        lock.acquire_shared()


def _fold(ring: Keyring, mf: Any, chain: Any) -> None:
    store = ring.user_id
    grants = {g.id: g for g in inbox.grants(ring.conn)}
    last = None
    for w in inbox.waiting(ring.conn):
        g = grants.get(w.grant_id)
        if (
            g is None
            or g.mac is None
            or g.tag is None
            or not hmac.compare_digest(
                bytes(g.mac), inbox_seal.grant_mac(chain, store, g.id, bytes(g.tag), ring.notes(g.id).expires)
            )
        ):
            raise Damaged(
                "A note waiting for this memory names an append capability its owner never minted; "
                "restore the key ring from a backup."
            )
        try:
            day, text = inbox_seal.open_note(chain, w.epoch, bytes(w.sealed), store, w.grant_id, w.claim)
        except aead.Unsealable:
            raise Damaged(
                "A note an append capability left for this memory was altered; restore the key ring from a backup."
            ) from None
        if not (w.claim < mf.count() and _folded(mf, w.claim, w.grant_id, day, text)):
            writer = mf.writer
            mf.writer = w.grant_id
            try:
                mf.append([(day, text)])
            finally:
                mf.writer = writer
        last = w.seq
    head, version = mf.committed()
    ring.advance_head(head, version, chain=chain)
    if last is not None:
        inbox.done(ring.conn, last)


def _folded(mf: Any, claim: int, grant_id: int, day: str, text: str) -> bool:
    """Memory #claim is this note (a fold cut short after its commit)."""
    _, date, written = mf.memory(claim)
    writer = mf.memory_writer(claim)
    return writer is None or (writer == grant_id and date == day and written == text)
