"""The pool of open connections kept between requests (storage/sqlite/pool.py),
on real SQLite and SQLCipher files: a connection is handed back only for the
same file, unchanged, under the same key; the file is whole between
requests; and the pool lets go when told to, within its bounds."""

from __future__ import annotations

import ast
import os
import platform
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import stash
from stash.storage import safeopen, userlock
from stash.storage.sqlite import connections
from stash.storage.sqlite.pool import Pool, Signature, key_digest

KEY_A = bytes(range(32))
KEY_B = bytes(range(1, 33))


@pytest.fixture
def pool_on() -> Iterator[Pool]:
    pool = connections.new_pool(60.0, 4)
    try:
        yield pool
    finally:
        pool.close()


def make(path: Path, key: bytes | None = KEY_A, cipher: str = "sqlcipher") -> None:
    conn = connections.connect(path, file_key=key, cipher=cipher, create=True)
    # A table name both files may hold: a file's schema is checked on open (storage/safeopen.py).
    conn.execute("CREATE TABLE idempotency (x INTEGER)")
    conn.execute("INSERT INTO idempotency VALUES (1)")
    connections.close_now(path, conn)


def is_closed(conn: sqlite3.Connection) -> bool:
    try:
        conn.execute("SELECT 1")
    except Exception as exc:  # sqlite3 and sqlcipher3 both raise ProgrammingError
        return "closed" in str(exc)
    return False


def test_a_released_connection_comes_back_for_the_same_file_and_key_only(tmp_path: Path, pool_on: Pool):
    path = tmp_path / "memory.db"
    make(path)
    first = connections.connect(path, file_key=KEY_A, cipher="sqlcipher", pool=pool_on)
    connections.release(first, path, KEY_A, pool_on)
    assert pool_on.idle_count() == 1
    # Another key never gets it: it opens afresh, and fails as a wrong key does.
    with pytest.raises(Exception, match="not a database"):
        connections.connect(path, file_key=KEY_B, cipher="sqlcipher", pool=pool_on)
    assert pool_on.idle_count() == 1
    again = connections.connect(path, file_key=KEY_A, cipher="sqlcipher", pool=pool_on)
    assert again is first and again.execute("SELECT x FROM idempotency").fetchall() == [(1,)]
    connections.close_now(path, again)


def test_a_kept_file_is_folded_once_it_went_quiet_and_whole_without_its_wal_after(tmp_path: Path, pool_on: Pool):
    path = tmp_path / "memory.db"
    make(path)
    conn = connections.connect(path, file_key=KEY_A, cipher="sqlcipher", pool=pool_on)
    conn.execute("INSERT INTO idempotency VALUES (2)")
    connections.release(conn, path, KEY_A, pool_on)
    assert pool_on.idle_count() == 1
    # Released, the write is in the WAL (synced there at its commit); the file and its WAL together hold it.
    assert os.path.getsize(f"{path}-wal") > 0
    both = tmp_path / "both" / "memory.db"
    both.parent.mkdir()
    for side in ("", "-wal"):
        shutil.copyfile(f"{path}{side}", f"{both}{side}")
    seen = connections.connect(both, file_key=KEY_A, cipher="sqlcipher")
    assert seen.execute("SELECT x FROM idempotency ORDER BY x").fetchall() == [(1,), (2,)]
    connections.close_now(both, seen)
    # The file alone, copied in that moment, is the state before the write (SECURITY.md says so).
    alone = tmp_path / "alone" / "memory.db"
    alone.parent.mkdir()
    shutil.copyfile(path, alone)
    seen = connections.connect(alone, file_key=KEY_A, cipher="sqlcipher")
    assert seen.execute("SELECT x FROM idempotency ORDER BY x").fetchall() == [(1,)]
    connections.close_now(alone, seen)
    # Not quiet for long enough yet: nothing is folded.
    pool_on.fold_quiet(now=time.monotonic())
    assert os.path.getsize(f"{path}-wal") > 0
    pool_on.fold_quiet(now=time.monotonic() + pool_on.fold_after)
    assert os.path.getsize(f"{path}-wal") == 0 and pool_on.idle_count() == 1
    # A copy of the file alone, taken now, holds the write; and the folded connection is handed back.
    copy = tmp_path / "copy" / "memory.db"
    copy.parent.mkdir()
    shutil.copyfile(path, copy)
    seen = connections.connect(copy, file_key=KEY_A, cipher="sqlcipher")
    assert seen.execute("SELECT x FROM idempotency ORDER BY x").fetchall() == [(1,), (2,)]
    connections.close_now(copy, seen)
    assert connections.connect(path, file_key=KEY_A, cipher="sqlcipher", pool=pool_on) is conn
    connections.close_now(path, conn)


def test_the_pools_own_thread_folds_a_quiet_file_within_its_time(tmp_path: Path):
    path = tmp_path / "memory.db"
    make(path)
    with connections.new_pool(60.0, 4) as pool:
        conn = connections.connect(path, file_key=KEY_A, cipher="sqlcipher", pool=pool)
        conn.execute("INSERT INTO idempotency VALUES (2)")
        connections.release(conn, path, KEY_A, pool)
        deadline = time.monotonic() + 10
        while os.path.getsize(f"{path}-wal") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.path.getsize(f"{path}-wal") == 0 and pool.idle_count() == 1 and not is_closed(conn)


def test_a_fold_waits_while_the_users_lock_is_held_exclusive(tmp_path: Path, pool_on: Pool):
    """A backup copies a memory file and its WAL under the lock held
    exclusive: the pool never folds one beneath it."""
    path = tmp_path / "memory.db"
    make(path)
    conn = connections.connect(path, file_key=KEY_A, cipher="sqlcipher", pool=pool_on)
    conn.execute("INSERT INTO idempotency VALUES (2)")
    connections.release(conn, path, KEY_A, pool_on)
    wal = os.path.getsize(f"{path}-wal")
    later = time.monotonic() + pool_on.fold_after
    with userlock.exclusive(tmp_path):
        pool_on.fold_quiet(now=later)
        assert os.path.getsize(f"{path}-wal") == wal and pool_on.idle_count() == 1
    pool_on.fold_quiet(now=later)
    assert os.path.getsize(f"{path}-wal") == 0 and pool_on.idle_count() == 1


def test_a_file_changed_before_its_fold_is_closed_not_folded(tmp_path: Path, pool_on: Pool):
    path = tmp_path / "keyring.db"
    make(path, None, "none")
    kept = connections.connect(path, file_key=None, cipher="none", pool=pool_on)
    kept.execute("INSERT INTO idempotency VALUES (2)")
    connections.release(kept, path, None, pool_on)
    path.chmod(0o400)  # only the change time moves
    pool_on.fold_quiet(now=time.monotonic() + pool_on.fold_after)
    assert is_closed(kept) and pool_on.idle_count() == 0


@pytest.mark.parametrize("cipher", ["sqlcipher", "none"])
def test_another_workers_commit_leaves_a_kept_connection_in_use_and_its_frames_unfolded(
    tmp_path: Path, pool_on: Pool, cipher: str
):
    """Another worker's write changes the file under a kept connection; SQLite
    counted that commit, so the connection is handed back (it reads the
    other worker's rows, SQLite having dropped its cache), and nothing folds
    that worker's frames (its pool folds its own once the file is quiet)."""
    key = KEY_A if cipher == "sqlcipher" else None
    path = tmp_path / "keyring.db"
    make(path, key, cipher)
    kept = connections.connect(path, file_key=key, cipher=cipher, pool=pool_on)
    kept.execute("INSERT INTO idempotency VALUES (2)")
    connections.release(kept, path, key, pool_on)
    other = connections.connect(path, file_key=key, cipher=cipher)  # the other worker, its connection kept open
    try:
        other.execute("INSERT INTO idempotency VALUES (3)")
        wal = os.path.getsize(f"{path}-wal")
        again = connections.connect(path, file_key=key, cipher=cipher, pool=pool_on)
        assert again is kept and not is_closed(kept)
        assert os.path.getsize(f"{path}-wal") == wal > 0
        assert again.execute("SELECT x FROM idempotency ORDER BY x").fetchall() == [(1,), (2,), (3,)]
        connections.release(again, path, key, pool_on)
        # And again after a second commit of the other worker's, counted from the last hand-back.
        other.execute("INSERT INTO idempotency VALUES (4)")
        assert connections.connect(path, file_key=key, cipher=cipher, pool=pool_on) is kept
        assert kept.execute("SELECT MAX(x) FROM idempotency").fetchone() == (4,)
        connections.close_now(path, kept)
    finally:
        other.close()


def kept_with_an_older_copy(tmp_path: Path, pool: Pool) -> tuple[Path, Path, sqlite3.Connection]:
    """A key ring holding 1, copied aside, then given 2 by a connection now
    kept idle in ``pool`` with its WAL folded, as the pool's thread does
    once the file is quiet: (the file, the older copy, the kept connection)."""
    path = tmp_path / "keyring.db"
    make(path, None, "none")
    older = tmp_path / "older.db"
    shutil.copyfile(path, older)
    kept = connections.connect(path, file_key=None, cipher="none", pool=pool)
    kept.execute("INSERT INTO idempotency VALUES (2)")
    connections.release(kept, path, None, pool)
    pool.fold_quiet(now=time.monotonic() + pool.fold_after)
    return path, older, kept


def test_a_file_put_back_then_written_through_sqlite_is_read_as_it_is_now_never_from_the_cache(
    tmp_path: Path, pool_on: Pool
):
    """A file copied over in place and then written by another connection:
    SQLite counted a commit, so the kept connection is handed back, and it
    reads the file as it is now (SQLite dropped its cache when the commit
    was counted), as a fresh connection would; never the rows it had cached.
    Whether that state may be served is then the memory file's own checks'
    affair, on every open (tests/e2e/test_whole_state.py)."""
    path, older, kept = kept_with_an_older_copy(tmp_path, pool_on)
    assert kept.execute("SELECT x FROM idempotency ORDER BY x").fetchall() == [(1,), (2,)]  # in its cache
    time.sleep(0.01)
    shutil.copyfile(older, path)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("INSERT INTO idempotency VALUES (3)")
    other.close()
    again = connections.connect(path, file_key=None, cipher="none", pool=pool_on)
    assert again.execute("SELECT x FROM idempotency ORDER BY x").fetchall() == [(1,), (3,)]
    connections.close_now(path, again)


@pytest.mark.parametrize("change", ["a table made", "a trigger made"])
def test_a_schema_changed_by_another_connection_is_opened_afresh(tmp_path: Path, pool_on: Pool, change: str):
    """A commit SQLite counted, but one that changed the schema: the kept
    connection is closed, so the fresh open checks the schema again
    (storage/safeopen.py) and refuses the crafted one."""
    path = tmp_path / "keyring.db"
    make(path, None, "none")
    kept = connections.connect(path, file_key=None, cipher="none", pool=pool_on)
    connections.release(kept, path, None, pool_on)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        if change == "a table made":
            other.execute("CREATE TABLE sneaky (x INTEGER)")
        else:
            other.execute("CREATE TRIGGER sneaky AFTER INSERT ON idempotency BEGIN DELETE FROM idempotency; END")
    finally:
        other.close()
    with pytest.raises(safeopen.ForeignSchema, match="crafted or damaged"):
        connections.connect(path, file_key=None, cipher="none", pool=pool_on)
    assert is_closed(kept) and pool_on.idle_count() == 0


def test_a_connection_dropped_while_its_fold_runs_is_closed_after_it(tmp_path: Path):
    """A revocation drops a user's kept files while the pool's thread may
    be folding one: that one is not put back."""
    (tmp_path / "a").mkdir()
    path = tmp_path / "a" / "keyring.db"
    make(path, None, "none")
    holder: dict[str, Pool] = {}

    def folding(p: Path, conn: sqlite3.Connection, sig: Signature) -> Signature | None:
        holder["pool"].drop_folder(tmp_path / "a", held=False)
        return connections._pool_folder(p, conn, sig)

    pool = Pool(60.0, 4, closer=connections._pool_closer, folder=folding)
    holder["pool"] = pool
    try:
        kept = connections.connect(path, file_key=None, cipher="none", pool=pool)
        kept.execute("INSERT INTO idempotency VALUES (2)")
        connections.release(kept, path, None, pool)
        pool.fold_quiet(now=time.monotonic() + pool.fold_after)
        assert is_closed(kept) and pool.idle_count() == 0
    finally:
        pool.close()


@pytest.mark.parametrize("change", ["copied over in place", "replaced by rename", "its mode changed"])
def test_a_file_changed_while_idle_is_opened_afresh_and_the_kept_connection_closed(
    tmp_path: Path, pool_on: Pool, change: str
):
    path, older, kept = kept_with_an_older_copy(tmp_path, pool_on)
    assert os.path.getsize(f"{path}-wal") == 0 and pool_on.idle_count() == 1
    if change.startswith("copied over in place"):
        time.sleep(0.01)  # a distinct modification time on filesystems with coarse clocks
        shutil.copyfile(older, path)

    elif change == "replaced by rename":
        os.replace(older, path)
    else:
        path.chmod(0o400)  # only the change time moves (root reads it still: what matters is no reuse)
    fresh = connections.connect(path, file_key=None, cipher="none", pool=pool_on)
    assert fresh is not kept and is_closed(kept)
    want = {"its mode changed": [(1,), (2,)]}.get(change, [(1,)])
    assert fresh.execute("SELECT x FROM idempotency ORDER BY x").fetchall() == want
    connections.close_now(path, fresh)


def test_the_pool_keeps_at_most_its_bound_and_closes_the_oldest(tmp_path: Path, pool_on: Pool):
    conns = []
    for k in range(pool_on.max_idle + 2):
        path = tmp_path / f"f{k}.db"
        make(path, None, "none")
        conn = connections.connect(path, file_key=None, cipher="none", pool=pool_on)
        connections.release(conn, path, None, pool_on)
        conns.append(conn)
    assert pool_on.idle_count() == pool_on.max_idle
    assert [is_closed(c) for c in conns] == [True, True] + [False] * pool_on.max_idle


def test_reap_closes_what_idled_past_its_time_and_drop_folder_only_that_folder(tmp_path: Path, pool_on: Pool):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    kept = {}
    for name in ("a", "b"):
        path = tmp_path / name / "keyring.db"
        make(path, None, "none")
        kept[name] = connections.connect(path, file_key=None, cipher="none", pool=pool_on)
        connections.release(kept[name], path, None, pool_on)
    pool_on.reap(now=time.monotonic())
    assert pool_on.idle_count() == 2
    pool_on.drop_folder(tmp_path / "a", held=True)
    assert is_closed(kept["a"]) and not is_closed(kept["b"])
    pool_on.reap(now=time.monotonic() + pool_on.idle_seconds + 1)
    assert is_closed(kept["b"]) and pool_on.idle_count() == 0


@pytest.mark.parametrize("kind", ["no pool", "a pool of 0 seconds", "a closed pool"])
def test_off_the_pool_keeps_nothing(tmp_path: Path, kind: str):
    off = None if kind == "no pool" else connections.new_pool(0.0 if kind == "a pool of 0 seconds" else 60.0, 4)
    if kind == "a closed pool":
        assert off is not None and off.enabled
        off.close()
    assert off is None or not off.enabled
    path = tmp_path / "keyring.db"
    make(path, None, "none")
    conn = connections.connect(path, file_key=None, cipher="none", pool=off)
    connections.release(conn, path, None, off)
    assert is_closed(conn) and (off is None or off.idle_count() == 0)
    assert not Path(f"{path}-wal").exists()


def test_its_owner_closing_the_pool_closes_every_kept_file_whole(tmp_path: Path):
    """What a server's lifespan does when it stops: every file still kept
    open is closed, its WAL folded in and removed."""
    paths = [tmp_path / "keyring.db", tmp_path / "memory.db"]
    with connections.new_pool(60.0, 4) as pool:
        kept = []
        for path in paths:
            make(path, None, "none")
            conn = connections.connect(path, file_key=None, cipher="none", pool=pool)
            conn.execute("INSERT INTO idempotency VALUES (2)")
            connections.release(conn, path, None, pool)
            kept.append(conn)
        assert pool.idle_count() == 2 and not any(is_closed(c) for c in kept)
    assert pool.idle_count() == 0 and all(is_closed(c) for c in kept)
    assert not any(Path(f"{p}-wal").exists() for p in paths)


def test_keys_are_named_by_digest_not_kept():
    assert key_digest(KEY_A) != key_digest(KEY_B) and KEY_A not in key_digest(KEY_A)
    assert len(key_digest(KEY_A)) == 16


def test_no_module_holds_a_pool_of_its_own():
    """A pool exists only where its owner built it (the server's lifespan):
    no module of the package makes one when imported, so a tool or test that
    opens stores gets no process-wide pool."""
    for path in Path(stash.__file__).parent.rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
            if isinstance(value, ast.Call):
                callee = value.func.attr if isinstance(value.func, ast.Attribute) else getattr(value.func, "id", "")
                assert callee not in ("Pool", "new_pool"), f"{path.name}:{node.lineno}"


def test_the_pools_thread_gives_the_free_heap_back_every_few_seconds():
    calls: list[float] = []
    with Pool(60.0, 4, closer=connections._pool_closer, trim=lambda: calls.append(time.monotonic()), trim_every=0.3):
        deadline = time.monotonic() + 10
        while len(calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert len(calls) >= 2
    assert connections.new_pool(60.0, 4).trim is connections.return_free_heap


def _rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's; elsewhere it does nothing")
def test_returning_the_free_heap_gives_freed_memory_back_to_the_system():
    """What a worker's RSS grew by under load: memory freed below the top of
    glibc's heap, which it keeps until told to give it back."""
    assert connections.return_free_heap()
    chunks = [bytearray(64 * 1024) for _ in range(1200)]  # 75 MiB, each under glibc's mmap threshold
    pin = bytearray(64 * 1024)  # allocated last: the heap's top stays in use
    before = _rss_kib()
    del chunks
    kept = _rss_kib()
    connections.return_free_heap()
    after = _rss_kib()
    assert before - kept < 16 * 1024 and kept - after > 48 * 1024, (before, kept, after)
    del pin
