"""Gymnasium text environments as schedrl environments.

    task: {name: gym, args: {id: "pkg.module:Name-v0", kwargs: {...}}}
    env: gym

Any `gymnasium.Env` whose observations and actions are text (the shape of skyrl-gym's and TextArena's
environments, and of `schedrl.envs.gym_text.TextEnv`) runs as a multi-turn episode: the first
observation is the prompt, each model turn is an action, each step's reward belongs to that turn, and
`terminated` or `truncated` ends the episode. `id` is a registered Gymnasium id, or `module:Id` to
import the module that registers it first (Gymnasium's own form); `kwargs` go to `gymnasium.make`.
An environment that knows a reference transcript for a seed (`env.unwrapped.solution(seed)`) gives the
SFT warm-up its data; without one, set `sft.steps: 0`.

A task is a reset seed: the `gym` task source draws seeds (about 10% of them are eval, by hash) and
each task's prompt is the environment's first observation from that seed, so a group's episodes start
from the same state. Steps run on a worker thread (a Gymnasium environment is synchronous), so one slow
environment does not hold up the others. An observation that is not text is an error naming the
environment and the type.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from typing import Any

from schedrl.envs.base import Task, check_count, check_split, split_of, task_id
from schedrl.envs.environment import Observation, StepResult


def make_gym(env_id: str, kwargs: Mapping[str, Any] | None) -> Any:
    """`gymnasium.make(env_id, **kwargs)`, with an error naming the id when it is unknown."""
    try:
        import gymnasium
    except ImportError as err:  # a core dependency, but say what is missing
        raise ImportError("the gym environment needs gymnasium: pip install gymnasium") from err
    try:
        return gymnasium.make(env_id, **dict(kwargs or {}))
    except (gymnasium.error.Error, ModuleNotFoundError) as err:
        raise ValueError(f"gym environment {env_id!r}: {type(err).__name__}: {err}") from None


def reset_seeds(key: str, split: str, n: int, seed: int, max_seed: int) -> list[int]:
    """`n` reset seeds of `split`, drawn from `seed`: about 10% of seeds are eval, by the hash of
    `key:seed` (an environment's tasks are its reset seeds: here and in the `openenv` adapter)."""
    check_split(split)
    rng = random.Random(seed)
    seeds: list[int] = []
    while len(seeds) < check_count(n):
        s = rng.randrange(max_seed)
        if split_of(f"{key}:{s}") == split:
            seeds.append(s)
    return seeds


def text_of(env_id: str, obs: Any) -> str:
    if not isinstance(obs, str):
        raise ValueError(
            f"gym environment {env_id!r}: observations must be text, got {type(obs).__name__} "
            "(wrap it to render its observation as a string)"
        )
    return obs


class GymTasks:
    """Reset seeds of a Gymnasium text environment as tasks (module doc)."""

    name = "gym"

    def __init__(self, id: str, kwargs: Mapping[str, Any] | None = None, max_seed: int = 2**31 - 1) -> None:
        if not isinstance(id, str) or not id:
            raise ValueError(f"task 'gym': id must be a Gymnasium id, got {id!r}")
        self.id, self.kwargs, self.max_seed = id, dict(kwargs or {}), max_seed
        self._env: Any = None  # resets here give each task its prompt

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        return [
            Task(task_id("gym", f"{self.id}:{s}"), self.first_observation(s), "", "gym", metadata={"seed": s})
            for s in reset_seeds(self.id, split, n, seed, self.max_seed)
        ]

    def first_observation(self, seed: int) -> str:
        if self._env is None:
            self._env = make_gym(self.id, self.kwargs)
        obs, _ = self._env.reset(seed=seed)
        return text_of(self.id, obs)

    def reward(self, task: Task, completion: str) -> float:
        raise ValueError(
            "task 'gym' is rewarded by its environment's steps: run it with task.env: gym, not single_turn"
        )

    def solution(self, task: Task) -> str:
        """The environment's reference transcript for the task's seed, where it has one
        (`env.unwrapped.solution(seed)`, as `schedrl.envs.gym_text.TextEnv` does): the SFT warm-up's data."""
        if self._env is None:
            self._env = make_gym(self.id, self.kwargs)
        solve = getattr(self._env.unwrapped, "solution", None)
        if solve is None:
            raise ValueError(
                f"task 'gym': environment {self.id!r} has no reference solutions "
                "(env.unwrapped.solution(seed)); set sft.steps: 0"
            )
        return str(solve(int(task.metadata["seed"])))

    def __getstate__(self) -> dict[str, Any]:  # the cached environment stays in its process
        return {**self.__dict__, "_env": None}


class GymEnv:
    """A Gymnasium text environment as an `Environment` (module doc). `stop`: strings that end a model
    turn (e.g. a closing tag), none by default."""

    def __init__(self, source: Any, stop: Sequence[str] = ()) -> None:
        if not isinstance(source, GymTasks):
            raise ValueError(f"env 'gym' runs the 'gym' task's environments, got task {source.name!r}")
        self.source, self.stop_strings = source, tuple(stop)
        self.env: Any = None

    async def reset(self, task: Task, seed: int) -> Observation:
        if self.env is None:
            self.env = await asyncio.to_thread(make_gym, self.source.id, self.source.kwargs)
        obs, _ = await asyncio.to_thread(self.env.reset, seed=int(task.metadata["seed"]))
        return Observation(text_of(self.source.id, obs), "template")

    async def step(self, action: str) -> StepResult:
        obs, reward, terminated, truncated, info = await asyncio.to_thread(self.env.step, action)
        done = bool(terminated or truncated)
        observation = None if done else Observation(text_of(self.source.id, obs), "env")
        return StepResult(observation, float(reward), done, bool(truncated) and not terminated, dict(info))

    async def close(self) -> None:
        if self.env is not None:
            env, self.env = self.env, None
            await asyncio.to_thread(env.close)
