"""The ``stash`` command: ``serve`` runs the server, ``backup``, ``verify``,
``replicate``, ``restore``, ``migrate`` and ``compact`` work on its data folder;
``fleet`` works from a fleet's placement file;
``mcp`` serves the agent's verbs to an MCP host over stdio; every other verb is the HTTP client
(:mod:`stash.client`, also served as one file at ``GET /client``)."""

from __future__ import annotations

import sys

# The verbs that are not the HTTP client: they run beside a server or an agent
# host and need the whole package, so the one-file client never carries them.
HOST_VERBS = {
    "serve": "run the Stash server",
    "backup": "copy every user's files of a data folder while the server runs",
    "verify": "check every file of a data folder or a backup",
    "replicate": "stream a data folder to a replica off the host with Litestream",
    "restore": "bring users back from a replica, each at a moment its files agree",
    "migrate": "convert a data folder's SQLCipher files to plain ones (every row stays sealed)",
    "compact": "re-seal the summaries of earlier releases to their buckets and rewrite each memory file smaller",
    "mcp": "serve wake, note, nap, recall, zoom and forget as MCP tools over stdio",
    "fleet": "a fleet of hosts sharded by user id: check its placement, generate its router",
}


def main(argv: list[str] | None = None) -> int:
    """Every verb; a reader of its output that stops reading (``| head``)
    ends it quietly (:func:`stash.client.closed_pipe`)."""
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except BrokenPipeError:
        from ..client import closed_pipe

        return closed_pipe()


def _main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        from .serve import main as serve

        return serve(argv[1:])
    if argv[:1] == ["mcp"]:
        from .mcp_server import main as mcp

        return mcp(argv[1:])
    if argv[:1] == ["fleet"]:
        from .fleet import main as fleet

        return fleet(argv[1:])
    if argv[:1] == ["backup"]:
        from .operate import backup_main

        return backup_main(argv[1:])
    if argv[:1] == ["replicate"]:
        from .replicate import replicate_main

        return replicate_main(argv[1:])
    if argv[:1] == ["restore"]:
        from .replicate import restore_main

        return restore_main(argv[1:])
    if argv[:1] == ["migrate"]:
        from .operate import migrate_main

        return migrate_main(argv[1:])
    if argv[:1] == ["compact"]:
        from .operate import compact_main

        return compact_main(argv[1:])
    if argv[:1] == ["verify"]:
        from .operate import verify_main

        return verify_main(argv[1:])
    from .. import client

    if argv[:1] in (["-h"], ["--help"]):
        try:
            client.main(argv)
        except SystemExit:  # argparse's help ends with exit(0); the host verbs follow it
            pass
        print("\nverbs that run beside a server or an agent host (the installed package only):")
        for verb, meaning in HOST_VERBS.items():
            print(f"  {verb:<10} {meaning}")
        return 0
    return client.main(argv)


if __name__ == "__main__":
    sys.exit(main())
