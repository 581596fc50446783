"""A small MCP server for the tests: ``python -m tests.tools.mcp_server`` (stdio)."""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("signalbox-test")


@server.tool(description="Add two integers.")
def add(a: int, b: int) -> str:
    """The sum of ``a`` and ``b``, as text."""
    return str(a + b)


@server.tool(description="Fail on purpose with the given message.")
def fail(message: str) -> str:
    """Raise, so the call comes back as an MCP error result."""
    raise ValueError(f"asked to fail: {message!r}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
