"""A revocation moves the key ring first and re-seals the memory file second.
If the second step does not happen (a crash, a damaged or unwritable file), the
next request that opens the file re-seals it before reading or writing
anything: nothing is ever written under the old epoch's key once the key ring
has moved. In main and in a second memory, whose files are bound to its own
store id."""

from __future__ import annotations

import os
from pathlib import Path

from nacl import bindings
from nacl.exceptions import CryptoError

from stash.crypto import keys
from stash.service.access import Vault
from tests.support.api import CHEAP_KDF
from tests.support.files.raw import file_key, open_raw
from tests.support.memories import Memory


def raw_memory_file(folder: Path, base: bytes, cipher: str):
    """The memory file opened with its file key, read only, nothing changed."""
    import contextlib

    @contextlib.contextmanager
    def opened():
        conn = open_raw(folder / "memory.db", file_key(base), isolation_level=None)
        try:
            yield conn
        finally:
            conn.close()

    return opened()


def chunk_opens(folder: Path, base: bytes, rows_root: bytes, user_id: str) -> bool:
    with raw_memory_file(folder, base, "sqlcipher") as conn:
        (sealed,) = conn.execute("SELECT sealed FROM memory_keys WHERE chunk = 0").fetchone()
    try:
        bindings.crypto_aead_xchacha20poly1305_ietf_decrypt(
            sealed[24:], f"stash/v1|{user_id}|memory_keys|0".encode(), sealed[:24], keys.subkey(rows_root, b"rows")
        )
        return True
    except CryptoError:
        return False


def file_epoch(folder: Path, base: bytes) -> int:
    with raw_memory_file(folder, base, "sqlcipher") as conn:
        row = conn.execute("SELECT value FROM meta WHERE name = 'epoch'").fetchone()
    return int(row[0])


def test_a_revocation_cut_between_its_two_files_is_finished_by_the_next_open(tmp_path: Path, memory: Memory):
    vault = Vault(tmp_path / "data", CHEAP_KDF, "sqlcipher")
    ident = vault.create_identity()
    memory.create_in(vault, ident.token)
    store = memory.store(ident.user_id)
    marker = f"m{os.urandom(5).hex()}"
    with vault.session(ident.token, "owner", memory=memory.name) as s:
        s.open_memory().note(f"{marker} before")
        gid, _ = vault.mint_grant(s, "read")
        old = s.keys
    folder = memory.folder(tmp_path / "data" / "users" / ident.user_id)
    with vault.session(ident.token, "owner", memory=memory.name) as s:
        # Only the key ring's half of a revocation: as if the process died after it.
        new, stranded, _ = s.keyring.advance_epoch(s.keys, (gid,))
    assert stranded == [] and new.epoch == 1
    assert file_epoch(folder, old.base) == 0 and chunk_opens(folder, old.base, old.current, store)

    with vault.session(ident.token, "full", memory=memory.name) as s:
        # The open re-sealed first; the note below is written under epoch 1.
        assert s.open_memory().mf.epoch == 1
        s.open_memory().note(f"{marker} after")
        assert [m[2] for m in s.open_memory().mf.memories(0, 2)] == [f"{marker} before", f"{marker} after"]
    assert file_epoch(folder, old.base) == 1
    assert not chunk_opens(folder, old.base, old.current, store)
    assert chunk_opens(folder, old.base, new.current, store)
