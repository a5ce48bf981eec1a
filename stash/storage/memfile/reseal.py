"""Key epochs and re-sealing: matching a file's epoch to its key chain and
moving every value sealed under a rows key to the current epoch's.

A file is never ahead of its key ring (:class:`KeysBehind`); one behind is
re-sealed whole, in one transaction, only while no other request has it
open (:class:`ResealDue`).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from typing import Any

from ...core.errors import Damaged, RolledBack
from ...crypto import aead, keys
from ...crypto.epochs import KeyChain
from ..files import checkpoint, connect, release, write_transaction
from .base import EPOCH_META, FileKeys
from .log import CHUNK_BYTES, KEYS_PER_CHUNK
from .rows import RowCodec

RESEAL_BATCH = 4096
KEYS_BEHIND = ("This memory file was sealed in a later key epoch than its key ring knows: the key ring was "
               "replaced with an older copy. Nothing was served; the operator should run `stash verify` and "
               "restore this store from a backup.")


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
    file open (access.Session.memory), since a request still working under
    the old epoch's keys would otherwise read or write across the change."""


class ResealPart(RowCodec):
    def file_epoch(self) -> int:
        """The epoch whose key sealed this file's rows (0 for files written
        before epochs). A hand-edited value only makes the rows fail to open."""
        row = self.conn.execute("SELECT value FROM meta WHERE name = ?", (EPOCH_META,)).fetchone()
        try:
            return 0 if row is None else int(row[0])
        except ValueError:
            raise Damaged("The memory file's key epoch is unreadable; restore this store from a backup.") from None

    def _match_epoch(self, keychain: KeyChain | None) -> None:
        """Make the file's epoch the chain's: refuse a file from a later epoch
        (:class:`KeysBehind`), and bring a file from an earlier one forward
        (:meth:`reseal`), which finishes a revocation that stopped between
        its two files."""
        epoch = self.file_epoch()
        if epoch > self.epoch:
            raise KeysBehind(KEYS_BEHIND)
        if epoch < self.epoch:
            if keychain is None:
                raise Damaged("The memory file is from an older key epoch; retry the request.")
            if not getattr(self, "_may_reseal", True):
                raise ResealDue()
            self.reseal(keychain)

    def reseal(self, keychain: KeyChain) -> int:
        """Re-seal every value this file seals under a rows key (memory-key
        chunks, summaries, config, erasure dates and receipts) from its
        epoch's key to ``keychain``'s current one, in one transaction, and record
        the new epoch. The slots of the newest memory-key chunk that no memory
        uses yet get fresh random keys, so a memory written from now on has a
        key no older key ever sealed; idempotency records (sealed under an
        epoch-derived key) are dropped. Log rows are not touched: each is
        sealed under its own memory key. Returns how many values moved.

        After this, an older epoch's key opens nothing in this file but the
        SQLCipher layer (whose key is epoch 0's): row counts and positions,
        never a value written from now on."""
        new_key = keys.subkey(keychain.current, b"rows")
        moved = 0
        with write_transaction(self.conn):
            epoch = self.file_epoch()
            if epoch == keychain.epoch:
                return 0
            if epoch > keychain.epoch:
                raise KeysBehind(KEYS_BEHIND)
            old_key = keys.subkey(keychain.key(epoch), b"rows")
            stored = self._stored_state()
            if stored is not None and not hmac.compare_digest(
                    stored[1], self._state_mac(stored[0], self._state_digest()[0], old_key)):
                # Re-sealing must not bless a state that was tampered with.
                raise Damaged("This memory file's state does not match its authenticated head; nothing was "
                              "re-sealed. The operator should run `stash verify` and restore it from a backup.")
            T = self.count()
            fresh_from = (T // KEYS_PER_CHUNK, T % KEYS_PER_CHUNK)

            def chunk_plain(c: int, plain: bytes) -> bytes:
                if c == fresh_from[0] and len(plain) == CHUNK_BYTES:
                    k = fresh_from[1] * aead.KEY_BYTES
                    return plain[:k] + os.urandom(CHUNK_BYTES - k)
                return plain

            moved += self._reseal_table("memory_keys", ("chunk",), old_key, new_key,
                                        lambda r: r[0], lambda r, p: chunk_plain(r[0], p))
            moved += self._reseal_table("summaries", ("size", "idx"), old_key, new_key,
                                        lambda r: f"{r[0]}|{r[1]}")
            moved += self._reseal_table("config", ("name",), old_key, new_key, lambda r: r[0])
            moved += self._reseal_table("erased", ("id",), old_key, new_key, lambda r: r[0])
            moved += self._reseal_table("erasures", ("id",), old_key, new_key, lambda r: r[0])
            if "idempotency" in self._tables():
                self.conn.execute("DELETE FROM idempotency")
            self._put_meta(EPOCH_META, str(keychain.epoch))
            old_rows_key, self._rows_key = self._rows_key, new_key
            try:
                if self._stored_state() is not None:
                    self._write_state()  # the head's MAC key is the new epoch's
            except BaseException:
                self._rows_key = old_rows_key
                raise
        self._rows_key = new_key
        self.epoch = keychain.epoch
        self._fk = FileKeys(self._fk.path, self.user_id, self._fk.cipher, new_key, self._fk.file_key,
                            self._chain_key, keychain.epoch, self._fk.page_bytes)
        self._chunks.clear()
        checkpoint(self.conn)  # best effort: the old pages leave the WAL
        return moved

    def _reseal_table(self, table: str, pk: tuple[str, ...], old_key: bytes, new_key: bytes,
                      position: Callable[[tuple[Any, ...]], str | int],
                      transform: Callable[[tuple[Any, ...], bytes], bytes] | None = None) -> int:
        """Re-seal one table in primary-key order, a batch at a time, so a
        million summaries are never held at once. A value that does not open
        under the old key is damage: nothing is re-sealed (the caller's
        transaction rolls back)."""
        if table not in self._tables():
            return 0  # never made: nothing sealed in it
        cols = ", ".join(pk)
        after: tuple[Any, ...] | None = None
        moved = 0
        opener = aead.BulkOpener(CHUNK_BYTES)
        sealer = aead.BulkSealer(CHUNK_BYTES)
        while True:
            where = "" if after is None else f"WHERE ({cols}) > ({', '.join('?' * len(pk))})"
            rows = self.conn.execute(f"SELECT {cols}, sealed FROM {table} {where} ORDER BY {cols} LIMIT ?",
                                     (*(after or ()), RESEAL_BATCH)).fetchall()
            if not rows:
                return moved
            updates = []
            for row in rows:
                key, sealed = row[:-1], row[-1]
                ad = self._aad(table, position(key))
                try:
                    plain = bytes(opener.open(old_key, sealed, ad))
                except aead.Unsealable:
                    raise Damaged(f"Stored {table} data at {position(key)} failed its integrity check; nothing "
                                  "was re-sealed. Restore this store from a backup.") from None
                if transform is not None:
                    plain = transform(key, plain)
                updates.append((sealer.seal(new_key, plain, ad), *key))
            self.conn.executemany(
                f"UPDATE {table} SET sealed = ? WHERE {' AND '.join(f'{c} = ?' for c in pk)}", updates)
            moved += len(rows)
            after = rows[-1][:-1]
