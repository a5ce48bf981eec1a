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
against the root. A node checked once is kept with its digest for the
handle's life. A mismatch is looked at again in one snapshot, the state
authenticated afresh (another worker may have written since this handle
opened): the row then served is that snapshot's, or none (Damaged).
Writing: each write names the slots it changed (:meth:`BoundPart._bind`);
:meth:`StatePart._write_state`, which every write calls last in its
transaction, moves the tree first, skipping a slot whose row is not what
was named (a write rolled back after naming it).
"""

from __future__ import annotations

from ...core.errors import Damaged
from .. import formats
from ..files import read_snapshot, write_transaction
from .erasure_record import RECORD_MARK
from .row_tree import (
    DIGEST,
    EMPTY,
    FANOUT,
    KIND_SPAN,
    LEVEL_SPAN,
    Slot,
    entry,
    key_slot,
    node_digest,
    parent_of,
    parse_root,
    read_at,
    root_blob,
    rows_of,
    tree_of,
    trimmed,
    write_at,
)
from .row_tree import (
    ROOT as ROOT,
)
from .rows import RowCodec

BOUND_MARK = "5"  # the format mark of files whose rows are bound (formats.py, "rows bound")
RECORD_MARKS = (RECORD_MARK, BOUND_MARK)  # the marks that keep the erasure record (mark 5 keeps mark 4's)
TABLE = "row_digests"
SECTION = "memory_digests"  # schema.sql
UNBOUND = ("A stored {what} is not the one this memory file's authenticated state holds (a page or row from another "
           "copy of this memory was put in its place); nothing was served. The operator should run `stash verify` "
           "and restore this store from a backup.")


class _Stale(Exception):
    """A node read does not have the digest its parent names."""


class BoundPart(RowCodec):
    def _open_bound(self, slot: Slot, sealed: bytes, epoch: int | None, position: str | int) -> bytes:
        """Open a key chunk, summary or erased row read as ``(sealed, epoch)``
        at ``slot`` — only as the authenticated state holds it."""
        sealed, epoch = self._authentic(slot, sealed, epoch)
        return self._open(self._key_of(epoch), sealed, slot.table, position)

    def _authentic(self, slot: Slot, sealed: bytes, epoch: int | None) -> tuple[bytes, int | None]:
        """``(sealed, epoch)`` when the tree holds it at ``slot``; else the
        row as the file holds it now, when the tree authenticated afresh in
        the same snapshot holds that; else Damaged."""
        if not self._bound:
            return sealed, epoch
        want = entry(slot, sealed)
        if self.conn.in_transaction and self._binds.get(slot) == want:
            return sealed, epoch  # this transaction wrote it; the tree moves at its end
        try:
            if self._slot(slot) == want:
                return sealed, epoch
        except _Stale:
            pass
        with read_snapshot(self.conn):
            self._refresh_state()  # the root as this snapshot's authenticated state holds it
            row = self._row_at(slot, self._epoch_sql(slot.table))
            try:
                if row is not None and self._slot(slot) == entry(slot, row[0]):
                    return row[0], row[1]
            except _Stale:
                pass
        raise Damaged(UNBOUND.format(what=slot.name))

    def _row_at(self, slot: Slot, epoch_sql: str) -> tuple[bytes, int | None] | None:
        """``(sealed, epoch)`` of the row at ``slot`` as the file holds it now."""
        if not self._made(slot.table):
            return None
        where, args = slot.where()
        row = self.conn.execute(f"SELECT sealed, {epoch_sql} FROM {slot.table} WHERE {where}", args).fetchone()
        return None if row is None else (bytes(row[0]), row[1])

    def _slot(self, slot: Slot) -> bytes:
        """What the authenticated tree holds at ``slot`` (the empty digest:
        nothing); :class:`_Stale` when a node read does not match its parent."""
        middle = self._root_map().get(slot.middle)
        if middle is None:
            return EMPTY
        leaf = read_at(self._node(slot.middle, middle), (slot.pos // FANOUT) % FANOUT)
        if leaf == EMPTY:
            return EMPTY
        return read_at(self._node(slot.leaf, leaf), slot.pos % FANOUT)

    def _root_map(self) -> dict[int, bytes]:
        if self._root_parsed is None:
            self._root_parsed = parse_root(self._root)
        return self._root_parsed

    def _node(self, node: int, digest: bytes) -> bytes:
        kept = self._nodes.get(node)
        if kept is not None and kept[1] == digest:
            return kept[0]
        blob = self._stored_node(node)
        if node_digest(node, blob) != digest:
            raise _Stale()
        if len(self._nodes) >= 1024:  # an export of a million summaries reads 8,000 leaves
            self._nodes.clear()
        self._nodes[node] = (blob, digest)
        return blob

    def _stored_node(self, node: int) -> bytes:
        """Node ``node`` as the file holds it now (b"": none; the root before any row is bound)."""
        if not self._made(TABLE):
            return b""
        row = self.conn.execute(f"SELECT digests FROM {TABLE} WHERE node = ?", (node,)).fetchone()
        return b"" if row is None else bytes(row[0])

    def _trust_root(self, root: bytes, bound: bool) -> None:
        """Take ``root`` as this handle's authenticated root: the state MAC
        covering it was just checked, or this handle just wrote it."""
        if root != self._root:
            self._root, self._root_parsed = root, None  # parsed again when first needed
        self._bound = bound

    def chunk_digests(self, first: int, stop: int) -> dict[int, bytes] | None:
        """What the authenticated tree holds for key chunks ``[first, stop)``
        (one it does not hold is left out), None for a file whose rows are
        not bound: what a recall cache piece is bound to (scancache.py)."""
        if not self._bound:
            return None
        out = {c: self._held(key_slot(c)) for c in range(first, stop)}
        return {c: d for c, d in out.items() if d != EMPTY}

    def _held(self, slot: Slot) -> bytes:
        """:meth:`_slot`, read again in one snapshot with the state
        authenticated afresh when a node is not the one its parent names."""
        try:
            return self._slot(slot)
        except _Stale:
            pass
        with read_snapshot(self.conn):
            self._refresh_state()
            try:
                return self._slot(slot)
            except _Stale:
                raise Damaged(UNBOUND.format(what="tree of row digests")) from None

    def _bind(self, slot: Slot, sealed: bytes | None) -> None:
        """Name ``slot`` as now holding ``sealed`` (None: no row), inside
        the write transaction that wrote it; the tree moves at its end."""
        self._binds[slot] = None if sealed is None else entry(slot, sealed)

    def _bind_from(self, kind: int, start: int) -> None:
        """Name every slot of ``kind`` from ``start`` on as holding no row."""
        self._cuts[kind] = min(start, self._cuts.get(kind, start))
        for slot in [s for s in self._binds if s.kind == kind and s.pos >= start]:
            del self._binds[slot]

    def _apply_binds(self) -> None:
        """Move the tree to what the named slots hold (inside the write
        transaction, before the state is digested): each leaf, middle and
        the root they change rewritten once."""
        binds, cuts = self._binds, self._cuts
        self._binds, self._cuts = {}, {}
        if not binds and not cuts:
            return
        if self.format_mark() != BOUND_MARK:
            return  # an older format: upgraded whole (build_row_digests)
        self._ensure_digests()
        leaves: dict[int, bytearray] = {}
        for kind, start in list(cuts.items()):
            if self._any_from(kind, start):
                del cuts[kind]  # a row is there again: the write that cut it was rolled back
                continue
            leaves[Slot(kind, start).leaf] = self._cut(0, kind, start // FANOUT, start % FANOUT)
        for slot, want in binds.items():
            row = self._row_at(slot, "NULL")
            if (None if row is None else entry(slot, row[0])) != want:
                continue  # named by a write that was rolled back: the row is not what it said
            if slot.leaf not in leaves:
                leaves[slot.leaf] = bytearray(self._stored_node(slot.leaf))
            write_at(leaves[slot.leaf], slot.pos % FANOUT, want)
        if not leaves and not cuts:
            return
        middles: dict[int, bytearray] = {}
        for kind, start in cuts.items():
            middles[Slot(kind, start).middle] = self._cut(LEVEL_SPAN, kind, start // FANOUT // FANOUT,
                                                          (start // FANOUT) % FANOUT + 1)
        for leaf, blob in leaves.items():
            middle, j = parent_of(leaf)
            if middle not in middles:
                middles[middle] = bytearray(self._stored_node(middle))
            write_at(middles[middle], j, self._write_node(leaf, blob))
        root = parse_root(self._stored_node(ROOT))
        for kind, start in cuts.items():
            cut = Slot(kind, start)
            for m in [m for m in root if cut.middle < m < LEVEL_SPAN + (kind + 1) * KIND_SPAN]:
                del root[m]
        for middle, blob in middles.items():
            digest = self._write_node(middle, blob)
            if digest is None:
                root.pop(middle, None)
            else:
                root[middle] = digest
        self._write_node(ROOT, bytearray(root_blob(root)), keep_empty=True)

    def _cut(self, level: int, kind: int, index: int, keep: int) -> bytearray:
        """Delete the nodes of ``kind`` at ``level`` after node ``index``;
        that one, cut to its first ``keep`` slots."""
        node = level + kind * KIND_SPAN + index
        self.conn.execute(f"DELETE FROM {TABLE} WHERE node > ? AND node < ?", (node, level + (kind + 1) * KIND_SPAN))
        return bytearray(self._stored_node(node)[:keep * DIGEST])

    def _any_from(self, kind: int, start: int) -> bool:
        cut = Slot(kind, start)
        if not self._made(cut.table):
            return False
        where, args = cut.where(">=")
        return self.conn.execute(f"SELECT 1 FROM {cut.table} WHERE {where} LIMIT 1", args).fetchone() is not None

    def _ensure_digests(self) -> None:
        if not self._made(TABLE):
            self._made_here.add(TABLE)
            formats.make_on_use(self.conn, SECTION, TABLE)

    def _write_node(self, node: int, blob: bytearray, keep_empty: bool = False) -> bytes | None:
        """Store node ``node`` as ``blob`` without its trailing empty slots
        (deleted when none is left, but the root); its digest, None when deleted."""
        data = trimmed(blob)
        if not data and not keep_empty:
            self.conn.execute(f"DELETE FROM {TABLE} WHERE node = ?", (node,))
            self._nodes.pop(node, None)
            return None
        self.conn.execute(f"INSERT INTO {TABLE}(node, digests) VALUES (?, ?) "
                          "ON CONFLICT(node) DO UPDATE SET digests = excluded.digests", (node, data))
        digest = node_digest(node, data)
        self._nodes[node] = (data, digest)
        return digest

    def bulk_loaded(self) -> None:
        """Advance the state head over rows written straight into the file by
        bench/build.py (a million summaries in a few transactions), the tree
        made whole from them; the server's own writes advance both themselves."""
        with write_transaction(self.conn):
            if self.format_mark() == BOUND_MARK:
                self.build_row_digests()
            self._write_state()

    def build_row_digests(self) -> None:
        """Make the whole tree from the rows the file holds (inside the
        caller's write transaction): the upgrade of a file of an earlier
        format, which trusts its rows as the rest of that upgrade does, and
        bench/build.py's bulk load. O(rows), once."""
        self._binds, self._cuts = {}, {}
        self._ensure_digests()
        self.conn.execute(f"DELETE FROM {TABLE}")
        nodes = tree_of(rows_of(self.conn, self._tables()))
        self.conn.executemany(f"INSERT INTO {TABLE}(node, digests) VALUES (?, ?)", sorted(nodes.items()))
        self._nodes.clear()

    def check_row_digests(self) -> None:
        """``stash verify --token``: the tree recomputed from every row must
        be the tree stored, node for node (a row without its slot, a slot
        without its row, a node left over: damage)."""
        if self.format_mark() != BOUND_MARK:
            return
        with read_snapshot(self.conn):
            want = tree_of(rows_of(self.conn, self._tables()))
            have = dict(self.conn.execute(f"SELECT node, digests FROM {TABLE}")) if self._made(TABLE) else {}
            stored = self._stored_node(ROOT)
        have = {node: bytes(blob) for node, blob in have.items()}
        if not have and want == {ROOT: b""}:
            return
        if want != have or stored != self._root:
            raise Damaged(UNBOUND.format(what="tree of row digests"))
