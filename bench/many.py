"""Many users on one host: a wake of a random identity among N, against a
server that holds one.

    python bench/many.py --users 10000 --memories 128

Builds (once, cached under ``bench/results/many-<N>-<M>/``, git ignored) a
data folder of N real identities, each minted by ``Vault.create_identity`` at
the default argon2id cost with M memories appended and every summary written
as ``bench/build.py`` writes them, and a second data folder holding one identity built
the same way. The owner tokens are kept in ``tokens`` (mode 0600) beside the
folders, since later runs reuse them. Then it starts ``stash serve`` on each
folder and sends ``GET /wake`` from one keep-alive client, alternating: the
many-user server for a random identity each time, the one-user server for its
only one. While it runs it samples each server's open file descriptors and
resident memory (``/proc``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

import _repo  # noqa: F401  (the repository root on sys.path)
import httpx
from build import _write_summaries
from run import serve

from stash.crypto.keys import subkey
from stash.service.access import Vault

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def populate(data: Path, users: int, memories: int) -> list[str]:
    vault = Vault(data)
    out = []
    for k in range(users):
        ident = vault.create_identity()
        with vault.session(ident.token, "owner") as s:
            s.open_memory().mf.append(
                [("2026-11-01", f"user {k} memory {i}: prefers tea, deploys on fridays") for i in range(memories)]
            )
            # as build.py writes them: the current epoch's row key, then the state head sealed over the rows
            _write_summaries(s.open_memory().mf, subkey(s.chain.current, b"rows"), memories)
            s.open_memory().mf.bulk_loaded()
        out.append(ident.token)
        if k % 500 == 499:
            log(f"{k + 1}/{users} identities")
    return out


def prepared(users: int, memories: int, fresh: bool) -> tuple[Path, list[str], Path, str]:
    root = RESULTS / f"many-{users}-{memories}"
    if fresh:
        shutil.rmtree(root, ignore_errors=True)
    tok_file = root / "tokens"
    if not tok_file.exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        log(f"minting {users:,} identities of {memories} memories each")
        many = populate(root / "many", users, memories)
        one = populate(root / "one", 1, memories)
        fd = os.open(tok_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(one + many) + "\n")
    toks = tok_file.read_text().split()
    return root / "many", toks[1:], root / "one", toks[0]


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def du(path: Path) -> int:
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description="A wake of a random identity among many, against a one-user server.")
    p.add_argument("--users", type=int, default=10_000)
    p.add_argument("--memories", type=int, default=128)
    p.add_argument("--rounds", type=int, default=1000)
    p.add_argument("--fresh", action="store_true")
    p.add_argument(
        "--keep-open",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stash serve --keep-open for both servers (default: the server's default)",
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    many_dir, many_toks, one_dir, one_tok = prepared(args.users, args.memories, args.fresh)
    tmp = RESULTS / "many-logs"
    tmp.mkdir(parents=True, exist_ok=True)
    extra = () if args.keep_open is None else ("--keep-open", f"{args.keep_open:g}")
    a, b = serve(one_dir, tmp / "one.log", extra=extra), serve(many_dir, tmp / "many.log", extra=extra)
    times: dict[str, list[float]] = {"one": [], "many": []}
    peak = {"one": [0, 0], "many": [0, 0]}
    rss0 = {"one": rss(a.proc.pid), "many": rss(b.proc.pid)}
    rng = random.Random(7)
    try:
        with httpx.Client(base_url=a.url, trust_env=False) as ca, httpx.Client(base_url=b.url, trust_env=False) as cb:
            for k in range(args.rounds + 20):
                for name, client, tok in (("one", ca, one_tok), ("many", cb, rng.choice(many_toks))):
                    t0 = time.perf_counter()
                    client.get("/wake", headers={"Authorization": f"Bearer {tok}"}).raise_for_status()
                    if k >= 20:  # the first rounds warm both servers up
                        times[name].append(time.perf_counter() - t0)
                if k % 50 == 0:
                    for name, srv in (("one", a), ("many", b)):
                        peak[name][0] = max(peak[name][0], fds(srv.proc.pid))
                        peak[name][1] = max(peak[name][1], rss(srv.proc.pid))
    finally:
        a.stop()
        b.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    p95 = {k: sorted(v)[int(0.95 * len(v))] for k, v in times.items()}
    text = "\n".join(
        [
            f"# Many users on one host, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
            "",
            f"Command: `python bench/many.py {' '.join(argv)}`. {len(many_toks):,} identities of {args.memories} "
            f"memories (every summary written) in one data folder ({du(many_dir) / 2**30:.2f} GiB, "
            f"{du(many_dir) / len(many_toks) / 1024:.0f} KiB each), against one such identity alone. "
            f"{args.rounds} `GET /wake` each, alternating, one keep-alive httpx client per server; "
            f"`--keep-open {'default (5)' if args.keep_open is None else f'{args.keep_open:g}'}`; load "
            f"{os.getloadavg()[0]:.2f} at the end.",
            "",
            "| server | wake median | wake p95 | open fds (peak) | RSS at start → peak |",
            "|---|---:|---:|---:|---:|",
            *(
                f"| {name} ({'1 identity' if name == 'one' else f'{len(many_toks):,} identities, a random one'}) | "
                f"{med[name] * 1e3:.2f} ms | {p95[name] * 1e3:.2f} ms | {peak[name][0]} | "
                f"{rss0[name] / 2**20:.1f} → {peak[name][1] / 2**20:.1f} MiB |"
                for name in ("one", "many")
            ),
            "",
            f"Ratio many / one: median {med['many'] / med['one']:.2f}×, p95 {p95['many'] / p95['one']:.2f}×.",
            "",
        ]
    )
    print(text)
    out = args.out or RESULTS / f"{dt.date.today().isoformat()}-many.md"
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
