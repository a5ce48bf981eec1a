"""kill -9 trials at random instants of rotate, revoke, erase, forget, batch
nap, import and backup, with one worker (nothing kept open) and with two
(kept-open files), each followed by the same request resent
(tests/invariants/_kill9.py has what each trial checks). Prints how many
trials ran and passed; exits 1 at the first broken promise.

    python bench/kill9.py --trials 5 --seed 1
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.invariants import _kill9
from tests.support.api import CHEAP_KDF_FLAGS
from tests.support.server import start_server


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=5, help="trials per action and setup")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    start = time.monotonic()
    ran = 0
    for case, flags in _kill9.CASES.items():
        tmp = Path(tempfile.mkdtemp(prefix=f"stash-kill9-{case}-"))
        server = start_server(tmp, *flags, *CHEAP_KDF_FLAGS)
        memory = _kill9.Memory(server, random.Random(f"{args.seed}-{case}"), tmp)
        try:
            for _ in range(args.trials):
                for op in _kill9.OPS:
                    memory.trial(op)
                    ran += 1
            memory.settled_and_whole()
        finally:
            memory.close()
            server.stop()
        print(f"{case}: {args.trials} trials of each of {', '.join(_kill9.OPS)}: every promise kept", flush=True)
    print(f"{ran} trials in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
