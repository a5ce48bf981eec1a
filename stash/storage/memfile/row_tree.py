"""The layout of the tree of row digests (bound.py): where each bound row's
digest sits (its *slot*), what a slot, a node and the root hold, how each is
digested, the whole tree of a file's rows (:func:`tree_of`, read by
:func:`rows_of`), and the nodes a connection keeps checked (:func:`nodes_of`).
Nothing here writes a file."""

from __future__ import annotations

import hashlib
import sqlite3
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from ...core.errors import Damaged

FANOUT = 124
"""Slots per leaf and leaves per middle: a node is at most 124 · 16 = 1,984
bytes, so two fit a 4 KiB page."""
DIGEST = 16
KEYS, ERASED = 1, 2
SUMMARY_KINDS = 8  # kind 8 + k: the summaries of blocks of size 2**k
LEVEL_SPAN = 1 << 58  # a node's key: level (0 leaf, 1 middle, 2 root), kind, index
KIND_SPAN = 1 << 48
ROOT = 2 * LEVEL_SPAN
EMPTY = bytes(DIGEST)
BATCH = 4096  # rows read per statement when the tree is built or checked whole
UNREADABLE = "The memory file's tree of row digests is unreadable; restore this store from a backup."
POSITION = struct.Struct(">HQ")  # a slot's kind and position, as its digest covers them
TABLES = {KEYS: "memory_keys", ERASED: "erased"}  # every other kind: "summaries"


def summary_kind(size: int) -> int:
    return SUMMARY_KINDS + size.bit_length() - 1


class Slot(NamedTuple):
    """Where a row's digest sits, and how to read the row again."""

    kind: int
    pos: int

    @property
    def leaf(self) -> int:
        return self.kind * KIND_SPAN + self.pos // FANOUT

    @property
    def middle(self) -> int:
        return LEVEL_SPAN + self.kind * KIND_SPAN + self.pos // FANOUT // FANOUT

    def where(self, op: str = "=") -> tuple[str, tuple[int, ...]]:
        """The condition that picks this slot's row out of its table (``op``
        ``>=``: its row and every later one of its kind)."""
        if self.kind == KEYS:
            return f"chunk {op} ?", (self.pos,)
        if self.kind == ERASED:
            return f"id {op} ?", (self.pos,)
        return f"size = ? AND idx {op} ?", (1 << (self.kind - SUMMARY_KINDS), self.pos)

    @property
    def name(self) -> str:
        """The row, as a message names it."""
        if self.kind == KEYS:
            return f"memory key chunk (#{self.pos})"
        if self.kind == ERASED:
            return f"erasure row (of memory #{self.pos})"
        size = 1 << (self.kind - SUMMARY_KINDS)
        return f"summary (of {self.pos * size}-{(self.pos + 1) * size - 1})"

    @property
    def table(self) -> str:
        return TABLES.get(self.kind, "summaries")


_slot = tuple.__new__  # a Slot made without NamedTuple's own __new__: these are made for every row read


def key_slot(chunk: int) -> Slot:
    return _slot(Slot, (KEYS, chunk))


def erased_slot(i: int) -> Slot:
    return _slot(Slot, (ERASED, i))


def summary_slot(size: int, idx: int) -> Slot:
    return _slot(Slot, (SUMMARY_KINDS - 1 + size.bit_length(), idx))


ROW_HASH = hashlib.blake2b(digest_size=DIGEST, person=b"stash.rowdig")  # copied: faster than made anew
_NODE = hashlib.blake2b(digest_size=DIGEST, person=b"stash.rownode")


def entry(slot: Slot, sealed: bytes) -> bytes:
    """What a slot holds for a row sealed as ``sealed``."""
    h = ROW_HASH.copy()
    h.update(POSITION.pack(*slot) + sealed)
    return h.digest()


def parent_of(leaf: int) -> tuple[int, int]:
    """The middle that holds leaf ``leaf``'s digest, and where in it."""
    kind, index = divmod(leaf, KIND_SPAN)
    return LEVEL_SPAN + kind * KIND_SPAN + index // FANOUT, index % FANOUT


def node_digest(node: int, blob: bytes) -> bytes:
    h = _NODE.copy()
    h.update(node.to_bytes(8, "big") + blob)
    return h.digest()


def read_at(blob: bytes, j: int) -> bytes:
    got = blob[j * DIGEST : (j + 1) * DIGEST]
    return got if len(got) == DIGEST else EMPTY


def write_at(blob: bytearray, j: int, value: bytes | None) -> None:
    end = (j + 1) * DIGEST
    if len(blob) < end:
        if value is None:
            return
        blob.extend(bytes(end - len(blob)))
    blob[j * DIGEST : end] = value or EMPTY


def trimmed(blob: bytearray) -> bytes:
    """A node without its empty slots at the end (an empty node is no row)."""
    n = len(blob)
    while n and blob[n - DIGEST : n] == EMPTY:
        n -= DIGEST
    return bytes(blob[:n])


NODES_KEPT = "stash_row_nodes"  # the attribute of a connection that keeps the nodes read through it
NODE_CACHE_BYTES = 128 * 1024
"""The most the nodes kept on one memory file's connection may hold: a wake at
a million memories checks about 40 (80 KiB). They are digests of sealed rows."""


class Nodes(dict[int, tuple[bytes, bytes]]):
    """Nodes as read, each with its digest: one is used again only where its
    parent, checked up to the authenticated root, names that digest, so a
    node kept from an earlier request (or state) is as good as one read now.
    Beside them, the leaves already checked against ``root`` and the root
    parsed (``middles``), kept for as long as the file's authenticated root
    is that one: the next request of an unchanged file checks no node again."""

    held = 0  # bytes of blobs kept

    def __init__(self) -> None:
        super().__init__()
        self.root = b""
        self.middles: dict[int, bytes] | None = None
        self.leaves: dict[int, bytes] = {}

    def against(self, root: bytes) -> None:
        """The authenticated root is ``root`` now: what was checked against another goes."""
        if root != self.root:
            self.root, self.middles, self.leaves = root, None, {}

    def keep(self, node: int, blob: bytes, digest: bytes) -> None:
        if self.held + len(blob) > NODE_CACHE_BYTES:  # an export of a million summaries reads 8,000 leaves
            self.clear()
            self.held, self.leaves = 0, {}
        old = self.get(node)
        self.held += len(blob) - (len(old[0]) if old is not None else 0)
        self[node] = (blob, digest)


def nodes_of(conn: sqlite3.Connection) -> Nodes:
    """The nodes kept on ``conn``: a connection the pool keeps between
    requests is the same file (storage/sqlite/pool.py), and its nodes go with it."""
    nodes = getattr(conn, NODES_KEPT, None)
    if nodes is None:
        nodes = Nodes()
        setattr(conn, NODES_KEPT, nodes)
    return nodes


def parse_root(blob: bytes) -> dict[int, bytes]:
    """The root's middles: ``{middle: digest}``; Damaged when it is not one this module writes."""
    if len(blob) % (8 + DIGEST):
        raise Damaged(UNREADABLE)
    step = 8 + DIGEST
    return {int.from_bytes(blob[k : k + 8], "big"): blob[k + 8 : k + step] for k in range(0, len(blob), step)}


def parse_open(text: str | None) -> tuple[int, bytes]:
    """The open key chunk and its digest from its meta row (bound.py,
    ``OPEN_META``); ``(-1, EMPTY)`` for none (no memory yet)."""
    if text is None:
        return -1, EMPTY
    try:
        chunk, digest = text.split(" ")
        return int(chunk), bytes.fromhex(digest)
    except ValueError:
        raise Damaged(UNREADABLE) from None


def root_blob(middles: dict[int, bytes]) -> bytes:
    return b"".join(m.to_bytes(8, "big") + d for m, d in sorted(middles.items()) if d != EMPTY)


def rows_of(conn: sqlite3.Connection, tables: frozenset[str]) -> Iterator[tuple[Slot, bytes]]:
    """Every bound row a memory file holds, ``(slot, sealed)``, in slot
    order, :data:`BATCH` to a statement."""
    by_id: list[tuple[str, str, Callable[[int], Slot]]] = [
        ("memory_keys", "chunk", key_slot),
        ("erased", "id", erased_slot),
    ]
    for table, key, make in by_id:
        if table not in tables:
            continue
        after = -1
        while rows := conn.execute(
            f"SELECT {key}, sealed FROM {table} WHERE {key} > ? ORDER BY {key} LIMIT ?", (after, BATCH)
        ).fetchall():
            for pos, sealed in rows:
                yield make(pos), bytes(sealed)
            after = rows[-1][0]
    if "summaries" not in tables:
        return
    for (size,) in conn.execute("SELECT DISTINCT size FROM summaries ORDER BY size").fetchall():
        after = -1
        while rows := conn.execute(
            "SELECT idx, sealed FROM summaries WHERE size = ? AND idx > ? ORDER BY idx LIMIT ?", (size, after, BATCH)
        ).fetchall():
            for idx, sealed in rows:
                yield summary_slot(size, idx), bytes(sealed)
            after = rows[-1][0]


def tree_of(rows: Iterable[tuple[Slot, bytes]]) -> dict[int, bytes]:
    """Every node of the tree of ``rows`` (in slot order), as stored."""
    nodes: dict[int, bytes] = {}
    leaves: dict[int, bytearray] = {}
    for slot, sealed in rows:
        write_at(leaves.setdefault(slot.leaf, bytearray()), slot.pos % FANOUT, entry(slot, sealed))
    middles: dict[int, bytearray] = {}
    for leaf, blob in leaves.items():
        nodes[leaf] = trimmed(blob)
        middle, j = parent_of(leaf)
        write_at(middles.setdefault(middle, bytearray()), j, node_digest(leaf, nodes[leaf]))
    root: dict[int, bytes] = {}
    for middle, blob in middles.items():
        nodes[middle] = trimmed(blob)
        root[middle] = node_digest(middle, nodes[middle])
    nodes[ROOT] = root_blob(root)
    return nodes
