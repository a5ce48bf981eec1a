"""Every key chunk, summary and erased row bound to the memory file's
authenticated state by a tree of their digests (docs/DESIGN.md,
"Whole-state authentication"; formats.py, "rows bound", format mark 5).

Two histories of one memory hold rows sealed under the same keys at the
same positions, so a row of one put into the other opened: a key chunk with
the log rows it opens, a summary. Now each such row has a slot
(row_tree.py) holding a digest of its sealed bytes, in a leaf of 124 slots,
in a middle of 124 leaves, under a root the state digest covers (state.py);
the log's rows open only under keys from a key chunk, config rows are in
the state digest whole, receipts in the erasure record.

Reading (:meth:`BoundPart._open_bound`, the one opener of the three
tables): the row against its slot, the leaf against its middle, the middle
against the root. Nodes read are kept on the connection with their digests
(row_tree.Nodes), leaves checked for as long as the root stays. A mismatch
is looked at again in one snapshot, the state authenticated afresh (another
worker may have written since): the row served is that snapshot's, or none.
The key chunk that holds the newest memory's key changes with every note,
so it is not in the tree: its digest is the meta row ``open_chunk``, which
the state digest covers beside the root (a note rewrites no node until its
chunk is full). How writes move the tree: binds.py.
"""

from __future__ import annotations

import contextlib

from ...core.errors import Damaged
from ..sqlite.transactions import read_snapshot
from .erasure_record import RECORD_MARK
from .row_tree import (
    DIGEST,
    EMPTY,
    FANOUT,
    KEYS,
    KIND_SPAN,
    POSITION,
    ROW_HASH,
    TABLES,
    Nodes,
    Slot,
    entry,
    key_slot,
    node_digest,
    nodes_of,
    parse_open,
    parse_root,
    read_at,
)
from .row_tree import (
    ROOT as ROOT,
)
from .rows import RowCodec

BOUND_MARK = "5"  # the format mark of files whose rows are bound (formats.py, "rows bound")
RECORD_MARKS = (RECORD_MARK, BOUND_MARK)  # the marks that keep the erasure record (mark 5 keeps mark 4's)
TABLE = "row_digests"
SECTION = "memory_digests"  # schema.sql
OPEN_META = "open_chunk"  # "<chunk> <digest hex>": the key chunk of the newest memory, which the tree does not hold
UNBOUND = (
    "A stored {what} is not the one this memory file's authenticated state holds (a page or row from another "
    "copy of this memory was put in its place); nothing was served. The operator should run `stash verify` "
    "and restore this store from a backup."
)


class _Stale(Exception):
    """A node read does not have the digest its parent names."""


class BoundPart(RowCodec):
    def _open_bound(self, slot: Slot, sealed: bytes, epoch: int | None, position: str | int) -> bytes:
        """Open a key chunk, summary or erased row read as ``(sealed, epoch)``
        at ``slot`` — only as the authenticated state holds it."""
        sealed, epoch = self._authentic(slot, sealed, epoch)
        return self._open(self._key_of(epoch), sealed, TABLES.get(slot.kind, "summaries"), position)

    def _authentic(self, slot: Slot, sealed: bytes, epoch: int | None) -> tuple[bytes, int | None]:
        """``(sealed, epoch)`` when the tree holds it at ``slot``; else the
        row as the file holds it now, when the tree authenticated afresh in
        the same snapshot holds that; else Damaged. The first lines are the
        path of nearly every read: a leaf already checked (row_tree.Nodes)."""
        if not self._bound:
            return sealed, epoch
        kind, pos = slot
        h = ROW_HASH.copy()  # entry(slot, sealed), inline: this runs for every row read
        h.update(POSITION.pack(kind, pos) + sealed)
        want = h.digest()
        leaf = self._checked_now().leaves.get(kind * KIND_SPAN + pos // FANOUT)
        j = (pos % FANOUT) * DIGEST
        if leaf is not None and leaf[j : j + DIGEST] == want:
            return sealed, epoch
        if self.conn.in_transaction and self._binds.get(slot) == want:
            return sealed, epoch  # this transaction wrote it; the tree moves at its end
        with contextlib.suppress(_Stale):
            if self._slot(slot) == want:
                return sealed, epoch
        with read_snapshot(self.conn):
            self._refresh_state()  # the root as this snapshot's authenticated state holds it
            row = self._row_at(slot, self._epoch_sql(slot.table))
            with contextlib.suppress(_Stale):
                if row is not None and self._slot(slot) == entry(slot, row[0]):
                    return row
        raise Damaged(UNBOUND.format(what=slot.name))

    def _row_at(self, slot: Slot, epoch_sql: str) -> tuple[bytes, int | None] | None:
        """``(sealed, epoch)`` of the row at ``slot`` as the file holds it now."""
        if not self._made(slot.table):
            return None
        where, args = slot.where()
        row = self.conn.execute(f"SELECT sealed, {epoch_sql} FROM {slot.table} WHERE {where}", args).fetchone()
        return None if row is None else (bytes(row[0]), row[1])

    def _slot(self, slot: Slot) -> bytes:
        """What the authenticated tree holds at ``slot`` (EMPTY: nothing);
        :class:`_Stale` when a node read does not match its parent."""
        if slot.kind == KEYS and slot.pos == self._newest[0]:
            return self._newest[1]
        checked = self._checked_now()
        leaf = checked.leaves.get(slot.leaf)
        if leaf is None:
            if checked.middles is None:
                checked.middles = parse_root(self._root)
            middle = checked.middles.get(slot.middle)
            digest = (
                EMPTY if middle is None else read_at(self._node(slot.middle, middle), (slot.pos // FANOUT) % FANOUT)
            )
            leaf = b"" if digest == EMPTY else self._node(slot.leaf, digest)
            checked.leaves[slot.leaf] = leaf
        return read_at(leaf, slot.pos % FANOUT)

    def _checked_now(self) -> Nodes:
        """The connection's checked leaves, as checked against this handle's root."""
        checked = self._checked
        if checked.root is not self._root:  # another handle of the connection moved it since
            checked.against(self._root)
            checked.root = self._root
        return checked

    def _node(self, node: int, digest: bytes) -> bytes:
        """Node ``node`` as read, when its digest is ``digest`` (its parent's word)."""
        nodes = nodes_of(self.conn)
        kept = nodes.get(node)
        if kept is not None and kept[1] == digest:
            return kept[0]
        blob = self._stored_node(node)
        if node_digest(node, blob) != digest:
            raise _Stale()
        nodes.keep(node, blob, digest)
        return blob

    def _stored_node(self, node: int) -> bytes:
        """Node ``node`` as the file holds it now (b"": none; the root before any row is bound)."""
        if not self._made(TABLE):
            return b""
        row = self.conn.execute(f"SELECT digests FROM {TABLE} WHERE node = ?", (node,)).fetchone()
        return b"" if row is None else bytes(row[0])

    def _trust_root(self, root: bytes, bound: bool, open_chunk: str | None) -> None:
        """Take ``root`` and ``open_chunk`` (:data:`OPEN_META`) as this
        handle's authenticated ones: the state MAC covering them was just
        checked, or this handle just wrote them."""
        self._checked = checked = nodes_of(self.conn)
        checked.against(root)
        self._root, self._bound, self._newest = checked.root, bound, parse_open(open_chunk)

    def chunk_digests(self, first: int, stop: int) -> dict[int, bytes] | None:
        """What the authenticated tree holds for key chunks ``[first, stop)``
        (one it does not hold is left out), None for a file whose rows are
        not bound: what a recall cache piece is bound to (recallcache/rendered_log.py)."""
        if not self._bound:
            return None
        out = {c: self._held(key_slot(c)) for c in range(first, stop)}
        return {c: d for c, d in out.items() if d != EMPTY}

    def _held(self, slot: Slot) -> bytes:
        """:meth:`_slot`, read again in one snapshot with the state
        authenticated afresh when a node is not the one its parent names."""
        with contextlib.suppress(_Stale):
            return self._slot(slot)
        with read_snapshot(self.conn):
            self._refresh_state()
            try:
                return self._slot(slot)
            except _Stale:
                raise Damaged(UNBOUND.format(what="tree of row digests")) from None
