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

Reading (:meth:`RowDigests.open_bound`, the one opener of the three
tables): the row against its slot, the leaf against its middle, the middle
against the root. Nodes read are kept on the connection with their digests
(row_tree.Nodes), leaves checked for as long as the root stays. A mismatch
is looked at again in one snapshot, the state authenticated afresh (another
worker may have written since): the row served is that snapshot's, or none.
The key chunk that holds the newest memory's key changes with every note,
so it is not in the tree: its digest is the meta row ``open_chunk``, which
the state digest covers beside the root (a note rewrites no node until its
chunk is full). How writes move the tree: :meth:`RowDigests.apply_binds`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from ...core.errors import Damaged
from .. import formats
from ..sqlite.transactions import read_snapshot
from .base import KEYS_PER_CHUNK, FileBase
from .erasure_record import RECORD_MARK
from .row_tree import (
    DIGEST,
    EMPTY,
    FANOUT,
    KEYS,
    KIND_SPAN,
    LEVEL_SPAN,
    POSITION,
    ROOT,
    ROW_HASH,
    TABLES,
    Nodes,
    Slot,
    entry,
    key_slot,
    node_digest,
    nodes_of,
    parent_of,
    parse_open,
    parse_root,
    read_at,
    root_blob,
    rows_of,
    tree_of,
    trimmed,
    write_at,
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


class RowDigests:
    """The tree of row digests of ``file``: every bound row read against it
    (opened by ``codec``), and moved by each write that names the slots it
    changed. ``refresh`` authenticates the state afresh (state.py) when a
    node read is not the one its parent names."""

    def __init__(self, file: FileBase, codec: RowCodec, refresh: Callable[[], None]) -> None:
        self.file = file
        self.codec = codec
        self.refresh = refresh

    def open_bound(self, slot: Slot, sealed: bytes, epoch: int | None, position: str | int) -> bytes:
        """Open a key chunk, summary or erased row read as ``(sealed, epoch)``
        at ``slot`` — only as the authenticated state holds it."""
        sealed, epoch = self.authentic(slot, sealed, epoch)
        return self.codec.open(self.codec.key_of(epoch), sealed, TABLES.get(slot.kind, "summaries"), position)

    def authentic(self, slot: Slot, sealed: bytes, epoch: int | None) -> tuple[bytes, int | None]:
        """``(sealed, epoch)`` when the tree holds it at ``slot``; else the
        row as the file holds it now, when the tree authenticated afresh in
        the same snapshot holds that; else Damaged. The first lines are the
        path of nearly every read: a leaf already checked (row_tree.Nodes)."""
        if not self.file.is_bound:
            return sealed, epoch
        kind, pos = slot
        h = ROW_HASH.copy()  # entry(slot, sealed), inline: this runs for every row read
        h.update(POSITION.pack(kind, pos) + sealed)
        want = h.digest()
        leaf = self._checked_now().leaves.get(kind * KIND_SPAN + pos // FANOUT)
        j = (pos % FANOUT) * DIGEST
        if leaf is not None and leaf[j : j + DIGEST] == want:
            return sealed, epoch
        if self.file.conn.in_transaction and self.file.binds.get(slot) == want:
            return sealed, epoch  # this transaction wrote it; the tree moves at its end
        with contextlib.suppress(_Stale):
            if self._slot(slot) == want:
                return sealed, epoch
        with read_snapshot(self.file.conn):
            self.refresh()  # the root as this snapshot's authenticated state holds it
            row = self.row_at(slot, self.codec.epoch_sql(slot.table))
            with contextlib.suppress(_Stale):
                if row is not None and self._slot(slot) == entry(slot, row[0]):
                    return row
        raise Damaged(UNBOUND.format(what=slot.name))

    def row_at(self, slot: Slot, epoch_sql: str) -> tuple[bytes, int | None] | None:
        """``(sealed, epoch)`` of the row at ``slot`` as the file holds it now."""
        if not self.file.made(slot.table):
            return None
        where, args = slot.where()
        row = self.file.conn.execute(f"SELECT sealed, {epoch_sql} FROM {slot.table} WHERE {where}", args).fetchone()
        return None if row is None else (bytes(row[0]), row[1])

    def _slot(self, slot: Slot) -> bytes:
        """What the authenticated tree holds at ``slot`` (EMPTY: nothing);
        :class:`_Stale` when a node read does not match its parent."""
        if slot.kind == KEYS and slot.pos == self.file.newest[0]:
            return self.file.newest[1]
        checked = self._checked_now()
        leaf = checked.leaves.get(slot.leaf)
        if leaf is None:
            if checked.middles is None:
                checked.middles = parse_root(self.file.root)
            middle = checked.middles.get(slot.middle)
            digest = (
                EMPTY if middle is None else read_at(self._node(slot.middle, middle), (slot.pos // FANOUT) % FANOUT)
            )
            leaf = b"" if digest == EMPTY else self._node(slot.leaf, digest)
            checked.leaves[slot.leaf] = leaf
        return read_at(leaf, slot.pos % FANOUT)

    def _checked_now(self) -> Nodes:
        """The connection's checked leaves, as checked against this handle's root."""
        checked = self.file.checked
        if checked.root is not self.file.root:  # another handle of the connection moved it since
            checked.against(self.file.root)
            checked.root = self.file.root
        return checked

    def _node(self, node: int, digest: bytes) -> bytes:
        """Node ``node`` as read, when its digest is ``digest`` (its parent's word)."""
        nodes = nodes_of(self.file.conn)
        kept = nodes.get(node)
        if kept is not None and kept[1] == digest:
            return kept[0]
        blob = self.stored_node(node)
        if node_digest(node, blob) != digest:
            raise _Stale()
        nodes.keep(node, blob, digest)
        return blob

    def stored_node(self, node: int) -> bytes:
        """Node ``node`` as the file holds it now (b"": none; the root before any row is bound)."""
        if not self.file.made(TABLE):
            return b""
        row = self.file.conn.execute(f"SELECT digests FROM {TABLE} WHERE node = ?", (node,)).fetchone()
        return b"" if row is None else bytes(row[0])

    def trust_root(self, root: bytes, bound: bool, open_chunk: str | None) -> None:
        """Take ``root`` and ``open_chunk`` (:data:`OPEN_META`) as this
        handle's authenticated ones: the state MAC covering them was just
        checked, or this handle just wrote them."""
        self.file.checked = checked = nodes_of(self.file.conn)
        checked.against(root)
        self.file.root, self.file.is_bound, self.file.newest = checked.root, bound, parse_open(open_chunk)

    def chunk_digests(self, first: int, stop: int) -> dict[int, bytes] | None:
        """What the authenticated tree holds for key chunks ``[first, stop)``
        (one it does not hold is left out), None for a file whose rows are
        not bound: what a recall cache piece is bound to (recallcache/rendered_log.py)."""
        if not self.file.is_bound:
            return None
        out = {c: self._held(key_slot(c)) for c in range(first, stop)}
        return {c: d for c, d in out.items() if d != EMPTY}

    def _held(self, slot: Slot) -> bytes:
        """:meth:`_slot`, read again in one snapshot with the state
        authenticated afresh when a node is not the one its parent names."""
        with contextlib.suppress(_Stale):
            return self._slot(slot)
        with read_snapshot(self.file.conn):
            self.refresh()
            try:
                return self._slot(slot)
            except _Stale:
                raise Damaged(UNBOUND.format(what="tree of row digests")) from None

    # How writes move the tree: each write names the slots it changed
    # (:meth:`bind`, :meth:`bind_from`), and State.write, which every write
    # calls last inside its transaction, moves the tree before it digests the
    # state (:meth:`apply_binds`): each leaf, middle and the root a write
    # changes rewritten once, a slot whose row is not what was named (a write
    # rolled back after naming it) left as it was. The key chunk of the newest
    # memory stays out of the tree, in the meta row ``open_chunk``, until a
    # later chunk takes its place. A whole tree is made once, for a file of an
    # earlier format or a bulk load, and checked whole by ``stash verify``.

    def bind(self, slot: Slot, sealed: bytes | None) -> None:
        """Name ``slot`` as now holding ``sealed`` (None: no row), inside
        the write transaction that wrote it; the tree moves at its end."""
        self.file.binds[slot] = None if sealed is None else entry(slot, sealed)

    def bind_from(self, kind: int, start: int) -> None:
        """Name every slot of ``kind`` from ``start`` on as holding no row."""
        self.file.cuts[kind] = min(start, self.file.cuts.get(kind, start))
        for slot in [s for s in self.file.binds if s.kind == kind and s.pos >= start]:
            del self.file.binds[slot]

    def apply_binds(self) -> None:
        """Move the tree to what the named slots hold (inside the write
        transaction, before the state is digested): each leaf, middle and
        the root they change rewritten once."""
        binds, cuts = self.file.binds, self.file.cuts
        self.file.binds, self.file.cuts = {}, {}
        if not binds and not cuts:
            return
        if self.file.format_mark() != BOUND_MARK:
            return  # an older format: upgraded whole (build_row_digests)
        self._move_open_chunk(binds)
        if not binds and not cuts:
            return
        self._ensure_digests()
        leaves: dict[int, bytearray] = {}
        for kind, start in list(cuts.items()):
            if self._any_from(kind, start):
                del cuts[kind]  # a row is there again: the write that cut it was rolled back
                continue
            leaves[Slot(kind, start).leaf] = self._cut(0, kind, start // FANOUT, start % FANOUT)
        for slot, want in binds.items():
            row = self.row_at(slot, "NULL")
            if (None if row is None else entry(slot, row[0])) != want:
                continue  # named by a write that was rolled back: the row is not what it said
            if slot.leaf not in leaves:
                leaves[slot.leaf] = bytearray(self.stored_node(slot.leaf))
            write_at(leaves[slot.leaf], slot.pos % FANOUT, want)
        if not leaves and not cuts:
            return
        middles: dict[int, bytearray] = {}
        for kind, start in cuts.items():
            middles[Slot(kind, start).middle] = self._cut(
                LEVEL_SPAN, kind, start // FANOUT // FANOUT, (start // FANOUT) % FANOUT + 1
            )
        for leaf, blob in leaves.items():
            middle, j = parent_of(leaf)
            if middle not in middles:
                middles[middle] = bytearray(self.stored_node(middle))
            write_at(middles[middle], j, self._write_node(leaf, blob))
        root = parse_root(self.stored_node(ROOT))
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

    def _move_open_chunk(self, binds: dict[Slot, bytes | None]) -> None:
        """The open key chunk's meta row, moved to the chunk of the newest
        memory now, which ``binds`` may hold (taken out of them: the tree
        never holds it); the chunk that was open before joins the tree as the
        state held it, unless this write named it again."""
        T = self.file.count()
        now = (T - 1) // KEYS_PER_CHUNK if T else -1
        row = self.file.conn.execute("SELECT value FROM meta WHERE name = ?", (OPEN_META,)).fetchone()
        was, digest = parse_open(None if row is None else str(row[0]))
        if was >= 0 and was != now:
            binds.setdefault(key_slot(was), digest)
        want = binds.pop(key_slot(now), None) if now >= 0 else None
        if want is None and was != now:
            self.file.conn.execute("DELETE FROM meta WHERE name = ?", (OPEN_META,))  # not named: read as damage
        if want is None or want == digest:
            return
        row_now = self.row_at(key_slot(now), "NULL")
        if row_now is not None and entry(key_slot(now), row_now[0]) == want:  # not a write rolled back since
            self.file.put_meta(OPEN_META, f"{now} {want.hex()}")

    def _cut(self, level: int, kind: int, index: int, keep: int) -> bytearray:
        """Delete the nodes of ``kind`` at ``level`` after node ``index``;
        that one, cut to its first ``keep`` slots."""
        node = level + kind * KIND_SPAN + index
        self.file.conn.execute(
            f"DELETE FROM {TABLE} WHERE node > ? AND node < ?", (node, level + (kind + 1) * KIND_SPAN)
        )
        return bytearray(self.stored_node(node)[: keep * DIGEST])

    def _any_from(self, kind: int, start: int) -> bool:
        cut = Slot(kind, start)
        if not self.file.made(cut.table):
            return False
        where, args = cut.where(">=")
        return self.file.conn.execute(f"SELECT 1 FROM {cut.table} WHERE {where} LIMIT 1", args).fetchone() is not None

    def _ensure_digests(self) -> None:
        if not self.file.made(TABLE):
            self.file.made_here.add(TABLE)
            formats.make_on_use(self.file.conn, SECTION, TABLE)

    def _write_node(self, node: int, blob: bytearray, keep_empty: bool = False) -> bytes | None:
        """Store node ``node`` as ``blob`` without its trailing empty slots
        (deleted when none is left, but the root); its digest, None when deleted."""
        data = trimmed(blob)
        if not data and not keep_empty:
            self.file.conn.execute(f"DELETE FROM {TABLE} WHERE node = ?", (node,))
            return None
        self.file.conn.execute(
            f"INSERT INTO {TABLE}(node, digests) VALUES (?, ?) "
            "ON CONFLICT(node) DO UPDATE SET digests = excluded.digests",
            (node, data),
        )
        digest = node_digest(node, data)
        nodes_of(self.file.conn).keep(node, data, digest)
        return digest

    def build(self) -> None:
        """Make the whole tree from the rows the file holds (inside the
        caller's write transaction): the upgrade of a file of an earlier
        format, which trusts its rows as the rest of that upgrade does, and
        bench/build.py's bulk load. O(rows), once."""
        self.file.binds, self.file.cuts = {}, {}
        self._ensure_digests()
        self.file.conn.execute(f"DELETE FROM {TABLE}")
        self.file.conn.execute("DELETE FROM meta WHERE name = ?", (OPEN_META,))
        nodes = tree_of(self._tree_rows())
        self.file.conn.executemany(f"INSERT INTO {TABLE}(node, digests) VALUES (?, ?)", sorted(nodes.items()))
        for slot, sealed in self._newest_row():
            self.file.put_meta(OPEN_META, f"{slot.pos} {entry(slot, sealed).hex()}")

    def _newest_row(self) -> list[tuple[Slot, bytes]]:
        """The open key chunk (the newest memory's) as the file holds it, if any."""
        T = self.file.count()
        row = self.row_at(key_slot((T - 1) // KEYS_PER_CHUNK), "NULL") if T else None
        return [] if row is None else [(key_slot((T - 1) // KEYS_PER_CHUNK), row[0])]

    def _tree_rows(self) -> Iterator[tuple[Slot, bytes]]:
        """Every bound row the tree holds: all but the open key chunk."""
        skip = {slot for slot, _ in self._newest_row()}
        return (r for r in rows_of(self.file.conn, self.file.tables()) if r[0] not in skip)

    def check(self) -> None:
        """``stash verify --token``: the tree recomputed from every row must
        be the tree stored, node for node (a row without its slot, a slot
        without its row, a node left over: damage)."""
        if self.file.format_mark() != BOUND_MARK:
            return
        with read_snapshot(self.file.conn):
            want = tree_of(self._tree_rows())
            have = dict(self.file.conn.execute(f"SELECT node, digests FROM {TABLE}")) if self.file.made(TABLE) else {}
            stored = self.stored_node(ROOT)
            opened = [(slot.pos, entry(slot, sealed)) for slot, sealed in self._newest_row()]
        have = {node: bytes(blob) for node, blob in have.items()}
        if (
            (want != have and (have or want != {ROOT: b""}))
            or stored != self.file.root
            or opened != ([self.file.newest] if self.file.newest[0] >= 0 else [])
        ):
            raise Damaged(UNBOUND.format(what="tree of row digests"))
