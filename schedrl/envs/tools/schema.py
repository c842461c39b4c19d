"""A tool is a plain Python function, sync or async; its JSON schema comes from its type hints and
docstring (through `transformers.utils.get_json_schema`, the schema HF chat templates read).

    def calc(expression: str) -> str:
        \"\"\"Evaluate an arithmetic expression.

        Args:
            expression: digits and + - * / ( ), e.g. 12*34
        \"\"\"

A function whose schema cannot be derived (an untyped parameter, no docstring, a parameter the
docstring does not describe) is a `ToolSchemaError` naming the function and what is missing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from transformers.utils.chat_template_utils import get_json_schema

from schedrl.dotted import load_object

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
}


class ToolSchemaError(ValueError):
    """A tool's JSON schema cannot be derived from its signature and docstring."""


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]  # {"type": "function", "function": {"name", "description", "parameters"}}
    timeout_s: float | None = None  # None: the tool set's default
    max_concurrency: int | None = None  # calls of this tool running at once; None: no limit

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    @property
    def parameters(self) -> dict[str, Any]:
        return self.schema["function"]["parameters"]

    def check_arguments(self, arguments: Mapping[str, Any]) -> str | None:
        """Why `arguments` do not fit the tool's schema, or None when they do."""
        props, required = self.parameters.get("properties", {}), self.parameters.get("required", [])
        unknown = sorted(set(arguments) - set(props))
        if unknown:
            return f"unknown argument(s) {', '.join(unknown)}; {self.name} takes {', '.join(props) or 'none'}"
        missing = [p for p in required if p not in arguments]
        if missing:
            return f"missing argument(s) {', '.join(missing)}"
        for key, value in arguments.items():
            expected = props[key].get("type")
            types = _JSON_TYPES.get(expected) if isinstance(expected, str) else None
            if types is not None and (
                not isinstance(value, types) or (expected != "boolean" and isinstance(value, bool))
            ):
                return f"argument {key!r} must be {expected}, got {value!r}"
        return None


def make_tool(
    fn: Callable[..., Any] | Tool,
    *,
    name: str | None = None,
    timeout_s: float | None = None,
    max_concurrency: int | None = None,
) -> Tool:
    """`fn` as a `Tool`, its schema derived from its type hints and docstring."""
    if isinstance(fn, Tool):
        return fn
    if not callable(fn):
        raise ToolSchemaError(f"a tool must be a function, got {type(fn).__name__}")
    label = getattr(fn, "__qualname__", repr(fn))
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ToolSchemaError(
                f"tool {label}: parameter {p.name!r} is *args/**kwargs, which no schema describes"
            )
    try:
        schema = get_json_schema(fn)
    except Exception as err:  # transformers' TypeHintParsingException / DocstringParsingException
        raise ToolSchemaError(f"tool {label}: {err}") from err
    if name is not None:
        schema = {**schema, "function": {**schema["function"], "name": name}}
    return Tool(schema["function"]["name"], fn, schema, timeout_s, max_concurrency)


def load_tool(path: str, **options: Any) -> Tool:
    """The tool at dotted path `path` (``"pkg.module:function"``); errors name the path."""
    return make_tool(load_object(path, "tool"), **options)
