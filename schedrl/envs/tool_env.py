"""A task with tools as a multi-turn environment: each model turn either calls tools or answers.

A turn that holds calls (in the parser's format) runs them concurrently and the environment
answers with their outputs; a turn without calls is the answer, scored by the task's reward on
everything after the prompt (model turns and tool outputs, as a single-turn completion is the
text after the prompt). Past `max_calls` turns with calls the episode ends, truncated, with
reward 0.

Tool rewards: with `call_reward` > 0 a turn with calls earns `call_reward` per call that ran
("ok") and loses it per call that did not (malformed, unknown tool, bad arguments, raised, timed
out), as that turn's reward; the answer's reward comes on top, on the last turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from schedrl.envs.base import Task, TaskSource
from schedrl.envs.environment import Observation, StepResult
from schedrl.envs.tools import PARSERS, CallParser, Tool, ToolSet, load_tool


class ToolEnv:
    def __init__(
        self,
        source: TaskSource,
        tools: ToolSet,
        parser: CallParser,
        max_calls: int = 4,
        call_reward: float = 0.0,
    ) -> None:
        if max_calls < 1:
            raise ValueError(f"ToolEnv.max_calls must be >= 1, got {max_calls!r}")
        self.source, self.tools, self.parser, self.max_calls = source, tools, parser, max_calls
        self.call_reward = call_reward
        self.mcp_servers: tuple = ()  # MCP servers whose tools join at each reset (`tool_env(mcp=...)`)
        self.base_tools = list(tools.tools.values())
        self.held: list = []  # the episode's own MCP sessions (`session: episode`), given back at close
        self.stop_strings = (parser.stop,)  # nothing is generated after a call's closing tag
        self.task: Task | None = None
        self.transcript, self.calls = "", 0

    async def reset(self, task: Task, seed: int) -> Observation:
        await self._release()  # a reset without a close ends the episode before
        if self.mcp_servers:  # on the episodes' event loop, where the servers' sessions live
            from schedrl.envs.tools.mcp import episode_tools

            extra, self.held = await episode_tools(self.mcp_servers)
            self.tools = ToolSet([*self.base_tools, *extra], timeout_s=self.tools.timeout_s)
        self.task, self.transcript, self.calls = task, "", 0
        return Observation(task.prompt, "template")

    async def step(self, action: str) -> StepResult:
        if self.task is None:
            raise RuntimeError("ToolEnv.step before reset")
        self.transcript += action
        calls = self.parser.parse(action, self.tools.tools)
        if not calls:
            return StepResult(None, self.source.reward(self.task, self.transcript.strip()), done=True)
        self.calls += 1
        if self.calls > self.max_calls:
            return StepResult(None, 0.0, done=True, truncated=True, info={"reason": "max_calls"})
        results = await self.tools.run(calls)
        text = self.parser.format_results([r.output for r in results])
        self.transcript += text
        statuses = [r.status for r in results]
        ok = sum(s == "ok" for s in statuses)
        reward = self.call_reward * (ok - (len(statuses) - ok)) if self.call_reward else None
        return StepResult(Observation(text, "tool"), reward, done=False, info={"tools": statuses})

    async def close(self) -> None:
        self.task = None
        await self._release()

    async def _release(self) -> None:
        if self.held:
            from schedrl.envs.tools.mcp import release_sessions

            held, self.held = self.held, []
            await release_sessions(held)


def tool_env(
    source: TaskSource,
    tools: Sequence[str | Callable[..., Any] | Tool] = (),
    parser: str = "compact",
    max_calls: int = 4,
    timeout_s: float = 10.0,
    call_reward: float = 0.0,
    mcp: Sequence[Any] = (),
) -> ToolEnv:
    """`env: tools` in a config: `tools` as dotted paths (``"schedrl.envs.calc:calc"``) or functions, and
    `mcp` as MCP servers (``{command: python, args: [server.py]}``) whose tools join them."""
    if not tools and not mcp:
        raise ValueError("env 'tools' needs env_args.tools (dotted paths of tool functions) or env_args.mcp")
    if mcp:
        from schedrl.envs.tools.mcp import MCPServer

        servers = tuple(MCPServer.of(m) for m in mcp)  # a bad spec fails here, at config time
    loaded = [load_tool(t) if isinstance(t, str) else t for t in tools]
    env = ToolEnv(source, ToolSet(loaded, timeout_s=timeout_s), PARSERS.get(parser)(), max_calls, call_reward)
    if mcp:
        env.mcp_servers = servers
    return env
