"""Time the owner operations whose cost issue 10 bounds, on a store of T
memories with every block summarised (bench/build.py): erasing one memory
(docs/DESIGN.md, "Erase": O(log T)), revoking a capability and rotating the owner token
(a revocation is a new key epoch: constant work in the memory file, whose rows
keep the epoch that sealed them; a rotation's is at its new token's first use,
timed apart). Each request's argon2id is included. bench/owner_load.py times
the same actions over HTTP while two agents note. Each is one
whole request through the service layer — token to answer, argon2id included
— timed in process. The wake is timed before and after, so a slower request
path would show.

    python bench/owner_ops.py --data /tmp/stash-bench/owner -T 1000000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build import build

from stash.service.access import Vault
from stash.storage.keyring import now_utc


def timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def wake_median(vault: Vault, token: str, rounds: int = 5) -> float:
    def one() -> None:
        with vault.session(token, "read") as s:
            s.open_memory().wake()

    return statistics.median(timed(one)[0] for _ in range(rounds))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, type=Path)
    p.add_argument("-T", type=int, default=1_000_000)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    built = build(args.data, args.T)
    print(f"built T={args.T} with {built.summaries} summaries in {time.perf_counter() - t0:.0f} s", flush=True)
    vault = Vault(args.data)
    owner = built.token
    print(f"wake (median of 5): {wake_median(vault, owner) * 1000:.1f} ms", flush=True)
    with vault.session(owner, "read") as s:
        mf = s.open_memory().mf
        state = statistics.median(timed(mf.state.digest)[0] for _ in range(9))
    print(f"state head check per open (median of 9): {state * 1000:.2f} ms", flush=True)

    for i in (5, args.T // 2, args.T - 1):

        def erase(i=i) -> dict:
            with vault.session(owner, "owner") as s:
                return s.open_memory().erase([i], now_utc())

        secs, receipt = timed(erase)
        print(f"erase #{i}: {secs * 1000:.1f} ms, {receipt['dropped']} summaries dropped", flush=True)

    with vault.session(owner, "owner") as s:
        gid, _ = vault.mint_grant(s, "read")

    def revoke() -> dict:
        with vault.session(owner, "owner") as s:
            answer = vault.revoke_grant(s, gid)
            vault.finish_epoch(s)  # the re-seal, as the route runs it after the commit
            return answer

    secs, _ = timed(revoke)
    print(
        f"revoke (new epoch; one key chunk re-sealed, {built.summaries} summaries left as they are): {secs:.2f} s",
        flush=True,
    )

    def rotate() -> dict:
        with vault.session(owner, "owner") as s:
            answer = vault.rotate_owner(s)
            vault.finish_epoch(s)
            return answer

    secs, answer = timed(rotate)
    owner = answer["token"]
    print(f"rotate (the answer: the successor filed, no epoch yet): {secs:.2f} s", flush=True)

    def first_use() -> None:
        with vault.session(owner, "read") as s:  # retires the old owner: the new epoch and its re-seal
            s.open_memory().count()

    secs, _ = timed(first_use)
    print(f"the new owner token's first use (the new epoch): {secs:.2f} s", flush=True)
    naps = 0
    while True:  # the erasures' holes, rewritten so the wake is whole again
        with vault.session(owner, "full") as s:
            nap = s.open_memory().nap_for(s.open_memory().mf.count())
            if nap is None:
                break
            s.open_memory().nap(nap["block"], f"rewritten {nap['block']}")
            naps += 1
    print(f"naps until the wake was whole again: {naps}", flush=True)
    print(f"wake after two epochs (median of 5): {wake_median(vault, owner) * 1000:.1f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
