"""One MCP session against a real server, driven by the MCP SDK's own
client: over stdio with a fresh ``python -m stash mcp`` child, or over
Streamable HTTP with a server's ``/mcp``; each tool answer as (text,
is_error), and the next step a tool names called exactly as named. Shared
by the MCP and batch-client end-to-end tests."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from tests.support.installed import OUTSIDE

REQUEST_TIMEOUT = 60.0  # one tool call
SESSION_TIMEOUT = 180.0  # a whole session: spawn, handshake, calls, exit
_CALL = re.compile(r"Call: (\w+)\((.*)\)")
_ARG = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\d+)(?:, |$)')


def text_blocks(res: CallToolResult) -> list[TextContent]:
    """The blocks of an answer, each checked to be text (Stash answers no other kind)."""
    assert all(isinstance(block, TextContent) for block in res.content), res.content
    return [block for block in res.content if isinstance(block, TextContent)]


class Session:
    """One MCP session with a fresh ``python -m stash mcp`` child: every tool
    answer as (text, is_error)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def call(self, tool: str, **args: object) -> tuple[str, bool]:
        """The answer's text, its blocks joined (memory blocks among the tool's own), and whether it is a
        refusal; every block is text, and a memory block holds memory text only (checked by the caller)."""
        res = await self.result(tool, **args)
        return "\n".join(block.text for block in text_blocks(res)), bool(res.is_error)

    async def result(self, tool: str, **args: object) -> CallToolResult:
        res = await self.client.call_tool(tool, args)
        assert res.content and all(block.type == "text" for block in res.content), res
        return res

    async def ok(self, tool: str, **args: object) -> str:
        text, error = await self.call(tool, **args)
        assert not error, (tool, args, text)
        return text

    async def follow(self, text: str, **fill: str) -> str:
        """Call the step the first ``Call: tool(...)`` line of ``text`` names
        (an answer's orders come in the order to follow them), its
        placeholders (``<your line>``) filled in."""
        name, args = call_line(text)
        for key, value in args.items():
            for placeholder, filling in fill.items():
                if isinstance(value, str):
                    value = value.replace(f"<{placeholder.replace('_', ' ')}>", filling)
            assert not (isinstance(value, str) and "<" in value), (name, args)
            args[key] = value
        return await self.ok(name, **args)


def call_line(text: str) -> tuple[str, dict]:
    lines = [line for line in text.splitlines() if line.startswith("Call: ")]
    assert lines, text
    m = _CALL.search(lines[0])
    assert m, lines[0]
    args = {k: json.loads(v) for k, v in _ARG.findall(m.group(2))}
    assert ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items()) == m.group(2), lines[0]
    return m.group(1), args


def run_session(
    base_url: str,
    tok: str,
    errlog: Path,
    script: Callable[[Session], Awaitable[None]],
    mode: str = "auto",
    pins: str | None = None,
) -> None:
    """Spawn ``python -m stash mcp`` with the two variables, connect the SDK's
    stdio client to it, and run ``script``; the child's stderr goes to ``errlog``.
    Its pins (stash/client.py) go to ``pins``, else to this test run's file."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "stash", "mcp"],
        cwd=str(OUTSIDE),
        env={
            "STASH_URL": base_url,
            "STASH_TOKEN": tok,
            "PYTHONUNBUFFERED": "1",
            "STASH_PINS": pins or os.environ["STASH_PINS"],
        },
    )

    async def main() -> None:
        with anyio.fail_after(SESSION_TIMEOUT), open(errlog, "w", encoding="utf-8") as err:
            async with Client(
                stdio_client(params, errlog=err), read_timeout_seconds=REQUEST_TIMEOUT, mode=mode
            ) as client:
                await script(Session(client))

    anyio.run(main)


def run_http_session(
    endpoint: str,
    tok: str | None,
    script: Callable[[Session], Awaitable[None]],
    mode: str = "auto",
    fresh_connections: bool = False,
    headers: dict[str, str] | None = None,
) -> None:
    """Connect the SDK's own Streamable HTTP client to ``endpoint`` (a server's
    /mcp) with ``tok`` as the bearer, and run ``script``. ``fresh_connections``:
    every request on a connection of its own, so any worker may take each;
    ``headers`` go with every request (a Host, an Origin)."""
    limits = httpx2.Limits(max_keepalive_connections=0) if fresh_connections else httpx2.Limits()
    headers = {**(headers or {}), **({} if tok is None else {"Authorization": f"Bearer {tok}"})}

    async def main() -> None:
        with anyio.fail_after(SESSION_TIMEOUT):
            async with httpx2.AsyncClient(
                headers=headers, limits=limits, timeout=httpx2.Timeout(REQUEST_TIMEOUT)
            ) as http:
                async with Client(
                    streamable_http_client(endpoint, http_client=http), read_timeout_seconds=REQUEST_TIMEOUT, mode=mode
                ) as client:
                    await script(Session(client))

    anyio.run(main)
