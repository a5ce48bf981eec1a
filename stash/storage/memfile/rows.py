"""The row codec: how a value is sealed into a row and opened from one.

Every value is sealed with associated data naming its user, table and
position (:meth:`RowCodec.aad`), so a row moved to another user, table or
place fails to open and raises :class:`Damaged` — it is never served. A
memory's plaintext is padded to its bucket (:func:`..formats.bucket`: the
smallest multiple of 32 bytes that holds it, 312 the largest; rows of
earlier releases are all 312 or 320 and open as they are), ending in the
grant that wrote it; a summary's starts with the state version it was
written at (summaries from before that field carry none, read as version
0), is padded to its bucket too, and ends in its writer.
"""

from __future__ import annotations

from ...core.errors import Damaged
from ...crypto import aead, keys
from ..formats import (
    BUCKETED_MARK,
    MEMORY_PLAINTEXT_BYTES,
    OLDER_MEMORY_PLAINTEXT_BYTES,
    SUMMARY_PLAINTEXT_BYTES,
    SUMMARY_VERSION_BYTES,
    bucket,
)
from .base import FileBase

LARGEST_MEMORY_PLAINTEXT = max(MEMORY_PLAINTEXT_BYTES, OLDER_MEMORY_PLAINTEXT_BYTES)
# The grant that wrote a memory or a summary: the last bytes of its padded
# plaintext, sealed with it (0: not recorded, as in rows written before this
# field). The text's own padding leaves room for it, so it costs no byte.
WRITER_BYTES = 4
ERASED = "[erased]"


class RowCodec:
    """How the rows of ``file`` are sealed and opened: under the rows key of
    the epoch that sealed each, with associated data naming its place."""

    def __init__(self, file: FileBase) -> None:
        self.file = file

    def aad(self, table: str, position: str | int) -> bytes:
        return f"stash/v1|{self.file.user_id}|{table}|{position}".encode()

    def has_epoch(self, table: str) -> bool:
        """Whether ``table`` records each row's epoch: only a file that has
        had a new epoch since rows record theirs does (docs/DESIGN.md,
        "Key epochs"). Read once per handle, as no other request changes it
        while this one has the file open (a new epoch holds the user's lock
        exclusive)."""
        has = self.file.epoch_columns.get(table)
        if has is None:
            columns = [r[1] for r in self.file.conn.execute(f"PRAGMA table_info({table})")]
            has = "epoch" in columns
            if columns:  # a table not made yet may be made with the column by another writer
                self.file.epoch_columns[table] = has
        return has

    def epoch_sql(self, table: str) -> str:
        """What a SELECT reads as a row's epoch: its column, or NULL (the base epoch)."""
        return "epoch" if self.has_epoch(table) else "NULL"

    def key_of(self, epoch: int | None) -> bytes:
        """The rows key of the epoch that sealed a row (None: the file's base
        epoch). An epoch this file is not past, or one the handle has no key
        chain for, fails as damage: an edited ``epoch`` value only makes the
        row fail to open."""
        e = self.file.base_epoch if epoch is None else epoch
        if e == self.file.epoch and type(e) is int:
            return self.file.rows_key
        key = self.file.epoch_keys.get(e) if type(e) is int else None
        if key is None:
            if self.file.keychain is None or type(e) is not int or not 0 <= e < self.file.epoch:
                raise Damaged("A stored row names a key epoch this file cannot have; restore this store from a backup.")
            key = keys.subkey(self.file.keychain.key(e), b"rows")
            self.file.epoch_keys[e] = key
        return key

    def epoch_of_write(self, table: str) -> tuple[str, str, tuple[int, ...]]:
        """The column list, placeholders and value that record a row written
        now as sealed in the current epoch (nothing for a table without the
        column: then no new epoch has begun since, and its rows are all in
        the file's epoch)."""
        return (", epoch", ", ?", (self.file.epoch,)) if self.has_epoch(table) else ("", "", ())

    def open(self, key: bytes, sealed: bytes, table: str, position: str | int) -> bytes:
        try:
            return aead.open_sealed(key, sealed, self.aad(table, position))
        except aead.Unsealable:
            raise Damaged(
                f"Stored {table} data at {position} failed its integrity check and was not served; "
                "restore this store from a backup."
            ) from None

    def decode(self, i: int, plain: bytes) -> tuple[str, str]:
        try:
            line = aead.unpad(plain).decode()
        except (aead.Unsealable, UnicodeDecodeError):
            raise Damaged(f"Memory #{i} is unreadable; restore this store from a backup.") from None
        return line[:10], line[11:]

    def memory_plain(self, date: str, text: str) -> bytes:
        payload = f"{date} {text}".encode()
        size = bucket(2 + len(payload) + WRITER_BYTES, MEMORY_PLAINTEXT_BYTES)
        return aead.pad(payload, size - WRITER_BYTES) + self.file.writer.to_bytes(WRITER_BYTES, "big")

    def summary_plain(self, version: int, text: str, writer: int) -> bytes:
        """A summary's plaintext: its version field (:data:`BUCKETED_MARK`,
        then the state version it was written at), then the text padded to
        its bucket with the writer's id in the last bytes."""
        payload = text.encode()
        size = bucket(2 + len(payload) + WRITER_BYTES, SUMMARY_PLAINTEXT_BYTES)
        return (
            BUCKETED_MARK.to_bytes(2, "big")
            + version.to_bytes(SUMMARY_VERSION_BYTES - 2, "big")
            + aead.pad(payload, size - WRITER_BYTES)
            + writer.to_bytes(WRITER_BYTES, "big")
        )

    def seal_summary(self, size: int, idx: int, version: int, text: str) -> bytes:
        return aead.seal(
            self.file.rows_key,
            self.summary_plain(version, text, self.file.writer),
            self.aad("summaries", f"{size}|{idx}"),
        )

    @staticmethod
    def writer_of(plain: bytes) -> int:
        return int.from_bytes(plain[-WRITER_BYTES:], "big")
