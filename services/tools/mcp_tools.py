"""Tools of configured MCP servers (stdio or streamable HTTP), served like any other tool.

Discovered once when a worker starts (``SIGNALBOX_MCP_SERVERS``), each tool is registered as
``mcp__<server>__<tool>`` with the server's time limit, queue and approval mode (``confirm``
unless configured: an MCP tool may do anything). Each call opens its own session: a stdio
server is a fresh process per call, which costs tens of milliseconds and leaves nothing
behind when a call is killed at its time limit.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

import anyio
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel, ConfigDict

from signalbox.services.tools.registry import Registry, Tool, ToolContext, ToolError, ToolTimeout
from signalbox.shared.settings import McpServerSettings
from signalbox.shared.tool_contract import ToolSpec

log = logging.getLogger(__name__)

DISCOVERY_TIMEOUT_S = 20.0  # a server slower than this to list its tools is left out
CALL_MARGIN_S = 0.5  # end the call ourselves before the task's soft limit, to say why
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")  # the model API's tool names allow only these
NAME_MAX_CHARS = 64


class McpArguments(BaseModel):
    """Whatever the model passes; the MCP server validates it against its own schema."""

    model_config = ConfigDict(extra="allow")


def tool_name(server: str, tool: str) -> str:
    """The catalogue name of ``tool`` of ``server``: ``mcp__<server>__<tool>``, API-safe."""
    return _UNSAFE.sub("_", f"mcp__{server}__{tool}")[:NAME_MAX_CHARS]


def _client(server: McpServerSettings) -> Client:
    if server.url is not None:
        return Client(server.url)
    assert server.command is not None  # McpServerSettings holds exactly one of the two
    command, *args = server.command
    # The SDK's default environment (PATH, HOME, ...) plus the configured extras: the
    # worker's own secrets are not passed to a server that did not ask for them.
    return Client(StdioServerParameters(command=command, args=args, env=server.env or None))


async def list_tools(server: McpServerSettings) -> list[Any]:
    """The tools ``server`` offers, every page."""
    with anyio.fail_after(DISCOVERY_TIMEOUT_S):
        async with _client(server) as client:
            found: list[Any] = []
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                found.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    return found


def _text(result: CallToolResult) -> str:
    parts = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        else:
            parts.append(f"[{block.type} content omitted]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


async def call_tool(
    server: McpServerSettings, tool: str, arguments: dict[str, Any], timeout_s: float
) -> CallToolResult:
    """One call of ``tool`` in a session of its own, ended after ``timeout_s``."""
    with anyio.fail_after(timeout_s):
        async with _client(server) as client:
            return await client.call_tool(tool, arguments)


def _caller(server_name: str, server: McpServerSettings, tool: str) -> Any:
    def call(args: McpArguments, ctx: ToolContext) -> str:
        limit = max(0.5, ctx.timeout_s - CALL_MARGIN_S)
        try:
            result = anyio.run(call_tool, server, tool, dict(args.model_extra or {}), limit)
        except TimeoutError:
            raise ToolTimeout(
                f"MCP server {server_name!r} did not answer {tool!r} within {limit:g} s"
            ) from None
        except OSError as exc:
            raise ToolError(f"MCP server {server_name!r} cannot be reached: {exc}") from None
        except Exception as exc:  # the SDK's own errors: protocol, refused arguments
            raise ToolError(f"MCP server {server_name!r} failed on {tool!r}: {exc!r}") from None
        text = _text(result)
        if result.is_error:
            raise ToolError(f"{tool} (MCP server {server_name!r}) failed: {text}")
        return text

    call.__name__ = tool_name(server_name, tool)
    return call


def discover(servers: Mapping[str, McpServerSettings]) -> Registry:
    """A registry of every tool of ``servers``; a server that does not answer is left out."""
    registry = Registry()
    for server_name, server in sorted(servers.items()):
        try:
            tools = anyio.run(list_tools, server)
        except Exception as exc:  # down, misconfigured, slow: the worker serves the rest
            log.error("MCP server %r left out: it did not list its tools: %r", server_name, exc)
            continue
        for found in tools:
            name = tool_name(server_name, found.name)
            spec = ToolSpec(
                name=name,
                description=found.description or f"{found.name} (MCP server {server_name})",
                input_schema=found.input_schema,
                timeout_s=server.timeout_s,
                queue=server.queue,
                mode=server.mode,
                side_effect="execute",
            )
            function = _caller(server_name, server, found.name)
            registry.add(Tool(function=function, input_model=McpArguments, spec=spec))
        log.info("MCP server %r: %d tools", server_name, len(tools))
    return registry
