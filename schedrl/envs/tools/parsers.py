"""Tool-call formats: how a model's turn names its calls, and how results are shown back to it.

Each parser has a closing tag that is the turn's stop string (nothing is generated after a call)
and accepts several calls in one block, which then run concurrently:

    hermes   <tool_call>{"name": "calc", "arguments": {"expression": "12*34"}}</tool_call>
             (Hermes / Qwen; a JSON list inside one block holds several calls); results come back as
             <tool_response>...</tool_response>
    compact  <<calc 12*34>> or <<calc 1+2; calc 3*4>>: a format a character-level model learns
             quickly; arguments after the name are split on "," in the order of the tool's
             parameters; results come back as [408]

A call that cannot be read becomes a `ToolCall` with an `error`, which is shown to the model as
the tool's output, never raised.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from schedrl.envs.tools.schema import Tool
from schedrl.registry import Registry


@dataclass(frozen=True)
class ToolCall:
    name: str | None  # None when the call could not be read at all
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why the call is malformed, or None
    raw: str = ""


class CallParser(Protocol):
    """Tool calls in a model turn. Promises: `parse` finds every call the turn makes (none: the turn is
    an answer), each naming a tool of `tools`; `format_results` writes the outputs in call order, as the
    text the model reads next; `stop` ends a turn that makes calls."""

    stop: str  # the closing tag: the turn's stop string

    def parse(self, text: str, tools: Mapping[str, Tool]) -> list[ToolCall]:
        """The calls in a model turn (empty: the turn is an answer, not a call)."""
        ...

    def format_results(self, outputs: list[str]) -> str:
        """The text appended to the trajectory after the calls: each output, in call order."""
        ...


PARSERS: Registry[type[CallParser]] = Registry("tool-call parser")


@PARSERS.register("hermes")
class HermesParser:
    """<tool_call>{json}</tool_call>; the JSON an object with "name" and "arguments", or a list of them."""

    stop = "</tool_call>"
    _block = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str, tools: Mapping[str, Tool]) -> list[ToolCall]:
        calls: list[ToolCall] = []
        for body in self._block.findall(text):
            raw = body.strip()
            try:
                data = json.loads(raw)
            except json.JSONDecodeError as err:
                calls.append(
                    ToolCall(None, error=f"malformed JSON: {err.msg} at position {err.pos}", raw=raw)
                )
                continue
            for item in data if isinstance(data, list) else [data]:
                calls.append(self._one(item, raw))
        return calls

    @staticmethod
    def _one(item: Any, raw: str) -> ToolCall:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return ToolCall(None, error='a call must be an object with a string "name"', raw=raw)
        args = item.get("arguments", {})
        if isinstance(args, str):  # some templates emit the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError as err:
                return ToolCall(item["name"], error=f"malformed arguments JSON: {err.msg}", raw=raw)
        if not isinstance(args, dict):
            return ToolCall(item["name"], error='"arguments" must be an object', raw=raw)
        return ToolCall(item["name"], args, raw=raw)

    def format_results(self, outputs: list[str]) -> str:
        return "".join(f"<tool_response>\n{o}\n</tool_response>\n" for o in outputs)


@PARSERS.register("compact")
class CompactParser:
    """<<name arg, arg>>; several calls in one block separated by ";"."""

    stop = ">>"
    _block = re.compile(r"<<(.*?)(?:>>|$)", re.DOTALL)

    def parse(self, text: str, tools: Mapping[str, Tool]) -> list[ToolCall]:
        calls = []
        for body in self._block.findall(text):
            for part in (p.strip() for p in body.split(";")):
                if part:
                    calls.append(self._one(part, tools))
        return calls

    @staticmethod
    def _one(part: str, tools: Mapping[str, Tool]) -> ToolCall:
        name, _, rest = part.partition(" ")
        tool = tools.get(name)
        if tool is None:
            return ToolCall(name, raw=part)  # the tool set reports the unknown name
        params = list(tool.parameters.get("properties", {}))
        values = [v.strip() for v in rest.split(",")] if rest.strip() else []
        if len(values) > len(params):
            return ToolCall(name, error=f"{len(values)} arguments, {name} takes {len(params)}", raw=part)
        args: dict[str, Any] = {}
        for key, value in zip(params, values, strict=False):
            kind = tool.parameters["properties"][key].get("type")
            try:
                args[key] = int(value) if kind == "integer" else float(value) if kind == "number" else value
            except ValueError:
                return ToolCall(name, error=f"argument {key!r} must be {kind}, got {value!r}", raw=part)
        return ToolCall(name, args, raw=part)

    def format_results(self, outputs: list[str]) -> str:
        return "".join(f"[{o}]" for o in outputs)
