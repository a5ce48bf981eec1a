"""Speed of recall by words against the regex scan for the same words, on one real server.

A store built by bench/build.py (``--data``, built there with ``-T`` when the
folder holds no store yet; its owner token kept beside it in ``owner-token``,
mode 0600, so later runs reuse the store), one ``stash serve`` on it, and
``POST /recall`` timed from a client on the same machine, words and regex
interleaved call by call so that load on the machine falls on both alike:

* ``cold``: the first words search, which builds and seals the word index;
  the first regex recall, which builds the recall cache;
* then ``--runs`` calls of each query, warm: median and p90 wall time.

It also prints the bytes of ``recall.db`` taken by each cache (the sum of its
sealed values, and the file), per memory.

    python bench/words.py --data /tmp/stash-bench/t1m -T 1000000
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import time
from pathlib import Path

import _repo  # noqa: F401  (the repository root on sys.path)
import httpx
from build import build

from tests.support.server import Server

NINE = "deploy green cache token rollback incident postmortem docs query"
TWELVE = NINE + " worker alert budget"

# (words, the regex a careful agent writes for the same words: every order, each word where a word starts)
QUERIES = [
    ("zebra", r"\bzebra"),
    ("deploy green", r"\bdeploy.*\bgreen|\bgreen.*\bdeploy"),
    (
        "rollback incident postmortem",
        "|".join(
            r"\b" + r".*\b".join(order)
            for order in (
                ("rollback", "incident", "postmortem"),
                ("rollback", "postmortem", "incident"),
                ("incident", "rollback", "postmortem"),
                ("incident", "postmortem", "rollback"),
                ("postmortem", "rollback", "incident"),
                ("postmortem", "incident", "rollback"),
            )
        ),
    ),
    ("m123456", r"\bm123456\b"),
    (
        "cach tok rot",
        r"\bcach.*\btok.*\brot|\bcach.*\brot.*\btok|\btok.*\bcach.*\brot|\btok.*\brot.*\bcach|"
        r"\brot.*\bcach.*\btok|\brot.*\btok.*\bcach",
    ),
    # a query word prefixing two words of one memory (test, tests; release, reviewed, restore, …): frequencies
    ("test deploy", r"\btest.*\bdeploy|\bdeploy.*\btest"),
    ("re green", r"\bre.*\bgreen|\bgreen.*\bre"),
    # prefixes of one and two characters (m prefixes a different word m<i> of every memory), and many common
    # words (every order of nine is 362,880 alternatives: the careful regex is then any of the words)
    ("m", r"\bm"),
    ("de", r"\bde"),
    (NINE, r"\b(?:" + "|".join(NINE.split()) + ")"),
    (TWELVE, r"\b(?:" + "|".join(TWELVE.split()) + ")"),
]


def timed(client: httpx.Client, token: str, body: dict) -> tuple[float, dict]:
    t = time.perf_counter()
    r = client.post("/recall", json=body, headers={"Authorization": f"Bearer {token}"})
    took = time.perf_counter() - t
    r.raise_for_status()
    return took, r.json()


def sealed_bytes(db: Path, table: str) -> int:
    with sqlite3.connect(db) as conn:
        try:
            return int(conn.execute(f"SELECT coalesce(sum(length(sealed)), 0) FROM {table}").fetchone()[0])
        except sqlite3.Error:
            return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--data", type=Path, required=True, help="the store's folder (built there when empty)")
    p.add_argument("-T", type=int, default=1_000_000, help="memories, when the store is built")
    p.add_argument("--runs", type=int, default=15)
    args = p.parse_args(argv)
    token_file = args.data / "owner-token"
    if not token_file.exists():
        built = build(args.data / "data", args.T)
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, built.token.encode())
        os.close(fd)
    token = token_file.read_text().strip()
    uid = token[7:23]
    server = Server(args.data / "data", args.data / "server.log", inherit_stash_env=False).start()
    try:
        client = httpx.Client(base_url=server.url, timeout=600)
        T = client.get("/wake", headers={"Authorization": f"Bearer {token}"}).json()["T"]
        print(
            f"T = {T:,}, {args.runs} warm runs of each query, words and regex interleaved, "
            f"{time.strftime('%H:%M', time.gmtime())} UTC, load average {os.getloadavg()[0]:.1f}\n"
        )
        cold = {}
        for kind, body in (("words", {"words": "cold start"}), ("regex", {"q": "cold start"})):
            t, tries = time.perf_counter(), 0
            while True:  # a cold cache may take more than one call's time bound: each call keeps what it built
                tries += 1
                r = client.post("/recall", json=body, headers={"Authorization": f"Bearer {token}"})
                if r.status_code == 200:
                    break
                assert r.json()["error"] == "recall.too_slow", r.text
            cold[kind] = f"{time.perf_counter() - t:.1f} s in {tries} call{'s' if tries > 1 else ''}"
        print(f"cold (builds the cache): words {cold['words']}, regex {cold['regex']}\n")
        print("| words | regex | matches (words / regex) | words median (p90) | regex median (p90) | words / regex |")
        print("|---|---|---|---|---|---|")
        for words, regex in QUERIES:
            tw, tr = [], []
            for _ in range(args.runs):
                a, aw = timed(client, token, {"words": words})
                b, ar = timed(client, token, {"q": regex})
                tw.append(a)
                tr.append(b)
            mw, mr = statistics.median(tw), statistics.median(tr)
            p90 = lambda xs: sorted(xs)[int(0.9 * (len(xs) - 1))]  # noqa: E731
            print(
                f"| `{words}` | `{regex[:40]}{'…' if len(regex) > 40 else ''}` | {aw['total']:,} / {ar['total']:,} "
                f"| {mw * 1000:.0f} ms ({p90(tw) * 1000:.0f}) | {mr * 1000:.0f} ms ({p90(tr) * 1000:.0f}) "
                f"| {mw / mr:.2f} |"
            )
        print(f"\n{time.strftime('%H:%M', time.gmtime())} UTC, load average {os.getloadavg()[0]:.1f}")
    finally:
        server.stop()
    db = args.data / "data" / "users" / uid / "recall.db"
    if db.exists():
        print(
            f"\nrecall.db {db.stat().st_size / T:.1f} B/memory on disk; sealed values: recall cache "
            f"{sealed_bytes(db, 'scan_cache') / T:.1f}, word index {sealed_bytes(db, 'word_segs') / T:.1f} + "
            f"tail {sealed_bytes(db, 'word_tail_segs') / T:.2f} B/memory (in segments; whole pieces of an "
            f"older server: {(sealed_bytes(db, 'word_cache') + sealed_bytes(db, 'word_tail')) / T:.1f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
