"""Where the bytes of a store go: per file, per table, per memory.

    python bench/disk.py bench/results/store-1000000     # a store built by versus.py
    python bench/disk.py --empty                         # a freshly minted identity

For a store it opens the memory file with the owner token kept beside it
(``owner-token``), and for every table counts rows and the bytes of their
stored values; the rest of each file is SQLite's (page headers, B-tree
interior pages, free space in pages). Nothing is written.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import sys
import tempfile
from pathlib import Path

from stash.service.access import Vault
from stash.storage.scancache import CACHE_FILE

MEMORY_TABLES = {
    "log": "SELECT COUNT(*), COALESCE(SUM(length(sealed)), 0) FROM log",
    "memory_keys": "SELECT COUNT(*), COALESCE(SUM(length(sealed)), 0) FROM memory_keys",
    "summaries": "SELECT COUNT(*), COALESCE(SUM(length(sealed)), 0) FROM summaries",
    "config": "SELECT COUNT(*), COALESCE(SUM(length(sealed)), 0) FROM config",
    "erased": "SELECT COUNT(*), COALESCE(SUM(length(sealed)), 0) FROM erased",
    "erasures": "SELECT COUNT(*), COALESCE(SUM(length(sealed)), 0) FROM erasures",
    "idempotency": "SELECT COUNT(*), COALESCE(SUM(length(sealed) + length(lookup) + length(fingerprint) + 8), 0) "
                   "FROM idempotency",
    "meta": "SELECT COUNT(*), COALESCE(SUM(length(name) + length(value)), 0) FROM meta",
}


def pages(conn) -> tuple[int, int, int]:
    return tuple(int(conn.execute(f"PRAGMA {p}").fetchone()[0]) for p in ("page_size", "page_count", "freelist_count"))


def account(data: Path, token: str) -> str:
    vault = Vault(data)
    out = []
    with vault.session(token, "read") as s:
        mf = s.memory.mf
        T = mf.count()
        folder = mf.file_keys().path.parent
        size, count, free = pages(mf.conn)
        out += [f"T = {T:,}. Bytes per memory are over T.", "",
                "| file / table | rows | stored bytes | bytes per memory |", "|---|---:|---:|---:|"]
        mem_bytes = (folder / "memory.db").stat().st_size
        out.append(f"| memory.db (SQLCipher; {size // 1024} KiB pages, {count:,} pages, {free} free) | | "
                   f"{mem_bytes:,} | {mem_bytes / max(T, 1):.1f} |")
        payload = 0
        have = {r[0] for r in mf.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table, sql in MEMORY_TABLES.items():
            if table not in have:  # older files lack some tables
                continue
            n, b = mf.conn.execute(sql).fetchone()
            payload += b
            out.append(f"| · {table} | {n:,} | {b:,} | {b / max(T, 1):.1f} |")
        freed = free * size
        over = mem_bytes - payload - freed
        out.append(f"| · SQLite and SQLCipher (page headers and reserve, B-tree keys and interior pages, "
                   f"slack) | | {over:,} | {over / max(T, 1):.1f} |")
        if freed:
            out.append(f"| · free pages (reused by later writes; `VACUUM` returns them) | | {freed:,} | "
                       f"{freed / max(T, 1):.1f} |")
    ring = folder / "keyring.db"
    with contextlib.closing(sqlite3.connect(ring)) as conn:
        size, count, free = pages(conn)
    out.append(f"| keyring.db (plain SQLite; {size // 1024} KiB pages, {count} pages) | | "
               f"{ring.stat().st_size:,} | {ring.stat().st_size / max(T, 1):.1f} |")
    cache = folder / CACHE_FILE
    if cache.exists():
        with contextlib.closing(sqlite3.connect(cache)) as conn:
            size, count, free = pages(conn)
            n, b = conn.execute("SELECT COUNT(*), COALESCE(SUM(length(sealed)), 0) FROM scan_cache").fetchone()
        out.append(f"| {CACHE_FILE} (recall cache, plain SQLite; {size // 1024} KiB pages) | {n:,} pieces | "
                   f"{cache.stat().st_size:,} | {cache.stat().st_size / max(T, 1):.1f} |")
    total = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    out.append(f"| **the user's folder** | | **{total:,}** | **{total / max(T, 1):.1f}** |")
    if freed:
        out.append(f"| **the user's folder without free pages** | | **{total - freed:,}** | "
                   f"**{(total - freed) / max(T, 1):.1f}** |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Where a store's bytes go.")
    p.add_argument("store", nargs="?", type=Path, help="a folder holding data/ and owner-token (bench/versus.py)")
    p.add_argument("--empty", action="store_true", help="account a freshly minted identity instead")
    args = p.parse_args(argv)
    if args.empty:
        with tempfile.TemporaryDirectory() as tmp:
            vault = Vault(Path(tmp))
            ident = vault.create_identity()
            print(account(Path(tmp), ident.token))
        return 0
    if args.store is None:
        p.error("name a store folder or give --empty")
    print(account(args.store / "data", (args.store / "owner-token").read_text().strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
