"""Where the bytes of a store go: per file, per table, per memory.

    python bench/disk.py bench/results/store-1000000     # a store built by versus.py
    python bench/disk.py --empty                         # a freshly minted identity
    python bench/disk.py --written 1000                  # an identity written as the server writes it
    python bench/disk.py --extra 3                       # what each extra empty memory adds

For a store it opens the memory file with the owner token kept beside it
(``owner-token``), and for every table counts rows and the bytes of their
stored values; the rest of each file is SQLite's (page headers, B-tree
interior pages, free space in pages). File sizes are taken before the token is
used: the one write a request makes (the grant's last-used day, a first use
of which makes the key ring's grant_notes table) is not counted. With
``--empty`` it also says what each page of the two files holds. With
``--written N`` it mints an identity and writes N memories the way the server
does — each note in its own transaction, then every nap it brings due, each
in its own — and accounts that folder, with what ``HOSTED`` such identities
would take. With ``--extra N`` it mints an identity through the app (in
process, real files), uses its owner token once, then creates, lists and
wakes N empty memories one after another, and prints what each added to the
identity's files, file by file, a folder counted as one 4 KiB block (issue
28: at most 32 KiB each, the first included).
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import sys
import tempfile
from pathlib import Path

from stash.crypto import tokens
from stash.service.access import Vault
from stash.storage.layout import UserFiles
from stash.storage.recallcache.rendered_log import CACHE_FILE

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


def page_map(conn) -> dict[int, str]:
    """What each page whose number the schema names holds: page 1 the schema,
    then each table's and index's root page. In an empty file every table is
    its root page alone, so this is every page."""
    out = {1: "the schema (sqlite_master)"}
    for kind, name, root in conn.execute("SELECT type, name, rootpage FROM sqlite_master WHERE rootpage > 0"):
        out[int(root)] = f"{kind} {name}"
    return dict(sorted(out.items()))


def page_table(ring_map: dict[int, str], mem_map: dict[int, str], page_bytes: dict[str, int]) -> list[str]:
    out = ["", "| page | keyring.db | memory.db |", "|---:|---|---|"]
    for n in range(1, max(len(ring_map), len(mem_map)) + 1):
        out.append(f"| {n} | {ring_map.get(n, '')} | {mem_map.get(n, '')} |")
    total = sum(page_bytes.values())
    out.append(f"| **bytes** | {page_bytes['keyring.db']:,} | {page_bytes['memory.db']:,} |")
    out.append("")
    out.append(f"Pages in all: {len(ring_map) + len(mem_map)}, {total:,} bytes.")
    return out


def account(data: Path, token: str, *, map_pages: bool = False) -> str:
    vault = Vault(data)
    out = []
    parsed = tokens.parse(token)
    if parsed is None:
        raise SystemExit("the owner token is malformed")
    folder = data / "users" / parsed.user_id
    # Taken before the session: opening it records the grant's last use.
    sizes = {f.name: f.stat().st_size for f in folder.iterdir() if f.is_file()}
    ring = folder / "keyring.db"
    with contextlib.closing(sqlite3.connect(ring)) as conn:
        ring_pages = pages(conn)
        ring_map = page_map(conn)
    with vault.session(token, "read") as s:
        mf = s.open_memory().mf
        T = mf.count()
        size, count, free = pages(mf.conn)
        mem_map = page_map(mf.conn)
        out += [
            f"T = {T:,}. Bytes per memory are over T.",
            "",
            "| file / table | rows | stored bytes | bytes per memory |",
            "|---|---:|---:|---:|",
        ]
        mem_bytes = sizes["memory.db"]
        out.append(
            f"| memory.db (SQLCipher; {size // 1024} KiB pages, {count:,} pages, {free} free) | | "
            f"{mem_bytes:,} | {mem_bytes / max(T, 1):.1f} |"
        )
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
        out.append(
            f"| · SQLite and SQLCipher (page headers and reserve, B-tree keys and interior pages, "
            f"slack) | | {over:,} | {over / max(T, 1):.1f} |"
        )
        if freed:
            out.append(
                f"| · free pages (reused by later writes; `VACUUM` returns them) | | {freed:,} | "
                f"{freed / max(T, 1):.1f} |"
            )
    size, count, _ = ring_pages
    out.append(
        f"| keyring.db (plain SQLite; {size // 1024} KiB pages, {count} pages) | | "
        f"{sizes['keyring.db']:,} | {sizes['keyring.db'] / max(T, 1):.1f} |"
    )
    cache = folder / CACHE_FILE
    if cache.exists():
        with contextlib.closing(sqlite3.connect(cache)) as conn:
            size, count, free = pages(conn)
            n, b = conn.execute("SELECT COUNT(*), COALESCE(SUM(length(sealed)), 0) FROM scan_cache").fetchone()
        out.append(
            f"| {CACHE_FILE} (recall cache, plain SQLite; {size // 1024} KiB pages) | {n:,} pieces | "
            f"{cache.stat().st_size:,} | {cache.stat().st_size / max(T, 1):.1f} |"
        )
    total = sum(sizes.values())
    out.append(f"| **the user's folder** | | **{total:,}** | **{total / max(T, 1):.1f}** |")
    if freed:
        out.append(
            f"| **the user's folder without free pages** | | **{total - freed:,}** | "
            f"**{(total - freed) / max(T, 1):.1f}** |"
        )
    others = sorted(name for name in sizes if name not in ("memory.db", "keyring.db", CACHE_FILE))
    if others:
        out.append("")
        out.append("Also in the folder: " + ", ".join(f"{name} ({sizes[name]:,} bytes)" for name in others) + ".")
    if map_pages:
        out += page_table(ring_map, mem_map, {n: sizes[n] for n in ("keyring.db", "memory.db")})
    return "\n".join(out) + "\n"


HOSTED = 10_000
WORDS = "deploy fixed bug user prefers tests pass config database migration release branch reviewed".split()


def written(data: Path, n: int) -> str:
    """An identity of ``n`` memories written note by note and nap by nap, as
    ``POST /note`` and ``POST /nap`` write them (no HTTP, no idempotency
    records), accounted; and ``HOSTED`` of them."""
    vault = Vault(data)
    ident = vault.create_identity()
    for i in range(n):
        with vault.session(ident.token, "full") as s:
            nap = s.open_memory().note(f"memory {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(8)))["nap"]
        while nap is not None:
            with vault.session(ident.token, "full") as s:
                nap = s.open_memory().nap(nap["block"], f"summary of {nap['block']}: what lasted", None, None)["nap"]
    text = account(data, ident.token)
    folder = UserFiles(data, ident.user_id).folder
    total = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    return text + (
        f"\n{HOSTED:,} such identities: {HOSTED * total / 1e9:.2f} GB "
        f"({total:,} bytes each, {total / n:.1f} per memory).\n"
    )


FOLDER_BYTES = 4096  # a folder, counted as one block


def extra(data: Path, n: int) -> str:
    """What each of ``n`` extra empty memories adds to an identity's files
    once created, listed and woken by its owner (the owner token used once
    before: that first request records its last use, a page of main's key
    ring, whatever it asks for)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from stash.crypto.keys import KdfParams
    from stash.web.app import create_app
    from tests.support.api import Api, make_settings

    def sizes(folder: Path) -> dict[str, int]:
        return {
            p.relative_to(folder).as_posix() + ("/" if p.is_dir() else ""): p.stat().st_size
            if p.is_file()
            else FOLDER_BYTES
            for p in folder.rglob("*")
        }

    api = Api(create_app(make_settings(data, kdf=KdfParams(1, 8, 1), max_memories=n + 1)))
    out = ["| memory | bytes added | what |", "|---|---:|---|"]
    try:
        made = api.init()
        owner, folder = made["token"], data / "users" / made["user_id"]
        assert api.get("/wake", owner).status_code == 200
        for k in range(n):
            name = f"extra{k + 1}"
            before = sizes(folder)
            assert api.post("/memories", owner, json={"name": name}).status_code == 201
            assert api.get("/memories", owner).status_code == 200
            assert api.get(f"/m/{name}/wake", owner).status_code == 200
            after = sizes(folder)
            grown = {p: b - before.get(p, 0) for p, b in after.items() if b != before.get(p, 0)}
            what = ", ".join(f"{p} {b:,}" for p, b in sorted(grown.items()))
            out.append(f"| {k + 1}: {name} | {sum(grown.values()):,} | {what} |")
    finally:
        api.close()
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Where a store's bytes go.")
    p.add_argument("store", nargs="?", type=Path, help="a folder holding data/ and owner-token (bench/versus.py)")
    p.add_argument("--empty", action="store_true", help="account a freshly minted identity instead")
    p.add_argument(
        "--written",
        type=int,
        metavar="N",
        help="account an identity of N memories written as the server writes them, and what 10,000 of them take",
    )
    p.add_argument(
        "--extra", type=int, metavar="N", help="what each of N extra empty memories adds to an identity's files"
    )
    args = p.parse_args(argv)
    if args.extra:
        with tempfile.TemporaryDirectory() as tmp:
            print(extra(Path(tmp), args.extra))
        return 0
    if args.written:
        with tempfile.TemporaryDirectory() as tmp:
            print(written(Path(tmp), args.written))
        return 0
    if args.empty:
        with tempfile.TemporaryDirectory() as tmp:
            vault = Vault(Path(tmp))
            ident = vault.create_identity()
            folder = Path(tmp) / "users" / ident.user_id
            files = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())  # before the token's first use
            print(account(Path(tmp), ident.token, map_pages=True))
            print(f"With the folder itself as one {FOLDER_BYTES:,}-byte block: {files + FOLDER_BYTES:,} bytes.")
        return 0
    if args.store is None:
        p.error("name a store folder or give --empty")
    print(account(args.store / "data", (args.store / "owner-token").read_text().strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
