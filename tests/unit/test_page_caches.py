"""The page caches of a server process are held to one budget together
(storage/connections.limit_page_caches, issue 27 item 5): many kept connections
that each read a file larger than their own cache grow the process by about
the budget, not by the sum of their caches. Each side runs in a fresh
process, since the limit is process-wide."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from stash.storage.sqlite import connections
from tests.support.installed import OUTSIDE

FILES = 24  # each about 0.75 MiB, more than one connection's CACHE_KIB
LIMIT = 4 * 2**20

PROBE = """
import os, sqlite3, sys
from pathlib import Path
from stash.storage.sqlite import connections
folder, limit = Path(sys.argv[1]), int(sys.argv[2])
def anon():
    for line in open('/proc/self/status'):
        if line.startswith('RssAnon:'):
            return int(line.split()[1]) * 1024
paths = []
for k in range(int(sys.argv[3])):
    p = folder / f'f{k}.db'
    c = sqlite3.connect(p)  # made unsynced: only the reads below are measured
    c.execute('PRAGMA synchronous = OFF')
    c.execute('CREATE TABLE scan_cache (piece INTEGER PRIMARY KEY, sealed BLOB NOT NULL)')  # a table of ours
    c.executemany('INSERT INTO scan_cache(sealed) VALUES (?)', [(os.urandom(3000),) for _ in range(250)])
    c.commit()
    c.close()
    paths.append(p)
if limit:
    connections.limit_page_caches(limit)
before = anon()
kept = [connections.connect(p, file_key=None, cipher='none') for p in paths]
for c in kept:
    c.execute('SELECT sum(length(sealed)) FROM scan_cache').fetchone()
print(anon() - before)
"""


def grown(folder: Path, limit: int) -> int:
    folder.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(folder), str(limit), str(FILES)],
        capture_output=True,
        text=True,
        check=True,
        cwd=OUTSIDE,
    )
    return int(out.stdout.strip())


def test_kept_connections_share_one_page_cache_budget(tmp_path: Path):
    unlimited = grown(tmp_path / "unlimited", 0)
    limited = grown(tmp_path / "limited", LIMIT)
    assert unlimited > FILES * connections.CACHE_KIB * 1024 * 3 // 4  # each cache filled: what the limit is for
    assert limited < LIMIT + 2 * 2**20 < unlimited


def test_a_pool_that_keeps_files_sets_the_limit_and_one_that_keeps_none_does_not(tmp_path: Path):
    script = (
        "import sqlite3, sys; from stash.storage.sqlite import connections; "
        "connections.new_pool(float(sys.argv[1])).close(); "
        "print(sqlite3.connect(':memory:').execute('PRAGMA soft_heap_limit').fetchone()[0])"
    )
    run = [
        subprocess.run(
            [sys.executable, "-c", script, seconds], capture_output=True, text=True, check=True, cwd=OUTSIDE
        ).stdout.strip()
        for seconds in ("5", "0")
    ]
    assert run == [str(connections.HEAP_BYTES), "0"]
