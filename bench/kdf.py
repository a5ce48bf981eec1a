"""argon2id alone, at the settings SECURITY.md weighs, beside the lookup tag.

    python bench/kdf.py

Prints the best of 20 derivations per setting (one 32-byte secret, one salt),
and what one guess against a grant's lookup tag costs (keyed BLAKE2b, the
check a key ring thief can run without argon2).
"""

from __future__ import annotations

import os
import time

from stash.crypto import keys, tokens

SETTINGS = [(1, 8), (1, 64), (1, 256), (1, 1024), (1, 4096), (1, 8192), (2, 8192)]


def best(fn, rounds: int) -> float:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def main() -> None:
    secret, salt = os.urandom(32), os.urandom(16)
    default = keys.DEFAULT_KDF
    print("| argon2id (p = 1) | best of 20 |")
    print("|---|---:|")
    for t, m in SETTINGS:
        p = keys.KdfParams(t, m, 1)
        mark = " (default)" if p == default else ""
        print(f"| t={t}, m={m} KiB{mark} | {best(lambda p=p: keys.derive_kek(secret, salt, p), 20) * 1e3:.3f} ms |")
    uid = tokens.new_user_id()
    n = 100_000
    t0 = time.perf_counter()
    for _ in range(n):
        tokens.lookup_tag(uid, secret)
    print(f"| lookup tag (keyed BLAKE2b), one guess | {(time.perf_counter() - t0) / n * 1e3:.4f} ms |")


if __name__ == "__main__":
    main()
