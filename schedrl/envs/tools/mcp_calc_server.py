"""A stdio MCP server exposing schedrl's calculator as the tool `calc` (for examples/calc_mcp.yaml).

    python -m schedrl.envs.tools.mcp_calc_server      # speaks MCP on stdin/stdout (needs schedrl[mcp])

It is a module of the package, not a file in examples/, so a recipe can start it from any directory.
"""

try:  # the MCP SDK's server class: MCPServer in 2.x, FastMCP in 1.x
    from mcp.server.mcpserver import MCPServer as Server
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:
    from mcp.server.fastmcp import FastMCP as Server  # pyright: ignore
    from mcp.server.fastmcp.exceptions import ToolError  # pyright: ignore

from schedrl.envs.calc import calc as evaluate

server = Server("schedrl-calc")


@server.tool()
def calc(expression: str) -> str:
    """Evaluate an arithmetic expression exactly."""
    try:
        return evaluate(expression)
    except Exception as err:  # an expected failure: an error result for the model, not a server crash
        raise ToolError(f"{type(err).__name__}: {err}") from None


if __name__ == "__main__":
    server.run("stdio")
