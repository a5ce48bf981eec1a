"""``stash fleet``: the commands of a fleet of hosts sharded by user id, each
working from the placement file (deploy/README.md, the fleet section)."""

from __future__ import annotations

import argparse
import sys

VERBS = {
    "check": "check a placement file and say who holds what",
    "router": "print the router's Caddyfile generated from a placement (or load it into Caddy)",
}


def _placement_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--placement", required=True, metavar="FILE", help="the fleet's placement file (deploy/placement.example.json)"
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
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    from ..fleet import placement, router

    try:
        p = placement.load(args.placement)
    except placement.PlacementError as e:
        print(f"stash fleet: {args.placement}: {e}.", file=sys.stderr)
        return 2
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
