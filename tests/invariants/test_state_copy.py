"""The key ring's copy of the whole-state version follows only what the
memory file committed: a write rolled back after it raised the version in
its transaction (a batch refused half way) leaves no trace in the copy, so
the next open is not refused as a rollback. Real files, real crypto."""

from __future__ import annotations

from pathlib import Path

from stash.service.access import Vault
from tests.helpers import CHEAP_KDF


def test_a_batch_refused_half_way_does_not_raise_the_copy(tmp_path: Path) -> None:
    vault = Vault(tmp_path / "data", kdf=CHEAP_KDF)
    token = vault.create_identity().token
    with vault.session(token, "full") as s:
        for k in range(4):
            s.memory.note(f"m{k}")
    with vault.session(token, "full") as s:
        mf = s.memory.mf
        # 0-1 can be settled; 0-3 cannot (2-3 has no summary): all or nothing.
        assert mf.put_summaries([(0, 2, "first pair"), (0, 4, "all four")]) is False
        assert mf.summary(0, 2) is None
    with vault.session(token, "full") as s:
        mf = s.memory.mf  # opens: the copy is not ahead of the file
        assert s.keyring.state_version() == mf.committed()[1] == mf.state_version
        assert s.memory.nap("0-1", "first pair")["saved"] == "0-1"
    with vault.session(token, "read") as s:
        assert s.memory.mf.summary(0, 2) == "first pair"
