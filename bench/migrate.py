"""How long ``stash migrate --file-cipher none`` takes on one large memory,
and how much of it holds the memory's lock (its requests wait that long).

    python bench/migrate.py --data /tmp/stash-bench/migrate -T 100000

Builds a SQLCipher store once (bench/build.py) beside ``--data``, copies it
for each run, converts it, and prints: the lock-held move (export, compare,
check, commit, rename), the check after (``stash verify --token``), and the
file sizes before and after.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build import build

from stash.service.access import Vault
from stash.service.ops import migrate as migration
from stash.service.ops.verify import verify_user


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("-T", type=int, default=100_000)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    source = args.data / f"built-{args.T}"
    if not source.exists():
        t0 = time.perf_counter()
        built = build(source, args.T)
        (source / "token").write_text(built.token)  # a bench folder of its own, removed with it
        print(f"built T={args.T} in {time.perf_counter() - t0:.1f} s")
    token = (source / "token").read_text()
    for run in range(args.runs):
        data = args.data / f"run{run}"
        shutil.rmtree(data, ignore_errors=True)
        shutil.copytree(source, data, ignore=shutil.ignore_patterns("token"))
        user = next((data / "users").iterdir())
        before = (user / "memory.db").stat().st_size
        with Vault(data).session(token, "read") as s:
            t0 = time.perf_counter()
            note = migration._move(s, wait=5.0)
            moved = time.perf_counter() - t0
        assert note == "", note
        t0 = time.perf_counter()
        report = verify_user(user, token)
        checked = time.perf_counter() - t0
        assert report.ok, report.problems
        after = (user / "memory.db").stat().st_size
        print(
            f"run {run}: T={args.T}: move under the lock {moved:.2f} s, check after {checked:.2f} s; "
            f"memory.db {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB"
        )
        shutil.rmtree(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
