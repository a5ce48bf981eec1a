"""Recall through the sealed scan cache must answer exactly what one pass does:
with no cache, a whole cache, a cache missing pieces, stale pieces after an
erasure, and tampered pieces; and an erasure must leave its text in no piece."""

from __future__ import annotations

import contextlib
import random
import re
import sqlite3
from pathlib import Path

import pytest

from stash.core.errors import Damaged
from stash.core.recall import compile_pattern
from stash.service import recall_scan
from stash.service.access import Vault
from stash.storage.recallcache import rendered_log
from stash.storage.recallcache.rendered_log import PIECE
from tests.support.api import CHEAP_KDF
from tests.support.files.raw import restore_log_triggers

T = 3 * PIECE + 77  # three pieces and a tail read row by row
WORDS = ["heron", "Yılmaz", "İstanbul", "garden", "shed", "ferry", "kelp", "gato", "Straße"]


def one_pass(lines: list[str], pattern: str, part_bytes: int) -> tuple[list[str], int]:
    """docs/DESIGN.md, "Recall", from its words: every matching line, then the newest that fit."""
    hits = [x for x in lines if re.search(pattern, x, re.IGNORECASE)]
    kept: list[str] = []
    size = 0
    for line in reversed(hits):
        cost = len(line.encode()) + 1
        if size + cost > part_bytes:
            break
        kept.insert(0, line)
        size += cost
    return kept, len(hits)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    data = tmp_path_factory.mktemp("recall")
    vault = Vault(data, kdf=CHEAP_KDF)
    ident = vault.create_identity()
    rng = random.Random(11)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(T)]
    with vault.session(ident.token, "owner") as s:
        s.open_memory().mf.append([("2026-01-02", t) for t in texts])
        s.open_memory().erase([5, PIECE + 9], "2026-01-03T00:00:00Z")
    lines = [f"#{i} 2026-01-02 {t}" for i, t in enumerate(texts)]
    for i in (5, PIECE + 9):
        lines[i] = f"#{i} 2026-01-02 [erased]"
    return vault, ident.token, lines


def cache_db(mf) -> sqlite3.Connection:
    return sqlite3.connect(mf.file_keys().path.parent / rendered_log.CACHE_FILE, isolation_level=None)


def cached_pieces(mf) -> set[int]:
    if not (mf.file_keys().path.parent / rendered_log.CACHE_FILE).exists():
        return set()
    with contextlib.closing(cache_db(mf)) as db:
        return {r[0] for r in db.execute("SELECT piece FROM scan_cache")}


PATTERNS = ["heron", "yilmaz", "ISTANBUL", "^#1", r"\d+ 2026", "erased", "x*", "kelp ferry", r"\A#1\d"]


@pytest.mark.slow
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("part_bytes", [0, 60, 2000, 20_000, 10**9])
def test_cold_and_warm_cache_answer_what_one_pass_does(store, pattern, part_bytes):
    vault, token, lines = store
    with vault.session(token, "read") as s:
        mf = s.open_memory().mf
        (mf.file_keys().path.parent / rendered_log.CACHE_FILE).unlink(missing_ok=True)
        cold = recall_scan.recall(mf, compile_pattern(pattern), part_bytes, deadline=1e18)
        assert cached_pieces(mf) == {0, 1, 2}
        warm = recall_scan.recall(mf, compile_pattern(pattern), part_bytes, deadline=1e18)
    want = one_pass(lines, pattern, part_bytes)
    assert cold == want
    assert warm == want


@pytest.mark.parametrize("stop", [0, 1, PIECE - 1, PIECE, PIECE + 10, 3 * PIECE, T])
def test_a_stop_bound_answers_one_pass_over_the_memories_below_it(store, stop):
    vault, token, lines = store
    with vault.session(token, "read") as s:
        got = recall_scan.recall(s.open_memory().mf, compile_pattern("e"), 2000, deadline=1e18, stop=stop)
    assert got == one_pass(lines[:stop], "e", 2000)


def test_a_missing_piece_is_rebuilt_and_a_tampered_one_is_never_served(store):
    vault, token, lines = store
    with vault.session(token, "read") as s:
        mf = s.open_memory().mf
        recall_scan.recall(mf, compile_pattern("heron"), 10**9, deadline=1e18)
        with contextlib.closing(cache_db(mf)) as db:
            db.execute("DELETE FROM scan_cache WHERE piece = 1")
            # Piece 0 swapped into piece 2's place, and piece 1's gone: both
            # are rendered from the log instead and written back.
            zero = db.execute("SELECT sealed FROM scan_cache WHERE piece = 0").fetchone()[0]
            db.execute("UPDATE scan_cache SET sealed = ? WHERE piece = 2", (zero,))
        got = recall_scan.recall(mf, compile_pattern("heron"), 10**9, deadline=1e18)
        assert cached_pieces(mf) == {0, 1, 2}
        with contextlib.closing(cache_db(mf)) as db:
            assert db.execute("SELECT sealed FROM scan_cache WHERE piece = 2").fetchone()[0] != zero
    assert got == one_pass(lines, "heron", 10**9)


def test_an_erasure_drops_its_piece_and_an_old_copy_of_the_piece_no_longer_opens(tmp_path):
    vault = Vault(tmp_path, kdf=CHEAP_KDF, file_cipher="none")
    ident = vault.create_identity()
    secret = "the vault code is 4711"
    texts = [f"memory {i}" for i in range(2 * PIECE)]
    texts[PIECE + 3] = secret
    with vault.session(ident.token, "owner") as s:
        mf = s.open_memory().mf
        mf.append([("2026-01-02", t) for t in texts])
        assert s.open_memory().recall("vault code")["total"] == 1
        assert cached_pieces(mf) == {0, 1}
        with contextlib.closing(cache_db(mf)) as db:
            old = db.execute("SELECT sealed FROM scan_cache WHERE piece = 1").fetchone()[0]
        s.open_memory().erase([PIECE + 3], "2026-01-03T00:00:00Z")
        assert cached_pieces(mf) == {0}
        # Shredded, not only unlinked: invalidate checkpoints, secure_delete zeroes.
        cache = tmp_path / "users" / ident.user_id / rendered_log.CACHE_FILE
        wal = Path(f"{cache}-wal")
        raw = cache.read_bytes() + (wal.read_bytes() if wal.exists() else b"")
        assert old[:4096] not in raw and old[-4096:] not in raw
        # Someone puts the piece written before the erasure back by hand.
        with contextlib.closing(cache_db(mf)) as db:
            db.execute("INSERT INTO scan_cache(piece, sealed) VALUES (1, ?)", (old,))
        got = s.open_memory().recall("vault code|erased")
    assert (got["matches"], got["total"]) == ([f"#{PIECE + 3} 2026-01-02 [erased]"], 1)


def test_damage_in_a_piece_not_cached_yet_is_reported(tmp_path):
    vault = Vault(tmp_path, kdf=CHEAP_KDF, file_cipher="none")
    ident = vault.create_identity()
    with vault.session(ident.token, "owner") as s:
        s.open_memory().mf.append([("2026-01-02", f"memory {i}") for i in range(2 * PIECE + 1)])
    raw = sqlite3.connect(tmp_path / "users" / ident.user_id / "memory.db")
    raw.execute("DROP TRIGGER log_no_update")
    sealed = raw.execute("SELECT sealed FROM log WHERE id = 7").fetchone()[0]
    raw.execute("UPDATE log SET sealed = ? WHERE id = 7", (sealed[:-1] + bytes([sealed[-1] ^ 1]),))
    raw.commit()
    restore_log_triggers(raw)
    raw.close()
    with vault.session(ident.token, "read") as s, pytest.raises(Damaged):
        s.open_memory().recall("memory")


def test_pieces_are_compressed_and_padded_and_the_old_layout_is_rebuilt(store):
    """A piece is its lines compressed, padded to 4 KiB multiples and sealed
    (SECURITY.md: its size shows how well its memories compress, to within
    4 KiB). One sealed as before compression (or whose compressed bytes are
    not a whole zlib stream, though sealed under the right key) does not
    serve: it is rebuilt from the log and written back compressed."""
    from stash.crypto import aead

    vault, token, lines = store
    with vault.session(token, "read") as s:
        mf = s.open_memory().mf
        recall_scan.recall(mf, compile_pattern("heron"), 10**9, deadline=1e18)
        fk = mf.file_keys()
        cache = rendered_log.ScanCache(
            mf.conn, fk.path.parent, mf.user_id, fk.rows_key, 128, mf.erased_ids, mf.chunk_digests
        )
        digests = cache._keys_digests(0, 3)
        with contextlib.closing(cache_db(mf)) as db:
            sealed = dict(db.execute("SELECT piece, sealed FROM scan_cache"))
            plain = [("\n".join(lines[p * PIECE : (p + 1) * PIECE]) + "\n").encode() for p in range(3)]
            for p, value in sealed.items():
                assert (len(value) - aead.OVERHEAD) % rendered_log.PAD_BYTES == 0
                assert len(value) < len(plain[p]) // 2  # compressed
            # Piece 0 as the uncompressed layout sealed it; piece 1 sealed
            # as compressed, but not zlib.
            old = aead.seal(fk.rows_key, rendered_log._pad(plain[0]), cache._aad(0, digests[0]))
            bad = aead.seal(
                fk.rows_key,
                rendered_log._pad(b"x" + plain[1][:100]),
                cache._aad(1, digests[1]) + rendered_log.COMPRESSED,
            )
            db.execute("UPDATE scan_cache SET sealed = ? WHERE piece = 0", (old,))
            db.execute("UPDATE scan_cache SET sealed = ? WHERE piece = 1", (bad,))
        assert [p for p, got in cache.pieces(3)] == [2, 1, 0]
        assert [got is None for _, got in cache.pieces(3)] == [False, True, True]
        got = recall_scan.recall(mf, compile_pattern("heron"), 10**9, deadline=1e18)
        assert got == one_pass(lines, "heron", 10**9)
        assert [got for _, got in cache.pieces(3)] == plain[::-1]  # rebuilt, compressed, and opening
        with contextlib.closing(cache_db(mf)) as db:
            again = dict(db.execute("SELECT piece, sealed FROM scan_cache"))
        assert again[0] != old and again[1] != bad and len(again[0]) < len(old) // 2
        cache.close()
