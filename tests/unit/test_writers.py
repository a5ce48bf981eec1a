"""Which grant wrote each memory and summary (issue 12 item 9): recorded in
the sealed plaintext of the row itself, so it is as private as the text and
costs no byte on disk; kept through a new key epoch, gone with an erasure."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from stash.service.access import Vault


def test_each_memory_and_summary_names_the_grant_that_wrote_it(tmp_path: Path) -> None:
    vault = Vault(tmp_path, file_cipher="none")
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        owner_id = s.grant_id
        full_id, full = vault.mint_grant(s, "full")
        s.open_memory().note("the owner wrote this")
    with vault.session(full, "full") as s:
        s.open_memory().note("the full capability wrote this")  # completes 0-1: due now
        s.open_memory().nap("0-1", "two memories, two writers")
        today = dt.datetime.now(dt.UTC).date().isoformat()
        s.open_memory().import_entries([{"date": today, "text": "imported by full"}])
    with vault.session(ident.token, "owner") as s:
        s.open_memory().note("the owner again")  # completes 2-3
        s.open_memory().nap("2-3", "an import and a note")
        mf = s.open_memory().mf
        assert [mf.memory_writer(i) for i in range(4)] == [owner_id, full_id, full_id, owner_id]
        assert mf.summary_writer(0, 2) == full_id and mf.summary_writer(2, 4) == owner_id
        assert mf.summary_writer(0, 4) is None  # not written yet
        with pytest.raises(ValueError):
            mf.memory_writer(4)
        assert owner_id != full_id

    # A revocation re-seals every row under a new epoch; the record goes with the row.
    with vault.session(ident.token, "owner") as s:
        vault.revoke_grant(s, full_id)
    with vault.session(ident.token, "owner") as s:
        mf = s.open_memory().mf
        assert [mf.memory_writer(i) for i in range(4)] == [owner_id, full_id, full_id, owner_id]
        assert mf.summary_writer(0, 2) == full_id
        s.open_memory().erase([1], "2026-12-01T00:00:00Z")
    with vault.session(ident.token, "owner") as s:
        # erased: its key, and with it who wrote it, is gone
        assert s.open_memory().mf.memory_writer(1) is None
        assert s.open_memory().mf.memory_writer(0) == owner_id
