"""The per-day import bound of a full capability (``--import-per-day``):
counted per grant and per UTC day in the memory file, sealed, started afresh
on a new day; the owner is not bounded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stash.core.errors import QuotaReached
from stash.service import quotas
from stash.storage.memfile import MemoryFile

USER = "00112233aabbccdd"


def test_a_day_counts_per_grant_and_a_new_day_starts_afresh(tmp_path: Path):
    mf = MemoryFile(tmp_path / "memory.db", USER, os.urandom(32), "none", create=True)
    try:
        with mf.conn:
            mf.count_import("2026-12-01", 2, 30)
            mf.count_import("2026-12-01", 2, 15)
            mf.count_import("2026-12-01", 3, 5)
        assert mf.imported_on("2026-12-01", 2) == 45 and mf.imported_on("2026-12-01", 3) == 5
        assert mf.imported_on("2026-12-02", 2) == 0
        raw = mf.conn.execute("SELECT value FROM meta WHERE name = 'import_budget'").fetchone()[0]
        # Sealed: a plain file shows no day, grant nor count as the plaintext writes them (quoted: the
        # sealed text's own alphabet holds no quote, and four digits can occur in it by chance).
        assert '"2026-12-01"' not in raw and '"2"' not in raw
        with pytest.raises(QuotaReached) as e:
            quotas.check_import("full", 10, mf.imported_on("2026-12-01", 2), 100, 50, "2026-12-01")
        assert e.value.code == "quota.import_day"
        quotas.check_import("full", 5, mf.imported_on("2026-12-01", 2), 100, 50, "2026-12-01")
        with pytest.raises(QuotaReached) as e:
            quotas.check_import("full", 101, 0, 100, 10**6, "2026-12-02")
        assert e.value.code == "quota.import_request"
        quotas.check_import("owner", 10**6, 10**6, 100, 50, "2026-12-01")  # the owner is not bounded
    finally:
        mf.close()
