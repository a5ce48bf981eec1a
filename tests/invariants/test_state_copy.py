"""The key ring's copy of the whole-state version follows only what the
memory file committed: a write rolled back after it raised the version in
its transaction (a batch refused half way) leaves no trace in the copy, so
the next open is not refused as a rollback. Real files, real crypto."""

from __future__ import annotations

from pathlib import Path

import pytest

from stash.service.access import Vault
from stash.storage.keyring import StaleGrant
from tests.support.api import CHEAP_KDF


def test_a_batch_refused_half_way_does_not_raise_the_copy(tmp_path: Path) -> None:
    vault = Vault(tmp_path / "data", kdf=CHEAP_KDF)
    token = vault.create_identity().token
    with vault.session(token, "full") as s:
        for k in range(4):
            s.open_memory().note(f"m{k}")
    with vault.session(token, "full") as s:
        mf = s.open_memory().mf
        # 0-1 can be settled; 0-3 cannot (2-3 has no summary): all or nothing.
        assert mf.put_summaries([(0, 2, "first pair"), (0, 4, "all four")]) is False
        assert mf.summary(0, 2) is None
    with vault.session(token, "full") as s:
        mf = s.open_memory().mf  # opens: the copy is not ahead of the file
        assert s.keyring.state_version() == mf.committed()[1] == mf.state_version
        assert s.open_memory().nap("0-1", "first pair")["saved"] == "0-1"
    with vault.session(token, "read") as s:
        assert s.open_memory().mf.summary(0, 2) == "first pair"


def test_a_grant_read_just_before_a_revocation_still_opens(tmp_path: Path) -> None:
    """A request reads its grant row, then another request's revocation of a
    different capability commits, then the first opens its grant: the row as
    read holds the old epoch's box. That is a race, not a stale row put back,
    and the live capability must open (it answered 401 before)."""
    vault = Vault(tmp_path / "data", kdf=CHEAP_KDF)
    owner = vault.create_identity().token
    with vault.session(owner, "owner") as s:
        _, writer = vault.mint_grant(s, "full")
        doomed, _ = vault.mint_grant(s, "read")
    token, _, ring, grant = vault._authenticate(writer)
    try:
        with vault.session(owner, "owner") as s:
            vault.revoke_grant(s, doomed)
        with pytest.raises(StaleGrant):
            ring.open_grant(grant, token.secret)  # the row as read is an epoch behind
        opened, fresh = vault._open_grant(ring, grant, token)
        assert fresh.id == grant.id and opened.chain.epoch == ring.epoch()
    finally:
        ring.close()
    with vault.session(writer, "full") as s:
        assert s.open_memory().note("still here")["id"] == 0
