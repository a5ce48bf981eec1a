"""Build a large Stash store quickly, through the core library (no HTTP).

The store is real: an identity minted by :class:`stash.service.access.Vault`,
memories appended by :meth:`MemoryFile.append` (the same path a note or an
import takes, each memory under its own key), and a summary for every complete
block, sealed exactly as :meth:`MemoryFile.put_summary` seals one. Only the
transaction pattern differs from the server: summaries are written tens of
thousands to a transaction instead of one, because a million fsync'd commits
would take hours and would measure nothing the benchmark cares about.

Run alone it prints how long each phase took::

    python bench/build.py --data /tmp/stash-bench/t10k -T 10000

The token is printed only with ``--show-token`` (it is never written to disk).
``bench/run.py`` imports :func:`build` and keeps the token in memory.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from stash.core.blocks import levels
from stash.crypto import aead
from stash.crypto.keys import DEFAULT_KDF, KdfParams, subkey
from stash.service.access import Vault
from stash.storage.formats import PAGE_BYTES

APPEND_BATCH = 10_000
SUMMARY_BATCH = 50_000
PER_DAY = 100  # memories per calendar day, so dates span years at T = 10^6
RARE_EVERY = 10_000  # one memory in this many mentions RARE_WORD: a recall with few hits
RARE_WORD = "Zebra"

_WORDS = (
    "deploy fixed bug user prefers tests pass config database migration release branch reviewed api latency "
    "cache token rotated meeting decided roadmap budget customer asked feature flag rollback incident postmortem "
    "docs updated schema index query slow timeout retry queue worker cron backup restore disk memory cpu alert "
    "dashboard metric log error warning refactor module package dependency upgrade python rust typescript build "
    "ci pipeline green red flaky test coverage benchmark profile agent tool prompt summary context window"
).split()


@dataclass
class Built:
    data_dir: Path
    user_id: str
    T: int
    token: str = field(repr=False)
    # extra capabilities of scope "full", one per argon2id setting, so run.py
    # can time whole requests at several KDF costs against the same store
    kdf_tokens: dict[KdfParams, str] = field(default_factory=dict, repr=False)
    seconds: dict[str, float] = field(default_factory=dict)
    summaries: int = 0

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())


def memory_text(rng: random.Random, i: int) -> str:
    words = rng.choices(_WORDS, k=rng.randint(6, 30))
    if i % RARE_EVERY == RARE_EVERY // 2:
        words.insert(rng.randrange(len(words) + 1), RARE_WORD)
    return f"m{i} " + " ".join(words)


def summary_text(lo: int, hi: int) -> str:
    return f"Summary of {lo}-{hi - 1}: decisions, fixes and preferences from {hi - lo} memories, compressed."


def _dates(T: int) -> tuple[dt.date, int]:
    """First date and memories per day so the newest memory is yesterday."""
    days = -(-T // PER_DAY)
    return dt.date.today() - dt.timedelta(days=days), PER_DAY


def build(
    data_dir: Path,
    T: int,
    *,
    kdf: KdfParams = DEFAULT_KDF,
    kdf_grants: tuple[KdfParams, ...] = (),
    seed: int = 1,
    progress=None,
    page_bytes: int = PAGE_BYTES,
) -> Built:
    """A store of ``T`` memories with every complete block summarised, its
    memory file in pages of ``page_bytes``."""
    data_dir = Path(data_dir)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    vault = Vault(data_dir, kdf, page_bytes=page_bytes)
    ident = vault.create_identity()
    built = Built(data_dir, ident.user_id, T, ident.token, seconds=times)
    with vault.session(ident.token, "owner") as s:
        for params in kdf_grants:
            _, tok = Vault(data_dir, params).mint_grant(s, "full")
            built.kdf_tokens[params] = tok
    times["identity"] = time.perf_counter() - t0

    rng = random.Random(seed)
    start, per_day = _dates(T)
    t0 = time.perf_counter()
    with vault.session(ident.token, "owner") as s:
        mf = s.open_memory().mf
        for base in range(0, T, APPEND_BATCH):
            n = min(APPEND_BATCH, T - base)
            items = [
                ((start + dt.timedelta(days=i // per_day)).isoformat(), memory_text(rng, i))
                for i in range(base, base + n)
            ]
            first = mf.append(items)
            assert first == base, (first, base)
            if progress:
                progress(f"log {base + n}/{T}")
    times["log"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    with vault.session(ident.token, "owner") as s:
        built.summaries = _write_summaries(s.open_memory().mf, subkey(s.chain.current, b"rows"), T, progress)
        s.open_memory().mf.bulk_loaded()
    times["summaries"] = time.perf_counter() - t0
    return built


def _write_summaries(mf, rows_key: bytes, T: int, progress=None) -> int:
    """Every complete block's summary, level by level (each level a dense
    prefix, as the server keeps it), sealed as ``put_summary`` seals one."""
    todo = [(size, idx) for size in levels(T) for idx in range(T // size)]
    version = mf.next_version()  # the version the first nap after the log would write at
    for k in range(0, len(todo), SUMMARY_BATCH):
        rows = []
        for size, idx in todo[k : k + SUMMARY_BATCH]:
            lo = idx * size
            plain = mf.codec.summary_plain(version, summary_text(lo, lo + size), mf.writer)
            rows.append((size, idx, aead.seal(rows_key, plain, mf.codec.aad("summaries", f"{size}|{idx}"))))
        with mf.conn:
            mf.conn.execute("BEGIN IMMEDIATE")
            mf.ensure_table("summaries")
            mf.conn.executemany("INSERT INTO summaries(size, idx, sealed) VALUES (?, ?, ?)", rows)
        if progress:
            progress(f"summaries {min(k + SUMMARY_BATCH, len(todo))}/{len(todo)}")
    return len(todo)


def verify(built: Built) -> None:
    """Read the store back through the service layer: the wake must render
    (it needs summaries at every level) and nothing may be due."""
    vault = Vault(built.data_dir)
    with vault.session(built.token, "read") as s:
        assert s.open_memory().mf.count() == built.T
        assert s.open_memory().nap_for(built.T) is None, "a block is still pending"
        if built.T:
            assert s.open_memory().wake()["awake"] in (True, False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Build a large Stash store through the core library.")
    p.add_argument("--data", required=True, type=Path, help="data folder (created; must not hold this user yet)")
    p.add_argument("-T", type=int, required=True, help="how many memories")
    p.add_argument("--show-token", action="store_true", help="print the owner token (it is not saved anywhere)")
    args = p.parse_args(argv)
    last = [time.monotonic()]

    def progress(msg: str) -> None:
        if time.monotonic() - last[0] >= 5:
            last[0] = time.monotonic()
            print(msg, file=sys.stderr, flush=True)

    built = build(args.data, args.T, progress=progress)
    verify(built)
    size = sum(f.stat().st_size for f in args.data.rglob("*") if f.is_file())
    print(f"user {built.user_id}: T={built.T}, {built.summaries} summaries, {size / 2**20:.0f} MiB on disk")
    for phase, secs in built.seconds.items():
        print(f"  {phase:10s} {secs:8.1f} s")
    print(f"  {'total':10s} {built.total_seconds:8.1f} s")
    if args.show_token:
        print(built.token)
    return 0


if __name__ == "__main__":
    sys.exit(main())
