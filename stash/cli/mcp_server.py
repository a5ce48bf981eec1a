"""``stash mcp``: a Model Context Protocol server over stdio whose tools are
the agent's verbs — wake, note, nap, recall, zoom, forget — against the Stash
server named by ``STASH_URL`` and ``STASH_TOKEN``.

It is a thin skin over the library (:class:`stash.client.Stash`): its calls,
and the same text the ``stash`` client prints of their answers, except that
every next step is named as a tool call instead of a shell command. The tools are defined once, in
:mod:`stash.tools.definitions`, and served by the same server as ``POST /mcp`` (:mod:`stash.tools.server`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .. import client
from ..tools.definitions import Backend

# The mcp extra's own requirement (pyproject.toml), so the line works as printed whatever way Stash was
# installed: the package is not on the public index.
INSTALL = "pip install 'mcp>=2.3,<3'"


class Library:
    """The tools' host over stdio: each request through the client library
    (its retries, Idempotency-Keys and pins), in a worker thread; the scope
    is not known here, so every tool is listed and the server refuses what
    the capability may not do."""

    def __init__(self, mem: client.Stash) -> None:
        self.mem = mem

    def backend(self, ctx: Any) -> Backend:
        import anyio.to_thread

        async def answer(method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
            return await anyio.to_thread.run_sync(self.mem.request, method, path, body)

        return answer

    async def scope(self, ctx: Any) -> str | None:
        return None


def serve(mem: client.Stash) -> None:
    """Serve the tools over stdio until the host closes it. The SDK is imported
    here: the imports take about a second and a half, and a host that starts
    the server without its variables should hear so at once (:func:`main`)."""
    import anyio
    from mcp.server.stdio import stdio_server

    from ..tools.server import build

    server = build(Library(mem))

    async def run() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(run)


def _has_mcp() -> bool:
    try:
        import mcp  # noqa: F401 - only whether it imports
    except ImportError:
        return False
    return True


def parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="stash mcp",
        description="Serve wake, note, nap, recall, zoom and forget as Model Context Protocol tools over stdio, "
        "against the Stash server named by STASH_URL, with the capability in STASH_TOKEN.",
        epilog=f"Needs the mcp extra: {INSTALL}",
    )


def main(argv: list[str]) -> int:
    parser().parse_args(argv)
    try:
        # Read once, as the client reads them, so a host that starts us without them fails at once.
        mem = client.command_memory(client.server_url(), client.token(), "STASH_URL")
    except client.Failure as f:
        print(f.message, file=sys.stderr)
        return f.code
    if not _has_mcp():
        print(f"stash mcp: the mcp package is not installed; install it with: {INSTALL}", file=sys.stderr)
        return 2
    serve(mem)
    return 0
