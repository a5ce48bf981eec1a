"""The log's running digest: its recorded head, checked against the end of
the log on every open, its copy in the key ring, and a client's pin.

The head changes in the same transaction as the log, so its count is the
log's size in any snapshot; a file written before the digest existed gets it
once, by the upgrade step the format registry names for it
(:mod:`stash.storage.formats`).
"""

from __future__ import annotations

from contextlib import closing

from ...core.errors import Damaged, PinMismatch, RolledBack
from ...core.lines import plural
from ...crypto import chain
from ...crypto.chain import Head
from .. import formats
from ..sqlite.transactions import write_transaction
from .base import HEAD_META, ROLLED_BACK, FileBase
from .log import Log

DIGEST_GONE = (
    "This memory file's recorded digest was deleted (the file's format records one). Nothing was "
    "served; the operator should run `stash verify` and restore this store from a backup."
)


class LogChain:
    """The running digest of ``file``'s log: its recorded head checked
    against the end of ``log``, a copy kept elsewhere and a client's pin."""

    def __init__(self, file: FileBase, log: Log) -> None:
        self.file = file
        self.log = log

    def verified_head(self) -> Head:
        """The recorded head, after checking it against the end of the log:
        the log must hold exactly ``count`` rows and its last row must chain
        from the recorded previous digest to the recorded head. That is two
        indexed reads and one hash, so every open can afford it; the whole
        chain is recomputed by ``stash verify``. A format-1 file gets its
        chain computed here once."""
        self.file.conn.execute("BEGIN")  # one snapshot: a writer may append meanwhile
        try:
            stored = self.file.stored_head()
            T = self.file.count()
            last = self.file.conn.execute("SELECT sealed FROM log WHERE id = ?", (T - 1,)).fetchone() if T else None
        finally:
            self.file.conn.execute("COMMIT")
        if stored is None:
            fmt = self.file.conn.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()
            step = formats.upgrade_of(formats.MEMORY_FILE, None if fmt is None else fmt[0])
            if step is None or step != formats.upgrade_of(formats.MEMORY_FILE, None):
                raise Damaged(DIGEST_GONE)  # only a file from before the digest has it computed here
            head: Head = getattr(self, step)()
            return head
        head, prev = stored
        if head.count > T:
            raise RolledBack(ROLLED_BACK)
        if head.count < T:
            raise Damaged("The log holds memories past its recorded digest; restore this store from a backup.")
        assert last is not None or not T  # read in the same snapshot as T
        if T and last:
            (sealed,) = self.log.chain_rows([(T - 1, last[0])])
            expected = chain.step(self.file.chain_key, prev, T - 1, sealed)
        else:
            expected = chain.genesis(self.file.chain_key, self.file.user_id)
        if not chain.same(expected, head.digest):
            raise Damaged(
                "The last memory of the log disagrees with its recorded digest; restore this store from a backup."
            )
        return head

    def migrate_head(self) -> Head:
        """Record the running digest of a file written before it existed. If
        the file cannot be written (a read-only folder) the head is still
        computed for this request, and recorded by a later one."""
        try:
            with write_transaction(self.file.conn):
                if self.file.stored_head() is None:
                    head, prev = self.log.recompute_head()
                    self.file.conn.execute(
                        "INSERT INTO meta(name, value) VALUES (?, ?)", (HEAD_META, self.file.head_text(head, prev))
                    )
                    self.file.conn.execute(
                        "UPDATE meta SET value = ? WHERE name = 'format'",
                        (formats.next_mark(formats.MEMORY_FILE, "1"),),
                    )
        except Exception as exc:
            if isinstance(exc, Damaged):
                raise
            return self.log.recompute_head()[0]
        return self.verified_head()

    def current_head(self) -> Head:
        """The head as recorded now (it changes in the same transaction as the
        log, so its count is the log's size in this snapshot)."""
        stored = self.file.stored_head()
        return self.file.head if stored is None else stored[0]

    def extends(self, older: Head, newer: Head) -> bool:
        """True if ``newer`` is ``older`` plus rows of this log: run the chain
        from ``older`` over rows ``older.count .. newer.count - 1``."""
        if older.count > newer.count:
            return False
        if older.count == newer.count:
            return chain.same(older.digest, newer.digest)
        if not self.file.made("log"):
            return False
        with closing(
            self.file.conn.execute(
                "SELECT id, sealed FROM log WHERE id >= ? AND id < ? ORDER BY id", (older.count, newer.count)
            )
        ) as rows:
            count, digest = chain.extend(self.file.chain_key, older.digest, older.count, self.log.chain_rows(rows))
        return count == newer.count and chain.same(digest, newer.digest)

    def check_copy(self, copy: Head | None) -> None:
        """Refuse this file if the head copy kept outside it (in the key ring)
        is ahead of it or on another history. The copy is written after the
        file commits, so it may lag (a crash in between): a lagging copy is
        accepted when this log extends it."""
        if copy is None or (copy.count == self.file.head.count and chain.same(copy.digest, self.file.head.digest)):
            return
        if copy.count >= self.file.head.count or not self.extends(copy, self.file.head):
            raise RolledBack(ROLLED_BACK)

    def pinned_head(self, *, current: bool = False) -> Head:
        """The head a client pins: the log's, with the file's state version
        (``current``: both as recorded now, which another writer may have
        moved since this file was opened)."""
        if not current:
            state = self.file.stored_state()  # inside a write: the version it commits, or nothing is answered
            return Head(
                self.file.head.count, self.file.head.digest, self.file.state_version if state is None else state[0]
            )
        head, state = self.current_head(), self.file.stored_state()
        return Head(head.count, head.digest, self.file.state_version if state is None else state[0])

    def check_pin(self, pin: Head) -> None:
        """Refuse unless this log is the one a client pinned, or grew from it,
        and the whole state is at least as far as the pinned version (versions
        only grow, so an older one is a rollback of every file together)."""
        if pin.state is not None and pin.state > self.file.state_version:
            raise PinMismatch(
                f"This memory was rolled back: its state is older than the one you pinned (version "
                f"{self.file.state_version}, you saw {pin.state}), so every file of it was put back from an older copy "
                "and a later memory, summary, setting or erasure may be undone. Nothing was served or written; "
                "tell the operator to run `stash verify` and restore from a backup, or drop the pin to read what "
                "is there now.",
            )
        if not self.extends(pin, self.file.head):
            raise PinMismatch(
                f"This memory's log does not continue the head you pinned ({plural(pin.count, 'memory')}): "
                "it was rolled "
                "back or replaced. Nothing was served or written; tell the operator to run `stash verify` and "
                "restore from a backup, or drop the pin to read what is there now.",
            )
