"""Key epochs and re-sealing: matching a file's epoch to its key chain and
moving every value sealed under a rows key to the current epoch's.

A file is never ahead of its key ring (:class:`KeysBehind`); one behind is
moved to the new epoch in one transaction of constant work (rows keep the
epoch that sealed them), only while no other request has it open
(:class:`ResealDue`).
"""

from __future__ import annotations

import hmac
import os

from ...core.errors import Damaged, RolledBack
from ...crypto import aead, keys
from ...crypto.epochs import KeyChain
from ..formats import SUMMARY_PLAINTEXT_BYTES, SUMMARY_VERSION_BYTES
from ..sqlite.connections import connect, release
from ..sqlite.transactions import checkpoint, write_transaction
from .base import CHUNK_BYTES, EPOCH_META, KEYS_PER_CHUNK, SEALED_BASE_META, SEALED_TABLES, FileBase, FileKeys
from .bound import RowDigests
from .row_tree import key_slot, summary_slot
from .rows import WRITER_BYTES, RowCodec
from .state import State
from .tree import SummaryTree

KEYS_BEHIND = (
    "This memory file was sealed in a later key epoch than its key ring knows: the key ring was "
    "replaced with an older copy. Nothing was served; the operator should run `stash verify` and "
    "restore this store from a backup."
)


class KeysBehind(RolledBack):
    """The file's rows are sealed in a later epoch than the key chain it was
    opened with: an older key ring was put back (or, during a revocation, the
    request read the ring just before the epoch moved)."""


def check_not_behind(fk: FileKeys) -> None:
    """Refuse (:class:`KeysBehind`) when the memory file at ``fk.path`` says
    its rows are sealed in a later key epoch than ``fk``'s: the key ring (or
    a page of it) was put back from before a revocation or rotation. Reads
    that one value only, so the key-ring routes stay usable when the file is
    missing or damaged (then nothing is refused here: an owner can still
    revoke a leaked token)."""
    try:
        conn = connect(fk.path, file_key=fk.file_key, cipher=fk.cipher, page_bytes=fk.page_bytes)
    except Exception:  # missing, damaged, busy: the key-ring route goes on
        return
    try:
        row = conn.execute("SELECT value FROM meta WHERE name = ?", (EPOCH_META,)).fetchone()
        epoch = 0 if row is None else int(row[0])
    except Exception:
        epoch = 0
    finally:
        release(conn, fk.path, fk.file_key)
    if epoch > fk.epoch:
        raise KeysBehind(KEYS_BEHIND)


class ResealDue(Exception):
    """The file is from an earlier epoch than the key chain, and this open
    may not re-seal it: the caller re-seals it while no other request has the
    file open (access.Session.open_memory), since a request still working under
    the old epoch's keys would otherwise read or write across the change."""


class Epochs:
    """The key epoch of ``file``: matched to its key chain on open, and moved
    on (:meth:`reseal`); its rows sealed by ``codec``, bound by ``digests``,
    its summaries (``tree``) re-sealed to their buckets, ``state`` advanced."""

    def __init__(self, file: FileBase, codec: RowCodec, digests: RowDigests, state: State, tree: SummaryTree) -> None:
        self.file = file
        self.codec = codec
        self.digests = digests
        self.state = state
        self.tree = tree

    def file_epoch(self) -> int:
        """The epoch whose key sealed this file's rows (0 for files written
        before epochs). A hand-edited value only makes the rows fail to open."""
        row = self.file.conn.execute("SELECT value FROM meta WHERE name = ?", (EPOCH_META,)).fetchone()
        try:
            return 0 if row is None else int(row[0])
        except ValueError:
            raise Damaged("The memory file's key epoch is unreadable; restore this store from a backup.") from None

    def match(self, keychain: KeyChain | None) -> None:
        """Make the file's epoch the chain's: refuse a file from a later epoch
        (:class:`KeysBehind`), and bring a file from an earlier one forward
        (:meth:`reseal`), which finishes a revocation that stopped between
        its two files."""
        epoch = self.file_epoch()
        if epoch > self.file.epoch:
            raise KeysBehind(KEYS_BEHIND)
        if epoch < self.file.epoch:
            if keychain is None:
                raise Damaged("The memory file is from an older key epoch; retry the request.")
            if not self.file.may_reseal:
                raise ResealDue()
            self.reseal(keychain)
        self.file.base_epoch = self.read_base()

    def read_base(self) -> int:
        """The epoch of rows whose ``epoch`` is NULL (:data:`SEALED_BASE_META`;
        absent: the file's own epoch, since no new epoch has begun in it
        since rows record theirs)."""
        row = self.file.conn.execute("SELECT value FROM meta WHERE name = ?", (SEALED_BASE_META,)).fetchone()
        try:
            return self.file_epoch() if row is None else int(row[0])
        except ValueError:
            raise Damaged("The memory file's base key epoch is unreadable; restore this store from a backup.") from None

    def reseal(self, keychain: KeyChain) -> int:
        """Move this file to ``keychain``'s current epoch, in one transaction
        whose work does not grow with the memory: every row already sealed
        stays sealed under the key of the epoch that wrote it (each row
        records that epoch, :data:`SEALED_BASE_META` for the rows from before
        the column), and every row written from now on is sealed under the
        new epoch's rows key. The slots of the newest memory-key chunk that no
        memory uses yet get fresh random keys and the chunk is sealed under
        the new key, so a memory written from now on has a key no older key
        ever sealed; idempotency records (sealed under an epoch-derived key)
        are dropped; the authenticated head moves to the new key. Returns how
        many rows were re-sealed (0 or 1).

        So a key of an earlier epoch opens nothing written from now on, in
        this file or any later copy; what it opens in the current file is
        what it could open before (docs/DESIGN.md, "Key epochs")."""
        new_key = keys.subkey(keychain.current, b"rows")
        moved = 0
        with write_transaction(self.file.conn):
            epoch = self.file_epoch()
            if epoch == keychain.epoch:
                return 0
            if epoch > keychain.epoch:
                raise KeysBehind(KEYS_BEHIND)
            old_key = keys.subkey(keychain.key(epoch), b"rows")
            stored = self.file.stored_state()
            if stored is not None and not hmac.compare_digest(
                stored[1], self.state.mac(stored[0], self.state.digest()[0], old_key)
            ):
                # Moving the head to the new key must not bless a state that was tampered with.
                raise Damaged(
                    "This memory file's state does not match its authenticated head; nothing was "
                    "re-sealed. The operator should run `stash verify` and restore it from a backup."
                )
            if stored is not None:
                self.digests.trust_root(*self.file.root_seen)  # the chunk re-sealed below is one the tree holds
            tables = self.file.tables()
            if self.file.conn.execute("SELECT 1 FROM meta WHERE name = ?", (SEALED_BASE_META,)).fetchone() is None:
                # From now on rows of two epochs live side by side: each says
                # which. The rows so far are all in this file's epoch.
                for table in SEALED_TABLES:
                    if table in tables and not self.codec.has_epoch(table):
                        self.file.conn.execute(f"ALTER TABLE {table} ADD COLUMN epoch INTEGER")
                self.file.put_meta(SEALED_BASE_META, str(epoch))
            self.file.epoch_columns.clear()
            T = self.file.count()
            c, used = T // KEYS_PER_CHUNK, T % KEYS_PER_CHUNK
            row = (
                self.file.conn.execute("SELECT sealed, epoch FROM memory_keys WHERE chunk = ?", (c,)).fetchone()
                if "memory_keys" in tables
                else None
            )
            base = self.read_base()
            if row is not None:
                row = self.digests.authentic(key_slot(c), row[0], row[1])
                try:
                    chunk_key = keys.subkey(keychain.key(base if row[1] is None else int(row[1])), b"rows")
                except (KeyError, ValueError):
                    raise Damaged(
                        "A memory key chunk names a key epoch this file cannot have; restore this store from a backup."
                    ) from None
                plain = self.codec.open(chunk_key, row[0], "memory_keys", c)
                if len(plain) != CHUNK_BYTES:
                    raise Damaged("A memory key chunk has the wrong size; restore this store from a backup.")
                k = used * aead.KEY_BYTES
                fresh = plain[:k] + os.urandom(CHUNK_BYTES - k)
                sealed = aead.seal(new_key, fresh, self.codec.aad("memory_keys", c))
                self.file.conn.execute(
                    "UPDATE memory_keys SET sealed = ?, epoch = ? WHERE chunk = ?", (sealed, keychain.epoch, c)
                )
                self.digests.bind(key_slot(c), sealed)
                moved = 1
            if "idempotency" in tables:
                self.file.conn.execute("DELETE FROM idempotency")
            self.file.put_meta(EPOCH_META, str(keychain.epoch))
            old_rows_key, self.file.rows_key = self.file.rows_key, new_key
            try:
                if self.file.stored_state() is not None:
                    self.state.write()  # the head's MAC key is the new epoch's
            except BaseException:
                self.file.rows_key = old_rows_key
                raise
        self.file.rows_key = new_key
        self.file.keychain = keychain
        self.file.epoch_keys.clear()
        self.file.epoch = keychain.epoch
        self.file.base_epoch = self.read_base()
        self.file.fk = FileKeys(
            self.file.fk.path,
            self.file.user_id,
            self.file.fk.cipher,
            new_key,
            self.file.fk.file_key,
            self.file.chain_key,
            keychain.epoch,
            self.file.fk.page_bytes,
        )
        self.file.chunks.clear()
        checkpoint(self.file.conn)  # best effort: the newest chunk's old page leaves the WAL
        return moved

    def rebucket_summaries(self, limit: int) -> int:
        """Re-seal up to ``limit`` summaries of the one-size layouts (formats.py,
        "unversioned summaries", "versioned summaries") padded to their
        buckets ("rows in buckets"), in one write transaction; returns how
        many (0: none is left). Each keeps its state version, writer and
        text, so what it serves and whether it is current
        (:meth:`SummaryTree._summary_valid`) do not change; the state head moves, as
        its tree of row digests holds each summary's bytes (bound.py). A
        summary that does not open raises :class:`Damaged` and nothing is
        written. It is sealed under the current epoch's rows key, as a nap
        now would seal it."""
        if not self.file.made("summaries"):
            return 0
        old = [n + aead.OVERHEAD for n in (SUMMARY_PLAINTEXT_BYTES, SUMMARY_VERSION_BYTES + SUMMARY_PLAINTEXT_BYTES)]
        with write_transaction(self.file.conn):
            rows = self.file.conn.execute(
                f"SELECT size, idx, sealed, {self.codec.epoch_sql('summaries')} FROM summaries "
                "WHERE length(sealed) IN (?, ?) LIMIT ?",
                (*old, limit),
            ).fetchall()
            also, _, epoch = self.codec.epoch_of_write("summaries")
            for size, idx, sealed, row_epoch in rows:
                version, plain = self.tree.open_summary(size, idx, sealed, row_epoch)
                try:
                    text = aead.unpad(plain[:-WRITER_BYTES]).decode()
                except (aead.Unsealable, UnicodeDecodeError):
                    raise Damaged(
                        f"The summary of {idx * size}-{(idx + 1) * size - 1} is unreadable; nothing was re-sealed."
                    ) from None
                fresh = aead.seal(
                    self.file.rows_key,
                    self.codec.summary_plain(version, text, self.codec.writer_of(plain)),
                    self.codec.aad("summaries", f"{size}|{idx}"),
                )
                self.file.conn.execute(
                    f"UPDATE summaries SET sealed = ?{also.replace(', epoch', ', epoch = ?')} "
                    "WHERE size = ? AND idx = ?",
                    (fresh, *epoch, size, idx),
                )
                self.digests.bind(summary_slot(size, idx), fresh)
            if rows:
                self.state.write()  # the tree of row digests holds each summary's new bytes
        return len(rows)
