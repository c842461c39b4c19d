"""A stdio MCP server with state: a notebook an episode writes to and reads back (tools `write`, `read`),
and `reset`, which clears it, so a per-episode session can be recycled for the next episode.

    python -m schedrl.envs.tools.mcp_notes_server     # speaks MCP on stdin/stdout (needs schedrl[mcp])

The notebook is what must not leak between episodes (`session: episode`, `recycle: reset`; see
`schedrl.envs.sessions`).
"""

try:  # the MCP SDK's server class: MCPServer in 2.x, FastMCP in 1.x
    from mcp.server.mcpserver import MCPServer as Server
except ImportError:
    from mcp.server.fastmcp import FastMCP as Server  # pyright: ignore

server = Server("schedrl-notes")
NOTES: dict[str, str] = {}


@server.tool()
def write(key: str, value: str) -> str:
    """Write `value` under `key` in this session's notebook."""
    NOTES[key] = value
    return "ok"


@server.tool()
def read(key: str) -> str:
    """The value under `key` in this session's notebook, or `(none)`."""
    return NOTES.get(key, "(none)")


@server.tool()
def reset() -> str:
    """Clear the notebook (a session recycled for another episode starts empty)."""
    NOTES.clear()
    return "ok"


if __name__ == "__main__":
    server.run("stdio")
