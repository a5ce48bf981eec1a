"""Summaries settled by one request while another forgets: the tree must stay
a tree (every summary above size 2 built on two settled halves)."""

from __future__ import annotations

from typing import Any

import pytest

from stash.core import blocks
from stash.service.access import Vault
from tests.support.api import CHEAP_KDF


@pytest.fixture
def memory_file(tmp_path):
    vault = Vault(tmp_path, kdf=CHEAP_KDF)
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        yield s.open_memory().mf


def test_a_block_whose_half_was_forgotten_meanwhile_is_not_settled(memory_file):
    mf = memory_file
    mf.append([("2026-01-02", f"m{i}") for i in range(4)])
    assert mf.put_summary(0, 2, "first pair")
    assert mf.put_summary(2, 4, "second pair")
    # An agent read the nap for 0-3 while both halves stood; then another
    # session forgot 2-3 before the answer arrived.
    assert mf.drop_summaries_from(2, 4) == [(2, 4)]
    assert not mf.put_summary(0, 4, "built on a half that is gone")
    assert mf.summary(0, 4) is None
    assert mf.settled(4) == {2: 1, 4: 0}


def test_a_level_stays_a_dense_prefix(memory_file):
    mf = memory_file
    mf.append([("2026-01-02", f"m{i}") for i in range(6)])
    assert not mf.put_summary(2, 4, "skips 0-1")
    assert mf.put_summary(0, 2, "a")
    assert not mf.put_summary(0, 2, "a again")
    assert mf.settled(6) == {2: 1, 4: 0}


def test_a_wake_reads_one_snapshot_while_another_worker_forgets(tmp_path):
    """A wake reads the settled tree, then the summaries the due nap is
    built from; a forget committed by another connection between those two
    reads (another worker's request) must not make the wake see a tree whose
    summaries are gone: it answers from the snapshot it began with."""
    vault = Vault(tmp_path, kdf=CHEAP_KDF)
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as reader, vault.session(ident.token, "owner") as owner:
        mf = reader.open_memory().mf
        assert owner.open_memory().mf.conn is not mf.conn
        mf.append([("2026-01-02", f"m{i}") for i in range(64)])
        while (due := blocks.first_pending(64, mf.settled(64))) != (32, 64):
            assert due is not None
            assert mf.put_summary(*due, f"sum {due[0]}")
        read_tree = mf.settled
        forgot: list[Any] = []

        def settled_then_forget(T):
            tree = read_tree(T)
            if not forgot:
                forgot.append(owner.open_memory().forget("48-63"))  # commits at once, on its own connection
            return tree

        mf.settled = settled_then_forget  # type: ignore[method-assign]
        answer = reader.open_memory().wake()
        assert forgot and forgot[0]["dropped"][0] == "48-63"
        assert answer["nap"]["block"] == "32-63"
        assert "#48-63 sum 48" in answer["nap"]["source"]
        mf.settled = read_tree  # type: ignore[method-assign]
        assert reader.open_memory().wake()["nap"]["block"] == "48-63"  # the next wake sees the forget


def test_a_snapshot_opens_each_key_chunk_once_and_forgets_it_after(tmp_path):
    """Inside one snapshot (MemoryFile.snapshot) a key chunk opened once
    serves every later read of it: a nap offer reads the sources of many
    small blocks, each its own read. After the snapshot ends, the next read
    opens the chunk afresh, so an erasure another worker committed meanwhile
    is seen."""
    vault = Vault(tmp_path, kdf=CHEAP_KDF)
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as reader, vault.session(ident.token, "owner") as other:
        mf = reader.open_memory().mf
        mf.append([("2026-01-02", f"m{i}") for i in range(40)])
        opened: list[int] = []
        real = mf.log.open_chunk

        def counted(c, sealed, epoch):
            opened.append(c)
            return real(c, sealed, epoch)

        setattr(mf.log, "open_chunk", counted)  # noqa: B010 - a method replaced on this instance only
        with mf.snapshot():
            first = [mf.memories(lo, lo + 2) for lo in range(0, 40, 2)]
            other.open_memory().erase([3])  # committed by another connection meanwhile
            again = mf.memories(2, 4)
        assert opened == [0]  # chunk 0, opened once for 21 reads
        assert again == first[1] and again[1][2] == "m3"  # the snapshot's own view, whole
        assert mf.memories(2, 4)[1][2] == "[erased]"  # after it: the erasure is seen
        assert opened == [0, 0]
