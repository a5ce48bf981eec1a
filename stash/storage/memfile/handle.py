"""The memory file handle: opening a user's file with its keys, closing it,
and its sealed config; what it stores and reads is in the parts it holds.

A file is opened for one request with the master key (or key chain) and
closed at its end. Opening checks it belongs to its user, that its key epoch
matches the chain's, that its log ends on its recorded head and that its
state matches its authenticated head; any value that fails to open raises
:class:`Damaged` — it is never served.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ...core.blocks import Erased, Settled
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
from .base import EPOCH_META, HEAD_META, FileBase, FileKeys
from .bound import BOUND_MARK, RowDigests
from .budget import ImportBudget
from .erasure import Erasure
from .head import LogChain
from .log import Log
from .reseal import Epochs, ResealDue
from .rows import RowCodec
from .state import State
from .tree import SummaryTree


def _raise_if_unavailable(exc: Exception, folder: Path) -> None:
    """A file that cannot be opened for a reason outside its bytes (a full
    disk, a read-only folder) is reported as that, not as damage; the file's
    ``folder`` tells a full disk from an unreadable file, since SQLite
    reports a WAL index it had no room to create as an I/O error."""
    err = storage_error(exc, folder)
    if isinstance(err, Unavailable):
        raise err from None


class MemoryFile(FileBase):
    """A user's memory file: the sealed log, summary tree and config. It is
    the open file and the reads every part shares (the base, base.py), and
    holds its parts, each given that file and the parts it calls:
    ``codec`` (rows sealed and opened, rows.py), ``digests`` (the tree of
    row digests, bound.py), ``state`` (whole-state authentication,
    state.py), ``log`` (the log and its key chunks, log.py), ``chain`` (its
    running digest and pins, head.py), ``tree`` (the summaries, tree.py),
    ``erasure`` (erasure.py), ``epochs`` (key epochs and re-sealing,
    reseal.py) and ``budget`` (the import counter, budget.py). Its methods
    are the parts' public ones, passed on."""

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
        had one (:meth:`State.check`). ``pool``: where its connection may be
        kept between requests. ``reseal`` False: a file from an earlier epoch
        raises :class:`ResealDue` instead of being re-sealed here."""
        self.pool = pool
        self.may_reseal = reseal
        self.codec = RowCodec(self)
        self.digests = RowDigests(self, self.codec, self._refresh_state)
        self.state = State(self, self.digests)
        self.log = Log(self, self.codec, self.digests, self.state)
        self.chain = LogChain(self, self.log)
        self.tree = SummaryTree(self, self.codec, self.digests, self.state)
        self.erasure = Erasure(self, self.codec, self.log, self.tree, self.digests, self.state)
        self.epochs = Epochs(self, self.codec, self.digests, self.state, self.tree)
        self.budget = ImportBudget(self, self.codec)
        keychain = master if isinstance(master, KeyChain) else KeyChain(user_id, (master,))
        self._setup(FileKeys.derive(path, user_id, keychain, cipher, page_bytes), create, keychain, recorded)

    def _refresh_state(self) -> None:
        """What the tree of row digests calls when a node it read is not the
        one its parent names: the state authenticated afresh."""
        self.state.refresh()

    def file_keys(self) -> FileKeys:
        return self.fk

    def _setup(self, fk: FileKeys, create: bool, keychain: KeyChain | None = None, recorded: bool = False) -> None:
        self.fk = fk
        self.path = fk.path
        self.user_id = user_id = fk.user_id
        self.rows_key = fk.rows_key
        path, file_key, cipher = fk.path, fk.file_key, fk.cipher
        try:
            self.conn = connect(
                path, file_key=file_key, cipher=cipher, create=create, page_bytes=fk.page_bytes, pool=self.pool
            )
        except MissingFile:
            raise
        except Exception as exc:
            _raise_if_unavailable(exc, path.parent)
            raise Damaged(
                "The memory file cannot be opened: it is damaged or was replaced; restore it from a backup."
            ) from None
        self.chain_key = fk.chain_key
        self.epoch = fk.epoch
        self.keychain = keychain
        self.epoch_keys = {}
        self.epoch_columns = {}
        self.seen = set()
        self.made_here = set()
        self.base_epoch = fk.epoch
        self.chunks = {}
        self.chunks_pinned = False
        self.state_version = 0
        self.erasure_record = None
        self.erased_runs_made = None
        self.erased_ids = frozenset()
        self.drops = {"s": {}, "p": {}}
        self.is_bound, self.root, self.root_seen, self.newest = False, b"", (b"", False, None), (-1, b"")
        self.binds, self.cuts = {}, {}
        try:
            if create:
                # Only the tables every store uses; the others are made by
                # their first write (schema.sql, "Pages").
                self.conn.executescript(sections()["memory"])
                self.head = Head(0, chain.genesis(self.chain_key, user_id))
                self.conn.execute(
                    "INSERT INTO meta(name, value) VALUES ('user_id', ?), ('format', ?), (?, ?), (?, ?)",
                    (
                        user_id,
                        formats.current_mark(formats.MEMORY_FILE),
                        HEAD_META,
                        self.head_text(self.head, b""),
                        EPOCH_META,
                        str(fk.epoch),
                    ),
                )
                with write_transaction(self.conn):
                    self.state.write()
                self.state.load()
                self.state_version = self.state.committed()[1]
            else:
                row = self.conn.execute("SELECT value FROM meta WHERE name = 'user_id'").fetchone()
                if not row or row[0] != user_id:
                    raise Damaged("This memory file does not belong to this user; restore it from a backup.")
                self.state.refuse_stateless(recorded)
                self.epochs.match(keychain)
                self.head = self.chain.verified_head()
                self.state.check(recorded)
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
        self.chunks.clear()
        self.epoch_keys.clear()
        self.keychain = None
        self.rows_key = b""
        self.chain_key = b""
        if self.fk is None:
            return  # type: ignore[unreachable]  # closed already: the connection may be another request's by then
        file_key = self.fk.file_key
        self.fk = None  # type: ignore[assignment]  # closed: no keys are held
        release(self.conn, self.path, file_key, self.pool)

    def config(self) -> dict[str, int]:
        out = {}
        ep = self.codec.epoch_sql("config")
        for name, sealed, epoch in self.rows(self.tables(), "config", f"SELECT name, sealed, {ep} FROM config"):
            out[name] = int(self.codec.open(self.codec.key_of(epoch), sealed, "config", name).decode())
        return out

    def set_config(self, changes: dict[str, int | None]) -> None:
        with write_transaction(self.conn):
            self.ensure_table("config")
            for name, value in changes.items():
                if value is None:
                    self.conn.execute("DELETE FROM config WHERE name = ?", (name,))
                else:
                    sealed = aead.seal(self.rows_key, str(value).encode(), self.codec.aad("config", name))
                    cols, marks, epoch = self.codec.epoch_of_write("config")
                    also = ", epoch = excluded.epoch" if epoch else ""
                    self.conn.execute(
                        f"INSERT INTO config(name, sealed{cols}) VALUES (?, ?{marks}) "
                        f"ON CONFLICT(name) DO UPDATE SET sealed = excluded.sealed{also}",
                        (name, sealed, *epoch),
                    )
            self.state.write()

    # The log and its key chunks (log.py)

    def append(self, items: list[tuple[str, str]], *, check: Callable[[int, str | None], None] | None = None) -> int:
        return self.log.append(items, check=check)

    def memories(self, lo: int, hi: int) -> list[tuple[int, str, str]]:
        return self.log.memories(lo, hi)

    def memories_at(self, ids: list[int]) -> list[tuple[int, str, str]]:
        return self.log.memories_at(ids)

    def memory(self, i: int) -> tuple[int, str, str]:
        return self.log.memory(i)

    def memory_writer(self, i: int) -> int | None:
        return self.log.memory_writer(i)

    def writers(self, lo: int, hi: int) -> Iterator[tuple[int, int | None]]:
        return self.log.writers(lo, hi)

    def newest_date(self, T: int | None = None) -> str | None:
        return self.log.newest_date(T)

    def scan(self, T: int, start: int = 0) -> Iterator[list[str]]:
        return self.log.scan(T, start)

    def chain_rows(self, rows: Iterable[tuple[int, bytes]]) -> Iterator[bytes]:
        return self.log.chain_rows(rows)

    def recompute_head(self) -> tuple[Head, bytes]:
        return self.log.recompute_head()

    def shorten_rows(self, start: int, limit: int) -> tuple[int, int]:
        return self.log.shorten_rows(start, limit)

    # The running digest, its copy and a client's pin (head.py)

    def migrate_head(self) -> Head:
        return self.chain.migrate_head()

    def current_head(self) -> Head:
        return self.chain.current_head()

    def extends(self, older: Head, newer: Head) -> bool:
        return self.chain.extends(older, newer)

    def check_copy(self, copy: Head | None) -> None:
        self.chain.check_copy(copy)

    def pinned_head(self, *, current: bool = False) -> Head:
        return self.chain.pinned_head(current=current)

    def check_pin(self, pin: Head) -> None:
        self.chain.check_pin(pin)

    # The summary tree (tree.py)

    def settled(self, T: int) -> Settled:
        return self.tree.settled(T)

    def erased_runs(self) -> Erased:
        return self.tree.erased_runs()

    def summaries_of(self, size: int, first: int, end: int) -> dict[int, str]:
        return self.tree.summaries_of(size, first, end)

    def summary(self, lo: int, hi: int) -> str | None:
        return self.tree.summary(lo, hi)

    def summary_writer(self, lo: int, hi: int) -> int | None:
        return self.tree.summary_writer(lo, hi)

    def put_summary(self, lo: int, hi: int, text: str) -> bool:
        return self.tree.put_summary(lo, hi, text)

    def put_summaries(self, items: list[tuple[int, int, str]]) -> bool:
        return self.tree.put_summaries(items)

    def drop_summaries_from(self, lo: int, hi: int) -> list[tuple[int, int]]:
        return self.tree.drop_summaries_from(lo, hi)

    def level(self, size: int) -> Iterator[str]:
        return self.tree.level(size)

    def level_sizes(self) -> list[int]:
        return self.tree.level_sizes()

    # Whole-state authentication (state.py)

    def check_ring_sealed(self, sealed: bool) -> None:
        self.state.check_ring_sealed(sealed)

    def authenticate_format(self) -> bool:
        return self.state.authenticate_format()

    def committed(self) -> tuple[Head, int]:
        return self.state.committed()

    def check_state_copy(self, copy: int | None) -> None:
        self.state.check_copy(copy)

    # Erasure (erasure.py)

    def flush(self) -> bool:
        return self.erasure.flush()

    def erase(self, ids: list[int], at: str) -> tuple[int, list[int], list[tuple[int, int]]]:
        return self.erasure.erase(ids, at)

    def check_erasure_record(self) -> None:
        self.erasure.check_record()

    def receipts(self) -> list[dict[str, Any]]:
        return self.erasure.receipts()

    def erased_keys_back(self) -> list[int]:
        return self.erasure.erased_keys_back()

    def erased_count(self) -> int:
        return self.erasure.erased_count()

    # Key epochs and re-sealing (reseal.py)

    def file_epoch(self) -> int:
        return self.epochs.file_epoch()

    def reseal(self, keychain: KeyChain) -> int:
        return self.epochs.reseal(keychain)

    def rebucket_summaries(self, limit: int) -> int:
        return self.epochs.rebucket_summaries(limit)

    # The tree of row digests (bound.py)

    def chunk_digests(self, first: int, stop: int) -> dict[int, bytes] | None:
        return self.digests.chunk_digests(first, stop)

    def build_row_digests(self) -> None:
        self.digests.build()

    def check_row_digests(self) -> None:
        self.digests.check()

    def bulk_loaded(self) -> None:
        """Advance the state head over rows written straight into the file by
        bench/build.py (a million summaries in a few transactions), the tree
        made whole from them; the server's own writes advance both themselves."""
        with write_transaction(self.conn):
            if self.format_mark() == BOUND_MARK:
                self.digests.build()
            self.state.write()

    # The import counter (budget.py)

    def imported_on(self, day: str, grant: int) -> int:
        return self.budget.imported_on(day, grant)

    def count_import(self, day: str, grant: int, n: int) -> None:
        self.budget.count_import(day, grant, n)
