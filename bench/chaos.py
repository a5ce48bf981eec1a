"""The chaos run of tests/invariants/test_chaos.py for longer: two workers,
kept-open files, note writers, a batch napper, a reader and the owner's loop
(rotate, mint + revoke, erase, forget, backup) on one memory, then every
promise checked. Prints requests, statuses and refusals; exits 1 on any
broken promise (a 5xx included).

    python bench/chaos.py --seconds 60 --seed 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.invariants import _chaos
from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.server import start_server


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--writers", type=int, default=4)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="stash-chaos-"))
    server = start_server(tmp, "--workers", "2", "--keep-open", "5", *CHEAP_KDF_FLAGS)
    try:
        tally, fulls = _chaos.run(server, args.seed, args.seconds, tmp, writers=args.writers)
        problems = _chaos.check(server, tally, fulls)
    finally:
        server.stop()
    fives = sum(n for s, n in tally.statuses.items() if s >= 500)
    print(
        f"{args.seconds:.0f} s, seed {args.seed}: {tally.requests} requests, {len(tally.acked)} notes acknowledged, "
        f"{tally.statuses.get(429, 0)} answered 429, {fives} answered 5xx, {len(tally.backups)} backups"
    )
    print("statuses:", dict(sorted(tally.statuses.items())))
    print("refusals:", dict(tally.refusals.most_common()))
    print("\n".join(problems[:20]) or "every promise kept")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
