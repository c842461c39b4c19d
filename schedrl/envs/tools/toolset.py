"""Running a turn's tool calls: concurrently, each under a timeout, every failure an output.

`ToolSet.run(calls)` runs the calls of one turn at once (async tools on the event loop, sync
tools on worker threads, so a slow tool never blocks the loop -- the SkyRL#53 failure), each
under its timeout and its tool's concurrency limit, and returns one `ToolResult` per call, in
order. Nothing a model writes can crash the rollout: a malformed call, an unknown tool, wrong
arguments, a tool that raises and a tool past its timeout each come back as the call's output,
with a status counted in `ToolSet.counts` for the metrics.

A sync tool past its timeout keeps its worker thread until it returns (Python cannot stop a
thread); long-running tools should be async, or run in the sandbox.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from schedrl.envs.ledger import encode
from schedrl.envs.tools.parsers import ToolCall
from schedrl.envs.tools.schema import Tool, make_tool

Status = Literal["ok", "malformed", "unknown_tool", "bad_arguments", "error", "timeout"]
STATUSES: tuple[str, ...] = ("ok", "malformed", "unknown_tool", "bad_arguments", "error", "timeout")


@dataclass(frozen=True)
class ToolResult:
    call: ToolCall
    output: str  # what the model is shown
    status: Status
    seconds: float = 0.0


class ToolSet:
    """Named tools with a default timeout; `run` executes one turn's calls."""

    def __init__(self, tools: Sequence[Callable[..., Any] | Tool], timeout_s: float = 10.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"ToolSet.timeout_s must be > 0, got {timeout_s!r}")
        self.tools: dict[str, Tool] = {}
        for t in tools:
            tool = make_tool(t)
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self.tools[tool.name] = tool
        self.timeout_s = timeout_s
        self.counts: Counter[str] = Counter()
        self._limits: dict[tuple[int, str], asyncio.Semaphore] = {}  # per event loop and tool

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The tools' JSON schemas, as chat templates take them (`tools=`)."""
        return [t.schema for t in self.tools.values()]

    async def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Every call of one turn, concurrently; results in call order."""
        results = await asyncio.gather(*(self._one(c) for c in calls))
        self.counts.update(r.status for r in results)
        return list(results)

    async def _one(self, call: ToolCall) -> ToolResult:
        if call.error is not None or call.name is None:
            return ToolResult(call, f"error: {call.error or 'the call could not be read'}", "malformed")
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return ToolResult(call, f"error: unknown tool {call.name!r}; tools: {known}", "unknown_tool")
        why = tool.check_arguments(call.arguments)
        if why is not None:
            return ToolResult(call, f"error: {why}", "bad_arguments")
        timeout = tool.timeout_s or self.timeout_s
        start = time.perf_counter()
        try:
            async with self._limit(tool):
                if tool.is_async:
                    value = await asyncio.wait_for(tool.fn(**call.arguments), timeout)
                else:
                    value = await asyncio.wait_for(asyncio.to_thread(tool.fn, **call.arguments), timeout)
        except TimeoutError:
            return ToolResult(call, f"error: {tool.name} timed out after {timeout:g} s", "timeout", timeout)
        except Exception as err:  # the tool's own failure is the model's observation
            return ToolResult(
                call, f"error: {type(err).__name__}: {err}", "error", time.perf_counter() - start
            )
        return ToolResult(call, str(value), "ok", time.perf_counter() - start)

    def _limit(self, tool: Tool) -> asyncio.Semaphore | _Unlimited:
        if tool.max_concurrency is None:
            return _UNLIMITED
        key = (id(asyncio.get_running_loop()), tool.name)
        if key not in self._limits:
            self._limits[key] = asyncio.Semaphore(tool.max_concurrency)
        return self._limits[key]


class _Unlimited:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


_UNLIMITED = _Unlimited()


def clip_tokens(tokenizer: Any, text: str, max_tokens: int, marker: str = "...") -> list[int]:
    """`text` tokenized, cut to at most `max_tokens` by keeping its head and tail around `marker`."""
    ids = encode(tokenizer, text)
    if len(ids) <= max_tokens:
        return ids
    mark = encode(tokenizer, marker)
    room = max_tokens - len(mark)
    if room < 2:  # no room for the marker: the head alone
        return ids[:max_tokens]
    head = room - room // 2
    return ids[:head] + mark + ids[len(ids) - room // 2 :]
