"""The key ring's copies of the memory file's log head and state version,
kept outside the memory file so that rolling that file back alone is caught
(sealed under the epoch's key: :mod:`ring_copies`)."""

from __future__ import annotations

from ..core.errors import Conflict, Damaged
from ..crypto.chain import Head
from ..crypto.epochs import KeyChain
from . import ring_copies
from .files import DB_ERRORS, write_transaction
from .keyring_base import ERASED_COPY, HEAD_COPY, STATE_COPY, RingFile


class HeadCopies(RingFile):
    """The copies of the head and state version, read and moved forward."""

    def log_head(self) -> Head | None:
        """The copy of the memory log's head kept here, outside the memory
        file, so that rolling back that file alone is caught."""
        text = self.meta(HEAD_COPY)
        if text is None:
            return None
        head = Head.parse(text)
        if head is None:
            raise ValueError("the key ring's copy of the log head is unreadable")
        return head

    def state_version(self) -> int | None:
        """The copy of the memory file's state version kept here (see
        MemoryFile._state_digest), or None before the file had one."""
        text = self.meta(STATE_COPY)
        try:
            return None if text is None else int(text)
        except ValueError:
            raise ValueError("the key ring's copy of the state version is unreadable") from None

    def erased_count(self) -> int:
        """How many memories of the log are erased, as the last write recorded
        it (0 before any did): counted out of the identity's quota."""
        try:
            return max(0, int(self.meta(ERASED_COPY) or 0))
        except ValueError:
            return 0

    def advance_head(self, head: Head, state_version: int | None = None, *, chain: KeyChain | None = None,
                     erased: int | None = None) -> bool:
        """Record ``head`` as the copy unless the copy is already as far: it
        only moves forward, so concurrent writers finishing out of order leave
        the furthest one. Best effort (False when it could not be written, as
        on a full disk): a copy that lags is accepted by the next open when
        the log extends it, and the next write brings it up to date. For the
        same reason its commit is not fsynced (a power cut may lose it, which
        is a lag): that keeps the cost of a note at one fsync, not two.
        With ``chain`` the copies are sealed too (:mod:`ring_copies`);
        without it, a key ring whose copies are sealed is left as it is (a
        lag), never given a copy its MAC does not cover. ``erased``: how
        many memories of the file are erased now, kept beside the copies
        (:meth:`erased_count`)."""
        try:
            self.conn.execute("PRAGMA synchronous = NORMAL")
            try:
                with write_transaction(self.conn):
                    if erased is not None and erased != self.erased_count():
                        self.conn.execute("INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
                                          "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                                          (ERASED_COPY, str(erased)))
                    if chain is not None:
                        return self._advance_sealed_copies(head, state_version, chain)
                    if self.meta(ring_copies.COPIES_MAC) is not None:
                        return False
                    current = self.log_head()
                    if current is None or current.count < head.count:
                        self.conn.execute(
                            "INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
                            "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                            (HEAD_COPY, head.pin()),
                        )
                    copy = self.state_version()
                    if state_version is not None and (copy is None or copy < state_version):
                        self.conn.execute(
                            "INSERT INTO keyring_meta(name, value) VALUES (?, ?) "
                            "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                            (STATE_COPY, str(state_version)),
                        )
            finally:
                self.conn.execute("PRAGMA synchronous = FULL")
        except (*DB_ERRORS, ValueError, OSError):  # type: ignore[misc]  # a tuple of exception classes
            return False
        return True

    def _advance_sealed_copies(self, head: Head, state_version: int | None, chain: KeyChain) -> bool:
        """:meth:`advance_head`'s work with the copies sealed, inside its
        transaction: each copy only moves forward, and the MAC is written
        even when neither moves (a key ring whose copies were never sealed)."""
        try:
            copies = ring_copies.read(self.conn, self.user_id, chain)
        except (Damaged, Conflict):
            return False  # altered meanwhile, or a newer epoch's: the next open says which
        changes = {}
        if copies.head is None or copies.head.count < head.count:
            changes[HEAD_COPY] = head.pin()
        if state_version is not None and (copies.state is None or copies.state < state_version):
            changes[STATE_COPY] = str(state_version)
        if changes or not copies.authenticated:
            ring_copies.put(self.conn, self.user_id, chain, changes)
        return True

    def copies(self, chain: KeyChain) -> ring_copies.Copies:
        """The copies kept here, checked against their MAC (:mod:`ring_copies`)."""
        return ring_copies.read(self.conn, self.user_id, chain)
