"""How writes move the tree of row digests (bound.py): each write names the
slots it changed (:meth:`BindPart._bind`, :meth:`BindPart._bind_from`), and
:meth:`StatePart._write_state`, which every write calls last inside its
transaction, moves the tree before it digests the state
(:meth:`BindPart._apply_binds`): each leaf, middle and the root a write
changes rewritten once, a slot whose row is not what was named (a write
rolled back after naming it) left as it was. The key chunk of the newest
memory stays out of the tree, in the meta row ``open_chunk``, until a later
chunk takes its place (bound.py). A whole tree is made once, for a file of
an earlier format or a bulk load, and checked whole by ``stash verify``.
"""

from __future__ import annotations

from collections.abc import Iterator

from ...core.errors import Damaged
from .. import formats
from ..sqlite.transactions import read_snapshot, write_transaction
from .bound import BOUND_MARK, OPEN_META, SECTION, TABLE, UNBOUND
from .log import KEYS_PER_CHUNK
from .row_tree import (
    DIGEST,
    FANOUT,
    KIND_SPAN,
    LEVEL_SPAN,
    ROOT,
    Slot,
    entry,
    key_slot,
    node_digest,
    nodes_of,
    parent_of,
    parse_open,
    parse_root,
    root_blob,
    rows_of,
    tree_of,
    trimmed,
    write_at,
)
from .rows import RowCodec


class BindPart(RowCodec):
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
            middles[Slot(kind, start).middle] = self._cut(
                LEVEL_SPAN, kind, start // FANOUT // FANOUT, (start // FANOUT) % FANOUT + 1
            )
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

    def _move_open_chunk(self, binds: dict[Slot, bytes | None]) -> None:
        """The open key chunk's meta row, moved to the chunk of the newest
        memory now, which ``binds`` may hold (taken out of them: the tree
        never holds it); the chunk that was open before joins the tree as the
        state held it, unless this write named it again."""
        T = self.count()
        now = (T - 1) // KEYS_PER_CHUNK if T else -1
        row = self.conn.execute("SELECT value FROM meta WHERE name = ?", (OPEN_META,)).fetchone()
        was, digest = parse_open(None if row is None else str(row[0]))
        if was >= 0 and was != now:
            binds.setdefault(key_slot(was), digest)
        want = binds.pop(key_slot(now), None) if now >= 0 else None
        if want is None and was != now:
            self.conn.execute("DELETE FROM meta WHERE name = ?", (OPEN_META,))  # not named: read as damage
        if want is None or want == digest:
            return
        row_now = self._row_at(key_slot(now), "NULL")
        if row_now is not None and entry(key_slot(now), row_now[0]) == want:  # not a write rolled back since
            self._put_meta(OPEN_META, f"{now} {want.hex()}")

    def _cut(self, level: int, kind: int, index: int, keep: int) -> bytearray:
        """Delete the nodes of ``kind`` at ``level`` after node ``index``;
        that one, cut to its first ``keep`` slots."""
        node = level + kind * KIND_SPAN + index
        self.conn.execute(f"DELETE FROM {TABLE} WHERE node > ? AND node < ?", (node, level + (kind + 1) * KIND_SPAN))
        return bytearray(self._stored_node(node)[: keep * DIGEST])

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
            return None
        self.conn.execute(
            f"INSERT INTO {TABLE}(node, digests) VALUES (?, ?) "
            "ON CONFLICT(node) DO UPDATE SET digests = excluded.digests",
            (node, data),
        )
        digest = node_digest(node, data)
        nodes_of(self.conn).keep(node, data, digest)
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
        self.conn.execute("DELETE FROM meta WHERE name = ?", (OPEN_META,))
        nodes = tree_of(self._tree_rows())
        self.conn.executemany(f"INSERT INTO {TABLE}(node, digests) VALUES (?, ?)", sorted(nodes.items()))
        for slot, sealed in self._newest_row():
            self._put_meta(OPEN_META, f"{slot.pos} {entry(slot, sealed).hex()}")

    def _newest_row(self) -> list[tuple[Slot, bytes]]:
        """The open key chunk (the newest memory's) as the file holds it, if any."""
        T = self.count()
        row = self._row_at(key_slot((T - 1) // KEYS_PER_CHUNK), "NULL") if T else None
        return [] if row is None else [(key_slot((T - 1) // KEYS_PER_CHUNK), row[0])]

    def _tree_rows(self) -> Iterator[tuple[Slot, bytes]]:
        """Every bound row the tree holds: all but the open key chunk."""
        skip = {slot for slot, _ in self._newest_row()}
        return (r for r in rows_of(self.conn, self._tables()) if r[0] not in skip)

    def check_row_digests(self) -> None:
        """``stash verify --token``: the tree recomputed from every row must
        be the tree stored, node for node (a row without its slot, a slot
        without its row, a node left over: damage)."""
        if self.format_mark() != BOUND_MARK:
            return
        with read_snapshot(self.conn):
            want = tree_of(self._tree_rows())
            have = dict(self.conn.execute(f"SELECT node, digests FROM {TABLE}")) if self._made(TABLE) else {}
            stored = self._stored_node(ROOT)
            opened = [(slot.pos, entry(slot, sealed)) for slot, sealed in self._newest_row()]
        have = {node: bytes(blob) for node, blob in have.items()}
        if (
            (want != have and (have or want != {ROOT: b""}))
            or stored != self._root
            or opened != ([self._newest] if self._newest[0] >= 0 else [])
        ):
            raise Damaged(UNBOUND.format(what="tree of row digests"))
