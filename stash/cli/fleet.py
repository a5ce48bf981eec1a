"""``stash fleet``: the commands of a fleet of hosts sharded by user id, each
working from the placement file (deploy/README.md, the fleet section)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

NICENESS = 10  # how much lower than the shell's a failover's or move's CPU priority is
VERBS = {
    "check": "check a placement file and say who holds what",
    "router": "print the router's Caddyfile generated from a placement (or load it into Caddy)",
    "failover": "give a dead host's shard to a standby, from the shard's replica",
    "move": "move a shard between two live hosts without losing a write",
}


def _placement_arg(p: argparse.ArgumentParser) -> None:
    from ..web.settings import PLACEMENT

    p.add_argument(
        PLACEMENT.flag, required=True, metavar="FILE", help="the fleet's placement file (deploy/placement.example.json)"
    )


def parser() -> argparse.ArgumentParser:
    from ..fleet.router import TLS

    p = argparse.ArgumentParser(
        prog="stash fleet", description="Work on a fleet of Stash hosts sharded by user id, from its placement file."
    )
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    check = verbs.add_parser("check", help=VERBS["check"], description=VERBS["check"] + ".")
    _placement_arg(check)
    router = verbs.add_parser(
        "router",
        help=VERBS["router"],
        description="Print Caddy's configuration (a Caddyfile) for the placement's router, or with --load give "
        "it to the running Caddy at the placement's router admin address.",
    )
    _placement_arg(router)
    router.add_argument(
        "--listen",
        metavar="ADDR",
        help="the address Caddy serves instead of the placement's router site, like :8443 or http://127.0.0.1:8080",
    )
    router.add_argument(
        "--tls",
        choices=TLS,
        default="acme",
        help="acme: certificates from Let's Encrypt for the site (the default); internal: Caddy's own "
        "authority; off: plain http",
    )
    router.add_argument(
        "--load", action="store_true", help="give it to Caddy through its admin API (POST /load) instead of printing it"
    )
    failover = verbs.add_parser(
        "failover",
        help=VERBS["failover"],
        description="Run where the standby's data folder is. Restore the shard's users from its replica into the "
        "standby's data folder, check each as stash verify does, give the standby the shard in the placement file "
        "(one epoch later, replicating under a new path), wait until the standby serves it, and switch the router "
        "through Caddy's admin API. The first users are back before the switch, the others while the shard "
        "serves (--restore-first). Run again, it finishes what a cut run left, or does nothing.",
    )
    _placement_arg(failover)
    failover.add_argument("--shard", required=True, metavar="DIGITS", help="the shard, as the placement writes it: 0-7")
    failover.add_argument(
        "--standby", required=True, metavar="HOST", help="the host that takes it, by its placement name"
    )
    _data_arg(failover, "the standby's")
    _attempts_arg(failover)
    _first_arg(failover)
    move = verbs.add_parser(
        "move",
        help=VERBS["move"],
        description="Run where the receiving host's data folder is. Drain the shard on the host that holds it (its "
        "writes answer 503 until the move ends; reads go on), wait until everything written is in its replica, "
        "restore and check its users here, give this host the shard, and switch the router.",
    )
    _placement_arg(move)
    move.add_argument("--shard", required=True, metavar="DIGITS", help="the shard, as the placement writes it: 8-f")
    move.add_argument("--from", dest="source", required=True, metavar="HOST", help="the host that holds it now")
    move.add_argument("--to", dest="dest", required=True, metavar="HOST", help="the host that takes it")
    _data_arg(move, "the receiving host's")
    _attempts_arg(move)
    _first_arg(move)
    return p


def _data_arg(p: argparse.ArgumentParser, whose: str) -> None:
    from ..web.settings import DATA

    p.add_argument(
        DATA.flag,
        default=os.environ.get(DATA.env_var, DATA.default),
        help=f"{whose} data folder (default: ${DATA.env_var} or {DATA.default})",
    )


def _attempts_arg(p: argparse.ArgumentParser) -> None:
    from ..fleet.failover import ATTEMPTS

    p.add_argument(
        "--attempts",
        type=int,
        default=ATTEMPTS,
        metavar="N",
        help=f"tries of each step that needs the bucket or Caddy before refusing (default {ATTEMPTS})",
    )


def _first(text: str) -> int | None:
    if text == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is neither a whole number from 1 nor all")
    return n


def _first_arg(p: argparse.ArgumentParser) -> None:
    from ..fleet.failover import FIRST, RESTORE_JOBS

    p.add_argument(
        "--restore-first",
        dest="first",
        type=_first,
        default=FIRST,
        metavar="N|all",
        help=f"users restored and checked before the shard is switched (default {FIRST}); the others come back "
        "while it serves, each answered 503 with Retry-After until it is back, a user a request asks for first. "
        "all: every user before the switch",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=RESTORE_JOBS,
        metavar="N",
        help=f"users restored at once (default {RESTORE_JOBS}); each runs Litestream, so about twice this host's cores",
    )


def _give(args: argparse.Namespace) -> int:
    from ..fleet import failover
    from ..fleet.placement import PlacementError

    def say(line: str) -> None:
        print(f"stash fleet {args.verb}: {line}", flush=True)

    data = Path(os.path.expanduser(args.data)).resolve()
    # The restore is CPU-bound (Litestream and a verify per user) and shares the receiving host's cores with its
    # stash serve, which answers the shard's users already back: that serving, and any host on the same machine,
    # goes first.
    os.nice(NICENESS)
    try:
        how = {"attempts": max(1, args.attempts), "first": args.first, "jobs": max(1, args.jobs), "say": say}
        if args.verb == "failover":
            done = failover.failover(Path(args.placement), args.shard, args.standby, data, **how)
        else:
            done = failover.move(Path(args.placement), args.shard, args.source, args.dest, data, **how)
    except (failover.FleetError, PlacementError) as e:
        print(f"stash fleet {args.verb}: {e}.", file=sys.stderr)
        return 1
    if done.already:
        say(f"nothing to do: placement epoch {done.placement.epoch} has it so, and the router routes by it")
    else:
        say(
            f"done in {done.took_s:.1f} s: the shard served after {done.served_s:.1f} s; {len(done.users)} user(s) "
            f"restored and checked in {done.restore_s:.1f} s; placement epoch {done.placement.epoch}"
        )
    return 0


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    from ..fleet import placement, router

    try:
        p = placement.load(args.placement)
    except placement.PlacementError as e:
        print(f"stash fleet: {args.placement}: {e}.", file=sys.stderr)
        return 2
    if args.verb in ("failover", "move"):
        return _give(args)
    if args.verb == "check":
        print(f"placement epoch {p.epoch}, router {p.router.site} (admin {p.router.admin})")
        for host, address in p.hosts.items():
            held = placement.runs(p.held_by(host))
            what = f"digits {', '.join(held)}, replica {p.replica_of(host)}" if held else "standby"
            print(f"  {host} {address}: {what}")
        return 0
    config = router.caddyfile(p, args.listen, args.tls)
    if not args.load:
        sys.stdout.write(config)
        return 0
    try:
        router.load(config, p.router.admin)
    except router.RouterError as e:
        print(f"stash fleet router: {e}", file=sys.stderr)
        return 1
    print(f"stash fleet router: Caddy at {p.router.admin} routes by placement epoch {p.epoch}")
    return 0
