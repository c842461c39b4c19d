"""A verifiers 0.4 taskset (the `verifiers.v1` API) as a schedrl task, scored per trace
(`pip install 'schedrl[verifiers-v1]'`).

    task: {name: verifiers, args: {env_id: my_taskset, env_args: {n: 500}}}

verifiers 0.4 replaced the classic API (`load_environment`, rubrics) with tasksets of typed tasks: a
package whose `__all__` exports a `vf.Taskset` subclass, imported by its id (or a module's dotted path);
its `load()` yields tasks (`TaskData`: a prompt, a system prompt, the taskset's own fields such as
`answer`), and each task's `@vf.reward` and `@vf.metric` methods score a trace. `task: verifiers` reads
whichever API the installed package has (`schedrl.envs.verifiers_adapter.verifiers_tasks`).

- **Tasks** are the taskset's tasks (`env_args` are its config's fields), read once; an infinite taskset
  is read up to `MAX_TASKS`. A task's messages are its system prompt, then its prompt (a string: one user
  message); its answer is `data.answer` where the data has one. About 10% are held out, by the hash of
  the prompt (a prompt that repeats is in one split).
- **Reward**: a trace of the prompt and the completion as the model's one sampled reply, scored by the
  task's own `score` offline: signals that need a runtime (the sandbox a harness runs in) are skipped,
  as verifiers skips them offline. The reward is the trace's weighted sum, and each named reward and
  metric is logged as `rewards/<name>/mean`.
- **SFT data**: the answer as it is.

Multi-turn (`env: verifiers`) is not read for v1: there the environment's `run` drives the episode, and
each model turn reaches the model from verifiers' harness, a program it launches in a subprocess (with
uv), through its own HTTP interception server; the only way to put a trainer's policy behind it is a
module attribute the package does not document (`interception.server.resolve_client`).
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from schedrl.envs.base import Task, check_count, check_split, split_of, task_id
from schedrl.envs.chat import check_messages, readable

MULTI_TURN = (
    "verifiers {version} has the v1 API only; its multi-turn episodes are driven by verifiers' own "
    "harness, a subprocess that calls the model over HTTP, which schedrl's episodes do not drive: use a "
    "v1 taskset single-turn (task: verifiers, env: single_turn), or a classic environment with "
    "verifiers<0.4 (pip install 'schedrl[verifiers]')"
)


MAX_TASKS = 100_000  # read of a taskset that never ends


def v1() -> Any:
    """`verifiers.v1`, where the installed verifiers has it (0.4 and later), else None."""
    try:
        import verifiers.v1 as vf  # pyright: ignore[reportMissingImports]  # the verifiers-v1 extra
    except ImportError:
        return None
    return vf


class AsyncScored(ABC):
    """What both `verifiers` sources share: `score(task, completion)` is a coroutine giving the reward and
    named signals; `reward` and `reward_batch` (a batch scored at once, each signal's mean logged as
    `rewards/<name>/mean`) run it on the source's own event loop."""

    _loop: asyncio.AbstractEventLoop | None = None

    @abstractmethod
    async def score(self, task: Task, completion: Any) -> tuple[float, dict[str, float]]:
        """The reward of `completion` for `task`, and its named signals (rewards and metrics)."""

    def run(self, coro: Any) -> Any:
        """Run `coro` on this source's own event loop (a scorer's thread has none running)."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)

    def reward_batch(
        self, tasks: Sequence[Task], completions: Sequence[str], completion_ids: Sequence[Sequence[int]]
    ) -> tuple[list[float], dict[str, float], list[str | None]]:
        async def all_of() -> list[tuple[float, dict[str, float]]]:
            return list(
                await asyncio.gather(*(self.score(t, c) for t, c in zip(tasks, completions, strict=True)))
            )

        scored = self.run(all_of())
        sums: dict[str, float] = {}
        for _, signals in scored:
            for k, v in signals.items():
                sums[k] = sums.get(k, 0.0) + v
        n = max(1, len(scored))
        return (
            [r for r, _ in scored],
            {f"rewards/{k}/mean": v / n for k, v in sums.items()},
            [None] * len(scored),
        )

    def reward(self, task: Task, completion: str) -> float:
        return self.run(self.score(task, completion))[0]


def load_taskset(env_id: str, args: Mapping[str, Any]) -> Any:
    """The taskset `env_id` names, its config built from `args`: an installed taskset package by
    verifiers' own loader, or a module by its dotted path (which verifiers' loader does not import), whose
    `__all__` exports one `vf.Taskset` subclass as verifiers requires."""
    vf = v1()
    if "." not in env_id:
        return vf.load_taskset(vf.taskset_config_type(env_id)(id=env_id, **args))
    from verifiers.v1.utils.generic import concrete_type  # pyright: ignore[reportMissingImports]

    module = importlib.import_module(env_id)
    exported = [getattr(module, name, None) for name in getattr(module, "__all__", ())]
    classes = [
        c for c in exported if isinstance(c, type) and issubclass(c, vf.Taskset) and c is not vf.Taskset
    ]
    if len(classes) != 1:
        raise ValueError(f"its __all__ must export exactly one vf.Taskset subclass, found {len(classes)}")
    config_type = concrete_type(classes[0], vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
    return classes[0](config_type(id=env_id, **args))


class V1Tasks(AsyncScored):
    """A v1 taskset's tasks, scored by each task's own rewards on a one-reply trace (module doc)."""

    name = "verifiers"

    def __init__(
        self,
        env_id: str,
        env_args: Mapping[str, Any] | None = None,
        eval_fraction: float = 0.1,
    ) -> None:
        self.env_id, self.env_args, self.eval_fraction = env_id, dict(env_args or {}), eval_fraction
        self._taskset: Any = None
        self._tasks: dict[str, Any] = {}  # schedrl task id -> the taskset's task
        self._splits: dict[str, list[Task]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def __getstate__(self) -> dict[str, Any]:  # the taskset is loaded again where it is used
        return {**self.__dict__, "_taskset": None, "_tasks": {}, "_splits": {}, "_loop": None}

    @property
    def taskset(self) -> Any:
        if self._taskset is None:
            try:
                self._taskset = load_taskset(self.env_id, self.env_args)
            except (ImportError, TypeError, ValueError, AttributeError) as err:
                raise ValueError(f"task 'verifiers': taskset {self.env_id!r}: {err}") from None
        return self._taskset

    def _read(self) -> dict[str, Any]:
        """The taskset's tasks by schedrl task id, read on first use (and the splits with them)."""
        if not self._tasks:
            for vtask in itertools.islice(self.taskset, MAX_TASKS):
                task = self._task(vtask)
                self._tasks[task.id] = vtask
                self._splits.setdefault(split_of(task.prompt, self.eval_fraction), []).append(task)
        return self._tasks

    def _task(self, vtask: Any) -> Task:
        data = vtask.data
        where = f"taskset {self.env_id!r}, task {data.idx}"
        messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
        prompt = data.prompt
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages += [m if isinstance(m, Mapping) else m.model_dump() for m in prompt]
        messages = check_messages(messages, where)
        return Task(
            task_id("vf1", f"{self.env_id}:{vtask.key}"),
            readable(messages),
            str(getattr(data, "answer", "") or ""),
            "verifiers",
            metadata={"key": vtask.key, "idx": data.idx},
            messages=messages,
        )

    def tasks(self, split: str) -> list[Task]:
        check_split(split)
        self._read()
        if not self._splits.get(split):
            raise ValueError(f"task 'verifiers': taskset {self.env_id!r} has no {split!r} tasks")
        return self._splits[split]

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        pool, rng = self.tasks(split), random.Random(seed)
        return [rng.choice(pool) for _ in range(check_count(n))]

    def trace(self, task: Task, completion: str) -> tuple[Any, Any]:
        """The trace verifiers would record for `completion` as the model's one reply to `task`, and the
        taskset's task that scores it."""
        vf = v1()
        from verifiers.v1.graph import MessageNode  # pyright: ignore[reportMissingImports]
        from verifiers.v1.state import state_cls  # pyright: ignore[reportMissingImports]

        vtask = self._read()[task.id]
        trace = vf.Trace(
            task=vf.TraceTask(type=type(vtask).__name__, data=vtask.data, key=vtask.key, hash=vtask.hash),
            state=state_cls(type(vtask))(),
            agent=vf.AgentInfo(config=vf.AgentConfig(model="schedrl-policy")),
        )
        kinds = {"system": vf.SystemMessage, "user": vf.UserMessage, "assistant": vf.AssistantMessage}
        messages = [kinds[m["role"]](content=m["content"]) for m in task.messages or ()]
        for i, m in enumerate(messages):
            trace.nodes.append(MessageNode(parent=i - 1 if i else None, message=m))
        reply = vf.AssistantMessage(content=completion)
        trace.nodes.append(MessageNode(parent=len(messages) - 1, message=reply, sampled=True))
        return trace, vtask

    async def score(self, task: Task, completion: str) -> tuple[float, dict[str, float]]:
        trace, vtask = self.trace(task, completion)
        await vtask.score(trace)
        signals = {k: float(v.score) for k, v in trace.rewards.items() if v is not None}
        signals |= {k: float(v) for k, v in trace.metrics.items() if v is not None}
        return float(trace.reward), signals

    def solution(self, task: Task) -> str:
        return task.answer
