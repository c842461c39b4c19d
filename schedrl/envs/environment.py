"""The environment protocol of multi-turn episodes: the policy acts, the environment answers.

An `Environment` is asynchronous, so a rollout can wait on many of them at once (a tool
call, a game, a sandbox) without blocking the engine:

    obs = await env.reset(task, seed)          # the first observation (the prompt)
    result = await env.step(action_text)       # StepResult(observation, reward, done, truncated, info)
    await env.close()

The observation's text is appended to the trajectory as a suffix (see `ledger.py`): the
environment never sees or rewrites earlier tokens. A single-turn task is the one-step case:
`SingleTurnEnv` wraps any `TaskSource`, and its reward is the task's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from schedrl.dotted import load_object
from schedrl.envs.base import Task, TaskSource

ObservationSource = Literal["env", "tool", "template"]


@dataclass(frozen=True)
class Observation:
    """What the environment says; tokenized as a suffix of the trajectory and never trained on."""

    text: str
    source: ObservationSource = "env"


Context = Literal["same", "branch", "return"]


@dataclass(frozen=True)
class StepResult:
    """The outcome of one action: the next observation (None once done), a reward (None: no reward
    for this turn), whether the episode ended (`done`) or was cut short (`truncated`), and free-form info.

    `context` (sub-agents): "branch" opens a fresh context whose prompt is the observation (the current
    one waits); "return" closes the context opened last and appends the observation to the one it
    returns to. Each context trains as a segment of the episode, with the episode's reward."""

    observation: Observation | None
    reward: float | None
    done: bool
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    context: Context = "same"


@runtime_checkable
class Environment(Protocol):
    """A multi-turn episode. Promises: `reset` then `step` until a result is `done` (or the episode is
    cut), `close` once at the end whatever happened; observations are never trained on; a step's reward
    belongs to the turn it answers. Every call may be awaited under a timeout (`task.env_timeout_s`)."""

    stop_strings: tuple[str, ...]  # what ends a model turn here (a tool parser's closing tag); () for none

    async def reset(self, task: Task, seed: int) -> Observation:
        """Start an episode on `task`; the first observation is what the policy is prompted with."""
        ...

    async def step(self, action: str) -> StepResult:
        """The policy's decoded turn; the environment's answer."""
        ...

    async def close(self) -> None:
        """Release what the episode holds (processes, sessions, files)."""
        ...


class SingleTurnEnv:
    """A `TaskSource` as a one-step environment: the prompt, then one action scored by the task's reward."""

    stop_strings: tuple[str, ...] = ()

    def __init__(self, source: TaskSource) -> None:
        self.source = source
        self.task: Task | None = None

    async def reset(self, task: Task, seed: int) -> Observation:
        self.task = task
        return Observation(task.prompt, "template")

    async def step(self, action: str) -> StepResult:
        if self.task is None:
            raise RuntimeError("SingleTurnEnv.step before reset")
        return StepResult(None, self.source.reward(self.task, action.strip()), done=True)

    async def close(self) -> None:
        self.task = None


def load_environment(path: str, **kwargs: Any) -> Environment:
    """The environment class or factory named by dotted path (``"pkg.module:MyEnv"``), built with `kwargs`.

    A path that does not import, or names something that is not an environment, is a `ValueError`
    naming the path."""
    return build_environment(path, load_object(path, "environment"), **kwargs)


def build_environment(name: str, factory: Callable[..., Any], *args: Any, **kwargs: Any) -> Environment:
    """`factory(*args, **kwargs)`, checked to be an `Environment`; errors name `name` and the arguments."""
    try:
        env = factory(*args, **kwargs)
    except TypeError as err:
        raise ValueError(f"environment {name!r}: cannot build it with {sorted(kwargs)}: {err}") from err
    if not isinstance(env, Environment):
        raise ValueError(
            f"environment {name!r}: {type(env).__name__} is not an Environment (async reset, step and close)"
        )
    return env
