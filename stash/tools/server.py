"""The MCP server of the agent's tools, built on the ``mcp`` SDK's low-level
``Server``: the tools of :mod:`stash.tools.definitions` (those the caller's
scope allows), a ``wake`` prompt and a ``stash://wake`` resource that load
the whole wake at the start of a session. Where it serves from is the
caller's (:class:`Host`): ``stash mcp`` over stdio, ``POST /mcp`` over
Streamable HTTP. Importing this module imports the SDK (about a second
and a half), so each of them imports it only once it is needed."""

from __future__ import annotations

from typing import Any, Protocol

import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

from .. import __version__
from . import definitions, texts
from .definitions import Backend
from .render import MEMORY_META, Result

WAKE_URI = "stash://wake"


class Host(Protocol):
    """Where the tools are served: how one request reaches its route, and the caller's scope (None: unknown,
    so every tool is listed and the server refuses what the capability may not do)."""

    def backend(self, ctx: ServerRequestContext[Any]) -> Backend: ...

    async def scope(self, ctx: ServerRequestContext[Any]) -> str | None: ...


def _blocks(result: Result) -> list[types.TextContent]:
    return [
        types.TextContent(type="text", text=p.text, _meta=dict(MEMORY_META) if p.memory else None) for p in result.parts
    ]


def tool_result(result: Result) -> types.CallToolResult:
    return types.CallToolResult(
        content=list(_blocks(result)), structured_content=result.structured, is_error=result.error
    )


def build(host: Host) -> Server[Any]:
    """The server: every handler answers from ``host``."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        scope = await host.scope(ctx)
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=t.name,
                    description=t.description,
                    input_schema=t.input_schema,
                    output_schema=t.answer,
                    annotations=types.ToolAnnotations(
                        read_only_hint=t.read_only,
                        destructive_hint=t.destructive,
                        idempotent_hint=t.idempotent,
                        open_world_hint=False,
                    ),
                )
                for t in definitions.listed(scope)
            ]
        )

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        return tool_result(await definitions.call(host.backend(ctx), params.name, dict(params.arguments or {})))

    async def list_prompts(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[types.Prompt(name="wake", description=texts.WAKE_PROMPT)])

    async def get_prompt(ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> types.GetPromptResult:
        if params.name != "wake":
            raise MCPError(types.INVALID_PARAMS, f"No prompt {params.name!r}; the one prompt is wake.")
        woken = await definitions.whole_wake(host.backend(ctx))
        return types.GetPromptResult(
            description=texts.WAKE_PROMPT,
            messages=[types.PromptMessage(role="user", content=block) for block in _blocks(woken)],
        )

    async def list_resources(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(
            resources=[
                types.Resource(name="wake", uri=WAKE_URI, description=texts.WAKE_RESOURCE, mime_type="text/plain")
            ]
        )

    async def read_resource(
        ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        if str(params.uri) != WAKE_URI:
            raise MCPError(types.INVALID_PARAMS, f"No resource {params.uri}; the one resource is {WAKE_URI}.")
        woken = await definitions.whole_wake(host.backend(ctx))
        if woken.error:
            raise MCPError(types.INVALID_REQUEST, woken.text)
        lines = (woken.structured or {}).get("lines") or []
        return types.ReadResourceResult(
            contents=[
                types.TextResourceContents(
                    uri=WAKE_URI, mime_type="text/plain", text="\n".join(lines), _meta=dict(MEMORY_META)
                )
            ]
        )

    def input_schema(name: str) -> dict[str, Any] | None:
        tool = definitions.TOOLS.get(name)
        return None if tool is None else tool.input_schema

    # The input schema by name: without it, the SDK lists the tools (one more session) before each call.
    return Server(
        "stash",
        version=__version__,
        instructions=texts.INSTRUCTIONS,
        get_tool_input_schema=input_schema,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
    )
