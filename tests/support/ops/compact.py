"""What the tests of ``stash compact`` share: a store written by the
one-size codec of the releases before "rows in buckets", and each summary
as the server opens it."""

from __future__ import annotations

from pathlib import Path

from stash.core.blocks import levels
from stash.crypto import aead
from stash.service.access import Vault
from stash.storage import formats
from stash.storage.memfile.rows import WRITER_BYTES, RowCodec
from stash.storage.sqlite.transactions import write_transaction
from tests.support.api import CHEAP_KDF

ONE_SIZE = {
    formats.SUMMARY_PLAINTEXT_BYTES + aead.OVERHEAD,
    formats.SUMMARY_VERSION_BYTES + formats.SUMMARY_PLAINTEXT_BYTES + aead.OVERHEAD,
}


def _old_memory_plain(self: RowCodec, date: str, text: str) -> bytes:
    return aead.pad(
        f"{date} {text}".encode(), formats.MEMORY_PLAINTEXT_BYTES - WRITER_BYTES
    ) + self.file.writer.to_bytes(WRITER_BYTES, "big")


def _old_summary_plain(self: RowCodec, version: int, text: str, writer: int) -> bytes:
    return (
        version.to_bytes(formats.SUMMARY_VERSION_BYTES, "big")
        + aead.pad(text.encode(), formats.SUMMARY_PLAINTEXT_BYTES - WRITER_BYTES)
        + writer.to_bytes(WRITER_BYTES, "big")
    )


def old_store(monkeypatch, data: Path, cipher: str, T: int, *, napped: bool = True) -> tuple[Vault, str]:
    """A store of ``T`` memories written by the one-size codec, every block
    summarised: by naps (``napped``), or written straight in as
    bench/build.py writes them, in one transaction."""
    monkeypatch.setattr(RowCodec, "memory_plain", _old_memory_plain)
    monkeypatch.setattr(RowCodec, "summary_plain", _old_summary_plain)
    vault = Vault(data, kdf=CHEAP_KDF, file_cipher=cipher)
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        mf = s.open_memory().mf
        mf.append([("2026-01-02", f"memory {i} " + "w" * (i % 90)) for i in range(T)])
        if napped:
            nap = s.open_memory().nap()["nap"]
            while nap is not None:
                nap = s.open_memory().nap(nap["block"], f"summary of {nap['block']}")["nap"]
        else:
            with write_transaction(mf.conn):
                version = mf.next_version()
                mf.ensure_table("summaries")
                for size in levels(T):
                    for idx in range(T // size):
                        mf.conn.execute(
                            "INSERT INTO summaries(size, idx, sealed) VALUES (?, ?, ?)",
                            (
                                size,
                                idx,
                                aead.seal(
                                    mf.rows_key,
                                    mf.codec.summary_plain(version, f"sum {size} {idx}", 0),
                                    mf.codec.aad("summaries", f"{size}|{idx}"),
                                ),
                            ),
                        )
                mf.build_row_digests()  # as bench/build.py's bulk load makes the tree of what it wrote
                mf.state.write()
    monkeypatch.undo()
    return vault, ident.token


def summaries(vault: Vault, token: str) -> dict[tuple[int, int], tuple[int, int, str, int]]:
    """Each summary's version, writer, text and sealed length, opened as the server opens it."""
    out = {}
    with vault.session(token, "read") as s:
        mf = s.open_memory().mf
        for size, idx, sealed in mf.conn.execute("SELECT size, idx, sealed FROM summaries"):
            version, plain = mf.tree.open_summary(size, idx, sealed, None)
            out[(size, idx)] = (
                version,
                mf.codec.writer_of(plain),
                mf.tree.summary_text(size, idx, sealed, None),
                len(sealed),
            )
    return out
