"""A user's memory file: the sealed log, summary tree and config.

One handle, :class:`MemoryFile` (``handle``), holding one part per concern,
each a plain class in a module a reader can hold alone, given the open file
(``base``) and the parts it calls: the row codec (``rows``), the log, its
key chunks and its old rows stored short (``log``; their codec
``short_rows``), erasure (``erasure``, its record ``erasure_record``), the
summary tree (``tree``), whole-state authentication (``state``), the tree of
row digests that binds every key chunk, summary and erased row to it
(``bound``, its layout ``row_tree``), the running digest and pins
(``head``), key epochs and re-sealing (``reseal``) and the import counter
(``budget``). The formats these files have had are in :mod:`..formats`.
"""

from ..formats import MEMORY_PLAINTEXT_BYTES, SUMMARY_PLAINTEXT_BYTES, SUMMARY_VERSION_BYTES
from .base import (
    CHUNK_BYTES,
    DROPS_META,
    EPOCH_META,
    ERASED_KEY,
    HEAD_META,
    HOLES_META,
    KEYS_PER_CHUNK,
    ROLLED_BACK,
    STATE_META,
    FileKeys,
)
from .handle import MemoryFile
from .head import DIGEST_GONE
from .log import SCAN_BATCH
from .reseal import KEYS_BEHIND, KeysBehind, ResealDue, check_not_behind
from .rows import ERASED, LARGEST_MEMORY_PLAINTEXT, WRITER_BYTES
from .state import STATE_GONE

__all__ = [
    "CHUNK_BYTES",
    "DIGEST_GONE",
    "DROPS_META",
    "EPOCH_META",
    "ERASED",
    "ERASED_KEY",
    "HEAD_META",
    "HOLES_META",
    "KEYS_BEHIND",
    "KEYS_PER_CHUNK",
    "LARGEST_MEMORY_PLAINTEXT",
    "MEMORY_PLAINTEXT_BYTES",
    "ROLLED_BACK",
    "SCAN_BATCH",
    "STATE_GONE",
    "STATE_META",
    "SUMMARY_PLAINTEXT_BYTES",
    "SUMMARY_VERSION_BYTES",
    "WRITER_BYTES",
    "FileKeys",
    "KeysBehind",
    "MemoryFile",
    "ResealDue",
    "check_not_behind",
]
