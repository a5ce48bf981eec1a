"""The memory file handle: opening a user's file with its keys, closing it,
and its sealed config; what it stores and reads is in its parts.

A file is opened for one request with the master key (or key chain) and
closed at its end. Opening checks it belongs to its user, that its key epoch
matches the chain's, that its log ends on its recorded head and that its
state matches its authenticated head; any value that fails to open raises
:class:`Damaged` — it is never served.
"""

from __future__ import annotations

from pathlib import Path

from ...core.errors import Damaged, Unavailable
from ...crypto import aead, chain
from ...crypto.chain import Head
from ...crypto.epochs import KeyChain
from .. import formats
from ..disk_errors import MissingFile, storage_error
from ..formats import PAGE_BYTES
from ..idempotency_table import Records
from ..sqlite.connections import connect, release
from ..sqlite.pool import Pool
from ..sqlite.schema import sections
from ..sqlite.transactions import write_transaction
from .base import EPOCH_META, HEAD_META, FileKeys
from .binds import BindPart
from .bound import BoundPart
from .budget import BudgetPart
from .erasure import ErasurePart
from .head import HeadPart
from .log import LogPart
from .reseal import ResealDue, ResealPart
from .short_part import ShortRowsPart
from .state import StatePart
from .tree import TreePart


def _raise_if_unavailable(exc: Exception, folder: Path) -> None:
    """A file that cannot be opened for a reason outside its bytes (a full
    disk, a read-only folder) is reported as that, not as damage; the file's
    ``folder`` tells a full disk from an unreadable file, since SQLite
    reports a WAL index it had no room to create as an I/O error."""
    err = storage_error(exc, folder)
    if isinstance(err, Unavailable):
        raise err from None


class MemoryFile(
    LogPart, ShortRowsPart, ErasurePart, TreePart, StatePart, HeadPart, ResealPart, BoundPart, BindPart, BudgetPart
):
    """A user's memory file: the sealed log, summary tree and config."""

    def __init__(
        self,
        path: Path,
        user_id: str,
        master: bytes | KeyChain,
        cipher: str,
        *,
        create: bool = False,
        page_bytes: int = PAGE_BYTES,
        recorded: bool = False,
        pool: Pool | None = None,
        reseal: bool = True,
    ) -> None:
        """``page_bytes``: the page size of a new file, or the one an existing
        SQLCipher file was made with (the key ring records it). ``recorded``:
        the key ring holds a copy of this file's state version, so the file
        had one (:meth:`_check_state`). ``pool``: where its connection may be
        kept between requests. ``reseal`` False: a file from an earlier epoch
        raises :class:`ResealDue` instead of being re-sealed here."""
        self._pool = pool
        self._may_reseal = reseal
        keychain = master if isinstance(master, KeyChain) else KeyChain(user_id, (master,))
        self._setup(FileKeys.derive(path, user_id, keychain, cipher, page_bytes), create, keychain, recorded)

    def file_keys(self) -> FileKeys:
        return self._fk

    def _setup(self, fk: FileKeys, create: bool, keychain: KeyChain | None = None, recorded: bool = False) -> None:
        self._fk = fk
        self._path = fk.path
        self.user_id = user_id = fk.user_id
        self._rows_key = fk.rows_key
        path, file_key, cipher = fk.path, fk.file_key, fk.cipher
        try:
            self.conn = connect(
                path, file_key=file_key, cipher=cipher, create=create, page_bytes=fk.page_bytes, pool=self._pool
            )
        except MissingFile:
            raise
        except Exception as exc:
            _raise_if_unavailable(exc, path.parent)
            raise Damaged(
                "The memory file cannot be opened: it is damaged or was replaced; restore it from a backup."
            ) from None
        self._chain_key = fk.chain_key
        self.epoch = fk.epoch
        self._keychain = keychain
        self._epoch_keys = {}
        self._epoch_columns = {}
        self._seen = set()
        self._made_here = set()
        self._base_epoch = fk.epoch
        self._chunks = {}
        self._chunks_pinned = False
        self.state_version = 0
        self._erasure_record = None
        self._erased_ids = frozenset()
        self._drops = {"s": {}, "p": {}}
        self._bound, self._root, self._root_seen, self._newest = False, b"", (b"", False, None), (-1, b"")
        self._binds, self._cuts = {}, {}
        try:
            if create:
                # Only the tables every store uses; the others are made by
                # their first write (schema.sql, "Pages").
                self.conn.executescript(sections()["memory"])
                self.head = Head(0, chain.genesis(self._chain_key, user_id))
                self.conn.execute(
                    "INSERT INTO meta(name, value) VALUES ('user_id', ?), ('format', ?), (?, ?), (?, ?)",
                    (
                        user_id,
                        formats.current_mark(formats.MEMORY_FILE),
                        HEAD_META,
                        self._head_text(self.head, b""),
                        EPOCH_META,
                        str(fk.epoch),
                    ),
                )
                with write_transaction(self.conn):
                    self._write_state()
                self._load_state()
                self.state_version = self.committed()[1]
            else:
                row = self.conn.execute("SELECT value FROM meta WHERE name = 'user_id'").fetchone()
                if not row or row[0] != user_id:
                    raise Damaged("This memory file does not belong to this user; restore it from a backup.")
                self._refuse_stateless(recorded)
                self._match_epoch(keychain)
                self.head = self._verified_head()
                self._check_state(recorded)
        except (Damaged, ResealDue):
            self.conn.close()
            raise
        except Exception as exc:
            self.conn.close()
            _raise_if_unavailable(exc, path.parent)
            raise Damaged(
                "The memory file cannot be opened: it is damaged or was replaced; restore it from a backup."
            ) from None

    def idempotency_records(self) -> Records:
        return Records(self.conn)

    def close(self) -> None:
        self._chunks.clear()
        self._epoch_keys.clear()
        self._keychain = None
        self._rows_key = b""
        self._chain_key = b""
        if self._fk is None:
            return  # type: ignore[unreachable]  # closed already: the connection may be another request's by then
        file_key = self._fk.file_key
        self._fk = None  # type: ignore[assignment]  # closed: no keys are held
        release(self.conn, self._path, file_key, self._pool)

    def config(self) -> dict[str, int]:
        out = {}
        ep = self._epoch_sql("config")
        for name, sealed, epoch in self._rows(self._tables(), "config", f"SELECT name, sealed, {ep} FROM config"):
            out[name] = int(self._open(self._key_of(epoch), sealed, "config", name).decode())
        return out

    def set_config(self, changes: dict[str, int | None]) -> None:
        with write_transaction(self.conn):
            self._ensure_table("config")
            for name, value in changes.items():
                if value is None:
                    self.conn.execute("DELETE FROM config WHERE name = ?", (name,))
                else:
                    sealed = aead.seal(self._rows_key, str(value).encode(), self._aad("config", name))
                    cols, marks, epoch = self._epoch_of_write("config")
                    also = ", epoch = excluded.epoch" if epoch else ""
                    self.conn.execute(
                        f"INSERT INTO config(name, sealed{cols}) VALUES (?, ?{marks}) "
                        f"ON CONFLICT(name) DO UPDATE SET sealed = excluded.sealed{also}",
                        (name, sealed, *epoch),
                    )
            self._write_state()
