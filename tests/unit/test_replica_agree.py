"""``stash restore`` picks a moment where a user's two files agree
(stash/service/ops/replica.py, ``agree``): the pairs it refuses are exactly the
ones whole-state authentication refuses when the server opens them, and the
pairs it accepts open. Real files from a real Vault, copied at two moments
as two Litestream streams could have left them."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from stash.core.errors import StashError
from stash.service.access import Vault
from stash.service.ops.keyring_memfile_agree import agree
from tests.support.api import CHEAP_KDF


def copy(src: Path, dst: Path) -> Path:
    source, target = sqlite3.connect(src), sqlite3.connect(dst)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()
    return dst


def serve_pair(root: Path, user_id: str, ring: Path, memory: Path) -> Path:
    """A data folder holding just this user, with these two files."""
    folder = root / "users" / user_id
    folder.mkdir(parents=True)
    shutil.copy(ring, folder / "keyring.db")
    shutil.copy(memory, folder / "memory.db")
    return root


def opens(root: Path, token: str) -> str | None:
    """None when the server's open accepts the store, else the refusal's code."""
    try:
        with Vault(root, CHEAP_KDF, "none").session(token, "read") as s:
            s.open_memory().wake()
    except StashError as e:
        return e.code
    return None


@pytest.fixture
def moments(tmp_path: Path):
    """The user's files at three moments: after three notes, after two
    more, and after a revocation (a new key epoch)."""
    vault = Vault(tmp_path / "data", CHEAP_KDF, "none")
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        for k in range(3):
            s.open_memory().note(f"early {k}")
        gid, _ = vault.mint_grant(s, "read")
    live = tmp_path / "data" / "users" / ident.user_id
    early = tmp_path / "early"
    early.mkdir()
    for name in ("keyring.db", "memory.db"):
        copy(live / name, early / name)
    with vault.session(ident.token, "owner") as s:
        for k in range(2):
            s.open_memory().note(f"late {k}")
    mid = tmp_path / "mid"
    mid.mkdir()
    for name in ("keyring.db", "memory.db"):
        copy(live / name, mid / name)
    with vault.session(ident.token, "owner") as s:
        vault.revoke_grant(s, gid)
        vault.finish_epoch(s)  # the memory file re-sealed under the new epoch, as the route does
    late = tmp_path / "late"
    late.mkdir()
    for name in ("keyring.db", "memory.db"):
        copy(live / name, late / name)
    return ident, early, mid, late


def test_agree_accepts_exactly_the_pairs_the_server_opens(moments, tmp_path: Path):
    ident, early, mid, late = moments
    cases = {
        "both early": (early, early, True),
        "both late": (late, late, True),
        "key ring behind": (early, mid, True),  # its copy of the head lags: accepted when the log extends it
        "key ring ahead": (mid, early, False),  # the memory file is behind the key ring's copy: a rollback
        "key ring before the epoch": (mid, late, False),  # rows sealed under an epoch the ring does not hold
    }
    for n, (label, (ring_from, memory_from, served)) in enumerate(cases.items()):
        why = agree(ring_from / "keyring.db", memory_from / "memory.db")
        code = opens(
            serve_pair(tmp_path / f"pair{n}", ident.user_id, ring_from / "keyring.db", memory_from / "memory.db"),
            ident.token,
        )
        assert (why is None) == (code is None) == served, (label, why, code)
