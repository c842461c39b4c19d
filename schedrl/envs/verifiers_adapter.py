"""A `verifiers` environment (`vf.load_environment(env_id)`, the Environments Hub's form) as a schedrl
task and environment (`pip install 'schedrl[verifiers]'`; verifiers' classic API, 0.2 and 0.3). Where the
installed verifiers has only the v1 API (0.4), the `verifiers` task reads a v1 taskset instead
(`schedrl.envs.verifiers_v1`).

    task: {name: verifiers, args: {env_id: my-env, env_args: {...}}}      # single turn: its rubric scores
    task: {name: verifiers, args: {env_id: my-env}}, env: verifiers       # multi-turn: its own rollout loop

- **Tasks** are the environment's dataset rows (`get_dataset()`; held-out rows from `get_eval_dataset()`
  when it has one, else about 10% of rows by hash): the chat prompt it formats (system prompt, few-shot,
  question) as the task's messages, `answer`, `info`. Sampling draws rows with replacement.
- **Reward**: the environment's rubric (`rubric.score_rollout`), its weighted reward functions and
  metrics (`rewards/<name>/mean`); a function that raises scores 0 there, as verifiers does.
- **SFT data**: the answer, written by the environment's parser (`parser.format(answer=...)` for an
  `XMLParser`), or the bare answer.
- **Multi-turn** (`env: verifiers`): the environment's own `rollout` runs (setup, `env_response`, stop
  conditions, `final_env_response`, cleanup) with a verifiers `Client` whose responses are schedrl's
  model turns: each time the rollout asks the model, the episode hands the new messages to the policy as
  the observation (`role: content` lines) and the policy's turn goes back as the response. A `ToolEnv`'s
  tools run as verifiers runs them: the turn's `<tool_call>{json}</tool_call>` blocks (the hermes format)
  become the response's tool calls. When the rollout ends, the rubric scores it: the episode's reward.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib.metadata
import json
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

from schedrl.envs.base import Task, check_count, check_split, split_of, task_id
from schedrl.envs.chat import check_messages, readable
from schedrl.envs.environment import Observation, StepResult
from schedrl.envs.verifiers_v1 import MULTI_TURN, AsyncScored, V1Tasks, v1


def verifiers() -> Any:
    """The `verifiers` package, checked to have the classic API this adapter reads."""
    try:
        import verifiers as vf  # pyright: ignore[reportMissingImports]  # the verifiers extra
    except ImportError as err:
        raise ImportError(
            "verifiers environments need verifiers: pip install 'schedrl[verifiers]' (classic environments, "
            "verifiers 0.3) or 'schedrl[verifiers-v1]' (v1 tasksets, verifiers 0.4)"
        ) from err
    if not hasattr(vf, "Rubric") or not hasattr(vf, "load_environment"):
        raise ImportError(
            f"verifiers {getattr(vf, '__version__', '?')} has no classic API (vf.load_environment(env_id), "
            "vf.Rubric): the adapter reads verifiers 0.2 and 0.3, and 0.4's v1 tasksets single-turn; "
            "pip install 'schedrl[verifiers]'"
        )
    return vf


def verifiers_tasks(
    env_id: str, env_args: Mapping[str, Any] | None = None, eval_fraction: float = 0.1
) -> VerifiersTasks | V1Tasks:
    """The `verifiers` task: a classic environment (verifiers 0.2, 0.3), or a v1 taskset where the
    installed verifiers has only the v1 API (0.4; `schedrl.envs.verifiers_v1`)."""
    if not isinstance(env_id, str) or not env_id:
        raise ValueError(f"task 'verifiers': env_id must name an environment module, got {env_id!r}")
    try:
        import verifiers as vf  # pyright: ignore[reportMissingImports]  # the verifiers extra
    except ImportError:
        vf = None
    if vf is not None and not hasattr(vf, "load_environment") and v1() is not None:
        return V1Tasks(env_id, env_args, eval_fraction)
    return VerifiersTasks(env_id, env_args, eval_fraction)


def plain(messages: Any) -> list[dict[str, Any]]:
    """verifiers messages (pydantic objects or dicts) as `{role, content}` dicts with text content."""
    out = []
    for m in messages:
        d = m if isinstance(m, Mapping) else m.model_dump()
        content = d.get("content")
        if isinstance(content, list):  # content parts: their text
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        out.append({"role": d["role"], "content": "" if content is None else str(content)})
    return out


class VerifiersTasks(AsyncScored):
    """A verifiers environment's dataset as tasks, scored by its rubric (module doc)."""

    name = "verifiers"

    def __init__(
        self, env_id: str, env_args: Mapping[str, Any] | None = None, eval_fraction: float = 0.1
    ) -> None:
        if not isinstance(env_id, str) or not env_id:
            raise ValueError(f"task 'verifiers': env_id must name an environment module, got {env_id!r}")
        self.env_id, self.env_args, self.eval_fraction = env_id, dict(env_args or {}), eval_fraction
        self._env: Any = None
        self._splits: dict[str, list[Task]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def __getstate__(self) -> dict[str, Any]:  # the environment is loaded again where it is used
        return {**self.__dict__, "_env": None, "_splits": {}, "_loop": None}

    @property
    def env(self) -> Any:
        if self._env is None:
            vf = verifiers()
            try:
                self._env = vf.load_environment(self.env_id, **self.env_args)
            except (ValueError, RuntimeError) as err:
                raise ValueError(f"task 'verifiers': environment {self.env_id!r}: {err}") from None
        return self._env

    def tasks(self, split: str) -> list[Task]:
        if split not in self._splits:
            env = self.env
            has_eval = getattr(env, "eval_dataset", None) is not None
            rows = env.get_eval_dataset() if split == "eval" and has_eval else env.get_dataset()
            tasks = [self._task(row) for row in rows]
            if not has_eval:
                tasks = [t for t in tasks if split_of(t.id, self.eval_fraction) == split]
            if not tasks:
                raise ValueError(f"task 'verifiers': environment {self.env_id!r} has no {split!r} rows")
            self._splits[split] = tasks
        return self._splits[split]

    def _task(self, row: Mapping[str, Any]) -> Task:
        where = f"environment {self.env_id!r}, row {row.get('example_id')}"
        messages = check_messages(plain(row["prompt"]), where)
        info = row.get("info")
        return Task(
            task_id("vf", f"{self.env_id}:{row.get('example_id')}:{readable(messages)}"),
            readable(messages),
            str(row.get("answer") or ""),
            "verifiers",
            metadata={"info": json.loads(info) if isinstance(info, str) else info, "row": dict(row)},
            messages=messages,
        )

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        pool, rng = self.tasks(split), random.Random(seed)
        return [rng.choice(pool) for _ in range(check_count(n))]

    def input_of(self, task: Task) -> dict[str, Any]:
        """The rollout input verifiers builds its state from (the dataset row)."""
        return dict(task.metadata["row"])

    async def score(self, task: Task, completion: str | Sequence[Any]) -> tuple[float, dict[str, float]]:
        vf = verifiers()
        from verifiers.utils.message_utils import normalize_messages  # pyright: ignore[reportMissingImports]

        state = vf.State(input=self.input_of(task))
        state["prompt"] = normalize_messages(list(task.messages or ()), field_name="prompt")
        if isinstance(completion, str):
            completion = [{"role": "assistant", "content": completion}]
        state["completion"] = normalize_messages(list(completion), field_name="completion")
        state["trajectory"] = []
        state["timing"] = None
        await self.env.rubric.score_rollout(state)
        return float(state["reward"] or 0.0), {k: float(v) for k, v in (state.get("metrics") or {}).items()}

    def solution(self, task: Task) -> str:
        """The answer as the environment's parser writes it (an XMLParser's answer field), else as is."""
        parser = getattr(self.env, "parser", None)
        field = getattr(parser, "answer_field", None)
        write = getattr(parser, "format", None)
        if field is not None and write is not None:
            return str(write(**{field: task.answer}))
        return task.answer


# ---- multi-turn: the environment's own rollout, its model turns schedrl's ---------------------------

TURNS: contextvars.ContextVar[Turns] = contextvars.ContextVar("schedrl_verifiers_turns")


class Turns:
    """The hand-over between one rollout and its episode: what the rollout asks, what the policy says."""

    def __init__(self) -> None:
        self.asks: asyncio.Queue = asyncio.Queue()
        self.answers: asyncio.Queue = asyncio.Queue()


@functools.cache
def policy_client() -> Any:
    """A verifiers `Client` whose responses are the running episode's model turns (`TURNS`): one per
    process, each rollout finding its own episode through the context it was started in."""
    vf = verifiers()
    from verifiers.types import (  # pyright: ignore[reportMissingImports]
        Response,
        ResponseMessage,
        ToolCall,
    )

    from schedrl.envs.tools.parsers import HermesParser

    parser = HermesParser()

    class PolicyClient(vf.Client):
        def setup_client(self, config: Any) -> Any:
            return None

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
            return messages, {}

        async def get_native_response(
            self, prompt: Any, model: str, sampling_args: Any, tools: Any = None, **kw: Any
        ) -> Any:
            turns = TURNS.get()
            await turns.asks.put(prompt)
            text = await turns.answers.get()
            calls = (
                [c for c in parser.parse(text, {}) if c.name is not None and c.error is None] if tools else []
            )
            tool_calls = [
                ToolCall(id=f"call_{i}", name=str(c.name), arguments=json.dumps(c.arguments))
                for i, c in enumerate(calls)
            ]
            message = ResponseMessage(
                content=text,
                tool_calls=tool_calls or None,
                finish_reason="tool_calls" if tool_calls else "stop",
                is_truncated=False,
            )
            return Response(
                id=f"schedrl-{time.monotonic_ns()}", created=int(time.time()), model=model, message=message
            )

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: Any) -> Any:
            return response

        async def close(self) -> None:
            return None

    return PolicyClient(None)


class VerifiersEnv:
    """One episode of a verifiers environment's own rollout, its model turns the policy's (module doc)."""

    stop_strings = ("</tool_call>",)

    def __init__(self, source: Any) -> None:
        if isinstance(source, V1Tasks):
            raise ValueError(MULTI_TURN.format(version=importlib.metadata.version("verifiers")))
        if not isinstance(source, VerifiersTasks):
            raise ValueError(
                f"env 'verifiers' runs the 'verifiers' task's environment, got task {source.name!r}"
            )
        self.source = source
        self.turns: Turns | None = None
        self.rollout: asyncio.Task | None = None
        self.seen = 0  # messages of the rollout's prompt the policy has read
        self.client = policy_client()

    async def reset(self, task: Task, seed: int) -> Observation:
        await self.close()
        self.turns = Turns()
        token = TURNS.set(self.turns)
        try:  # the rollout's task copies the context: its client finds this episode's hand-over
            self.rollout = asyncio.get_running_loop().create_task(
                self.source.env.rollout(self.source.input_of(task), self.client, "schedrl", {})
            )
        finally:
            TURNS.reset(token)
        asked = await self._next()
        if asked is None:
            raise RuntimeError(
                f"verifiers environment {self.source.env_id!r}: the rollout ended before a model turn"
            )
        return Observation(self._text(asked), "template")

    async def _next(self) -> Any:
        """The next prompt the rollout asks the model for, or None once it has ended."""
        assert self.turns is not None and self.rollout is not None
        ask = asyncio.ensure_future(self.turns.asks.get())
        await asyncio.wait([ask, self.rollout], return_when=asyncio.FIRST_COMPLETED)
        if ask.done():
            return ask.result()
        ask.cancel()
        return None

    def _text(self, prompt: Any) -> str:
        messages = plain(prompt)
        new, self.seen = messages[self.seen :], len(messages)
        return "\n".join(f"{m['role']}: {m['content']}" for m in new) + "\nassistant: "

    async def step(self, action: str) -> StepResult:
        assert self.turns is not None and self.rollout is not None
        self.seen += 1  # the policy's own turn comes back as the rollout's next assistant message
        await self.turns.answers.put(action)
        asked = await self._next()
        if asked is not None:
            return StepResult(Observation(self._text(asked), "env"), None, done=False)
        state = self.rollout.result()
        await self.source.env.rubric.score_rollout(state)
        error = state.get("error")
        info = {"stop_condition": str(state.get("stop_condition"))} | ({"error": str(error)} if error else {})
        return StepResult(None, float(state["reward"] or 0.0), done=True, info=info)

    async def close(self) -> None:
        if self.rollout is not None and not self.rollout.done():
            self.rollout.cancel()
            await asyncio.gather(self.rollout, return_exceptions=True)
        self.rollout, self.turns, self.seen = None, None, 0
