"""A small stdio MCP server for the tests: arithmetic, a failing tool, and one that kills the server."""

import os

try:  # the SDK's server class: MCPServer in 2.x, FastMCP in 1.x
    from mcp.server.mcpserver import MCPServer as Server
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:
    from mcp.server.fastmcp import FastMCP as Server
    from mcp.server.fastmcp.exceptions import ToolError

server = Server("schedrl-test")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def fail(reason: str) -> str:
    """Always fails with `reason` (an error result the client sees)."""
    raise ToolError(reason)


@server.tool()
def pid() -> str:
    """The server's process id (to tell sessions apart)."""
    return str(os.getpid())


@server.tool()
def die() -> str:
    """Kill the server process mid-call."""
    os._exit(3)


if __name__ == "__main__":
    server.run("stdio")
