"""The row codec: how a value is sealed into a row and opened from one.

Every value is sealed with associated data naming its user, table and
position (:meth:`RowCodec._aad`), so a row moved to another user, table or
place fails to open and raises :class:`Damaged` — it is never served. A
memory's plaintext is padded to one length (312 bytes; rows of earlier
releases are 320 and open as they are), ending in the grant that wrote it; a
summary's starts with the state version it was written at (summaries from
before that field carry none, read as version 0), and ends in its writer.
"""

from __future__ import annotations

from ...core.errors import Damaged
from ...crypto import aead
from ..formats import (
    MEMORY_PLAINTEXT_BYTES,
    OLDER_MEMORY_PLAINTEXT_BYTES,
    SUMMARY_PLAINTEXT_BYTES,
    SUMMARY_VERSION_BYTES,
)
from .base import FilePart

LARGEST_MEMORY_PLAINTEXT = max(MEMORY_PLAINTEXT_BYTES, OLDER_MEMORY_PLAINTEXT_BYTES)
# The grant that wrote a memory or a summary: the last bytes of its padded
# plaintext, sealed with it (0: not recorded, as in rows written before this
# field). The text's own padding leaves room for it, so it costs no byte.
WRITER_BYTES = 4
ERASED = "[erased]"


class RowCodec(FilePart):
    def _aad(self, table: str, position: str | int) -> bytes:
        return f"stash/v1|{self.user_id}|{table}|{position}".encode()

    def _open(self, key: bytes, sealed: bytes, table: str, position: str | int) -> bytes:
        try:
            return aead.open_sealed(key, sealed, self._aad(table, position))
        except aead.Unsealable:
            raise Damaged(
                f"Stored {table} data at {position} failed its integrity check and was not served; "
                "restore this store from a backup."
            ) from None

    def _decode(self, i: int, plain: bytes) -> tuple[str, str]:
        try:
            line = aead.unpad(plain).decode()
        except (aead.Unsealable, UnicodeDecodeError):
            raise Damaged(f"Memory #{i} is unreadable; restore this store from a backup.") from None
        return line[:10], line[11:]

    def _memory_plain(self, date: str, text: str) -> bytes:
        return (aead.pad(f"{date} {text}".encode(), MEMORY_PLAINTEXT_BYTES - WRITER_BYTES)
                + self.writer.to_bytes(WRITER_BYTES, "big"))

    def _seal_summary(self, size: int, idx: int, version: int, text: str) -> bytes:
        return aead.seal(self._rows_key,
                         version.to_bytes(SUMMARY_VERSION_BYTES, "big")
                         + aead.pad(text.encode(), SUMMARY_PLAINTEXT_BYTES - WRITER_BYTES)
                         + self.writer.to_bytes(WRITER_BYTES, "big"),
                         self._aad("summaries", f"{size}|{idx}"))

    def _open_summary(self, size: int, idx: int, sealed: bytes) -> tuple[int, bytes]:
        """The state version a summary was written at (0: before the field)
        and its padded text."""
        plain = self._open(self._rows_key, sealed, "summaries", f"{size}|{idx}")
        if len(plain) == SUMMARY_VERSION_BYTES + SUMMARY_PLAINTEXT_BYTES:
            return int.from_bytes(plain[:SUMMARY_VERSION_BYTES], "big"), plain[SUMMARY_VERSION_BYTES:]
        return 0, plain

    @staticmethod
    def _writer_of(plain: bytes) -> int:
        return int.from_bytes(plain[-WRITER_BYTES:], "big")
