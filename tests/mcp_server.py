"""A small stdio MCP server for the tests: arithmetic, a failing tool, a probe of its confinement, and one
that kills the server."""

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
def probe(port: int) -> str:
    """Who the server runs as and what it reaches: uid, a TCP connect to 127.0.0.1:port, the environment."""
    import json
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        connected = True
    except OSError:
        connected = False
    return json.dumps({"uid": os.getuid(), "connected": connected, "env": sorted(os.environ)})


@server.tool()
def die() -> str:
    """Kill the server process mid-call."""
    os._exit(3)


if __name__ == "__main__":
    server.run("stdio")
