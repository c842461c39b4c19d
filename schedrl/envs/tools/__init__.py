"""Tools for multi-turn episodes: plain functions with derived schemas, call parsers, a concurrent runner."""

from schedrl.envs.tools.parsers import PARSERS, CallParser, CompactParser, HermesParser, ToolCall
from schedrl.envs.tools.schema import Tool, ToolSchemaError, load_tool, make_tool
from schedrl.envs.tools.toolset import STATUSES, ToolResult, ToolSet, clip_tokens

__all__ = [
    "PARSERS",
    "STATUSES",
    "CallParser",
    "CompactParser",
    "HermesParser",
    "Tool",
    "ToolCall",
    "ToolResult",
    "ToolSchemaError",
    "ToolSet",
    "clip_tokens",
    "load_tool",
    "make_tool",
]
