"""``stash verify --token`` names a log whose dates go backwards (issue 26,
finding 13): notes are now dated so that they never do, but a memory file
written before that, under a clock set back, holds such dates. The rows
authenticate, so it is a warning, not damage: verify passes (rc 0) and says
where, since that log's export does not import again (SECURITY.md, "Clocks")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.ops.verify import Store, run


@pytest.mark.parametrize("cipher", ["none", "sqlcipher"])
def test_verify_warns_of_a_log_whose_dates_go_backwards(tmp_path: Path, capsys, cipher: str):
    store = Store(tmp_path / "data", cipher, n=0)
    with store.vault.session(store.token, "full") as s:
        # The storage layer's append, as a release before the newest-date rule
        # dated notes: by the clock alone, a day ahead and then back.
        s.open_memory().mf.append([("2026-11-30", "before the fault"), ("2026-12-02", "a day ahead")])
        s.open_memory().mf.append([("2026-12-01", "the clock set back"), ("2026-12-01", "the same day")])
        s.open_memory().mf.append([("2001-01-01", "under a 2001 clock")])
    code, text = run(capsys, store.data, store.token)
    assert code == 0, text
    assert f"{store.user_id}  ok  " in text
    (warn,) = [x for x in text.splitlines() if x.startswith(f"{store.user_id}  WARN")]
    assert "go backwards 2 times, first at note #2 dated 2026-12-01 after #1, 2026-12-02" in warn
    assert "does not import again" in warn
    # The same log read back: the export's first backward step is where the warning says.
    with store.vault.session(store.token, "read") as s:
        dates = [d for _, d, _ in s.open_memory().mf.memories(0, s.open_memory().count())]
    assert dates == ["2026-11-30", "2026-12-02", "2026-12-01", "2026-12-01", "2001-01-01"]


def test_verify_does_not_warn_of_a_log_in_order_and_counts_erased_memories(tmp_path: Path, capsys):
    store = Store(tmp_path / "data", "none", n=0)
    with store.vault.session(store.token, "full") as s:
        s.open_memory().mf.append([("2026-11-30", "one"), ("2026-12-01", "two"), ("2026-12-01", "three")])
    with store.vault.session(store.token, "owner") as s:
        s.open_memory().mf.erase([1], "2026-12-01T00:00:00Z")  # an erased memory keeps its date, in order
    code, text = run(capsys, store.data, store.token)
    assert code == 0, text
    assert "WARN" not in text
