"""A recall over the whole log, on both cores when the log is long.

Recall decrypts every memory, and at a million memories one core spends about
three seconds doing so. Above :data:`PARALLEL_MIN` the older half of the log is
scanned by a worker process (a second interpreter, so a second core) while this
thread scans the newer half; the two answers merge into exactly what one pass
would give. The worker receives the file's derived keys for that one call and
keeps nothing: it is the same server, on the same host, serving the same
request.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from ..core.recall import Matcher, compile_pattern
from ..storage.memfile import SCAN_BATCH, FileKeys, MemoryFile

PARALLEL_MIN = 200_000
"""Below this many memories one core answers well within the goal, and a
worker would only add the cost of a round trip."""

_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()
# One job at a time: a recall that finds the worker busy with another user's
# scans alone rather than queue behind it (its time bound is already running).
_worker_free = threading.Semaphore(1)


def _worker_pool() -> ProcessPoolExecutor | None:
    global _pool
    if (os.cpu_count() or 1) < 2:
        return None
    with _pool_lock:
        if _pool is None:
            # spawn, not fork: the server has threads, and a forked child of a
            # threaded process may inherit a held lock.
            _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return _pool


def scan_part(fk: FileKeys, start: int, stop: int, pattern: str, part_bytes: int,
              deadline: float) -> tuple[list[str], int]:
    """Recall over memories ``[start, stop)`` of one file (a worker's job)."""
    mf = MemoryFile.reopen(fk)
    try:
        matcher = compile_pattern(pattern)
        return matcher.scan(itertools.chain.from_iterable(mf.scan(stop, start)), part_bytes, deadline=deadline)
    finally:
        mf.close()


def merge(older: tuple[list[str], int], newer: tuple[list[str], int], part_bytes: int) -> tuple[list[str], int]:
    """One pass's answer from two halves': the newest matches that fit.

    The newer half's kept lines are the longest suffix of its matches that
    fits; only when that is all of them is there room left for the tail of the
    older half's kept lines."""
    (old_kept, old_total), (new_kept, new_total) = older, newer
    total = old_total + new_total
    if len(new_kept) < new_total:
        return new_kept, total
    room = part_bytes - sum(len(line.encode()) + 1 for line in new_kept)
    tail: list[str] = []
    for line in reversed(old_kept):
        cost = len(line.encode()) + 1
        if cost > room:
            break
        tail.append(line)
        room -= cost
    return [*reversed(tail), *new_kept], total


def recall(mf: MemoryFile, matcher: Matcher, pattern: str, part_bytes: int, deadline: float,
           stop: int | None = None) -> tuple[list[str], int]:
    """Recall over memories ``[0, stop)`` (default: the whole log)."""
    T = mf.count() if stop is None else min(stop, mf.count())
    split = (T // 2) // SCAN_BATCH * SCAN_BATCH
    pool = _worker_pool() if T >= PARALLEL_MIN and split else None
    if pool is None or not _worker_free.acquire(blocking=False):
        return matcher.scan(itertools.chain.from_iterable(mf.scan(T)), part_bytes, deadline=deadline)
    try:
        try:
            future = pool.submit(scan_part, mf.file_keys(), 0, split, pattern, part_bytes, deadline)
        except (BrokenProcessPool, RuntimeError):
            _reset_pool()
            return matcher.scan(itertools.chain.from_iterable(mf.scan(T)), part_bytes, deadline=deadline)
        try:
            newer = matcher.scan(itertools.chain.from_iterable(mf.scan(T, split)), part_bytes, deadline=deadline)
        finally:
            try:
                older = future.result()
            except BrokenProcessPool:
                _reset_pool()
                older = None
        if older is None:
            older = matcher.scan(itertools.chain.from_iterable(mf.scan(split)), part_bytes, deadline=deadline)
        return merge(older, newer, part_bytes)
    finally:
        _worker_free.release()


def shutdown_pool() -> None:
    """Stop this process's worker, waiting for a scan it is running."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)


def _reset_pool() -> None:
    global _pool
    with _pool_lock:
        _pool = None
