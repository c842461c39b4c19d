"""An OpenEnv server's environment as schedrl episodes (`pip install 'schedrl[openenv]'`).

    task: {name: openenv, args: {url: "http://127.0.0.1:8000", observation_field: message}}
    env: openenv
    env_args: {action_field: guess, pool: 8}

OpenEnv (`openenv-core`) serves an environment over HTTP and WebSocket: `reset(seed)`, `step(action)`,
each answered with an observation, a reward and `done`. An episode is one WebSocket session (one
environment instance on the server, as OpenEnv's own client opens; the HTTP endpoints build a fresh
environment per request and keep no episode). Each model turn becomes an action: `{action_field: text}`
(the server's action model parses and validates it), or, without `action_field`, the JSON object the
turn holds. An action the server refuses (its validation error) is the turn's outcome: the observation
says so, with reward 0, and the episode goes on. An observation is its `observation_field` as text, or
the whole observation as JSON. A server that does not answer within `task.env_timeout_s` ends the
episode with reward 0, counted in `env_errors` (the episode runner's timeout).

Tasks are reset seeds, as with the `gym` adapter: about 10% of seeds are held out by hash, and each
task's prompt is the server's first observation from its seed (one session opened to read them), so a
group's episodes start from one state. `pool` keeps that many connected sessions warm
(`schedrl.envs.sessions`): a session given back is kept, since the next episode's `reset` starts its
environment afresh.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from schedrl.envs.base import Task, task_id
from schedrl.envs.environment import Observation, StepResult
from schedrl.envs.gym_adapter import reset_seeds
from schedrl.envs.sessions import SessionPool, pool_for

INVALID = "VALIDATION_ERROR"  # the code of OpenEnv's error for an action its model refuses
JSON_OBJECT = re.compile(r"\{.*\}", re.S)


def client_class() -> Any:
    try:
        from openenv.core import GenericEnvClient
    except ImportError as err:
        raise ImportError("the openenv environment needs OpenEnv: pip install 'schedrl[openenv]'") from err
    return GenericEnvClient


async def connect(url: str, timeout_s: float) -> Any:
    """A connected OpenEnv client (one session, one environment on the server); errors name the URL."""
    client = client_class()(base_url=url, connect_timeout_s=timeout_s)
    try:
        await client.connect()
    except Exception as err:
        raise ConnectionError(f"OpenEnv server {url!r}: cannot connect: {err}") from None
    return client


def observation_text(obs: Any, field: str | None, url: str) -> str:
    if field is None:
        return json.dumps(obs, sort_keys=True)
    if not isinstance(obs, Mapping) or field not in obs:
        keys = ", ".join(sorted(obs)) if isinstance(obs, Mapping) else type(obs).__name__
        raise ValueError(f"OpenEnv server {url!r}: its observation has no field {field!r} (it has: {keys})")
    return str(obs[field])


class OpenEnvTasks:
    """Reset seeds of an OpenEnv server's environment as tasks (module doc)."""

    name = "openenv"

    def __init__(
        self,
        url: str,
        observation_field: str | None = None,
        connect_timeout_s: float = 10.0,
        max_seed: int = 2**31 - 1,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://", "ws://", "wss://")):
            raise ValueError(
                f"task 'openenv': url must be the server's http(s):// or ws(s):// address, got {url!r}"
            )
        self.url, self.observation_field = url, observation_field
        self.connect_timeout_s, self.max_seed = connect_timeout_s, max_seed

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        seeds = reset_seeds(self.url, split, n, seed, self.max_seed)
        prompts = asyncio.run(self._first_observations(seeds))
        return [
            Task(task_id("openenv", f"{self.url}:{s}"), p, "", "openenv", metadata={"seed": s})
            for s, p in zip(seeds, prompts, strict=True)
        ]

    async def _first_observations(self, seeds: Sequence[int]) -> list[str]:
        client = await connect(self.url, self.connect_timeout_s)
        try:
            return [self.text((await client.reset(seed=s)).observation) for s in seeds]
        finally:
            await client.close()

    def text(self, obs: Any) -> str:
        return observation_text(obs, self.observation_field, self.url)

    def reward(self, task: Task, completion: str) -> float:
        raise ValueError(
            "task 'openenv' is rewarded by its server's steps: run it with task.env: openenv, not single_turn"
        )

    def solution(self, task: Task) -> str:
        raise ValueError("task 'openenv' has no reference solutions: set sft.steps: 0")


class OpenEnvEnv:
    """One episode on an OpenEnv server over one session (module doc)."""

    def __init__(
        self, source: Any, action_field: str | None = None, stop: Sequence[str] = (), pool: int = 0
    ) -> None:
        if not isinstance(source, OpenEnvTasks):
            raise ValueError(f"env 'openenv' runs the 'openenv' task's server, got task {source.name!r}")
        client_class()  # a missing package is named when the run is built
        self.source, self.action_field, self.stop_strings = source, action_field, tuple(stop)
        self.pool_size = pool
        self.client: Any = None
        self.pool: SessionPool | None = None
        self.broken = False  # a call failed or was cut mid-way: the session may hold a stale answer

    def _pool(self) -> SessionPool:
        url, timeout = self.source.url, self.source.connect_timeout_s

        async def start() -> Any:
            return await connect(url, timeout)

        async def close(client: Any) -> None:
            await client.close()

        async def keep(client: Any) -> None:  # the next episode's reset starts its environment afresh
            return None

        return pool_for(("openenv", url), lambda: SessionPool(start, close, self.pool_size, keep))

    async def reset(self, task: Task, seed: int) -> Observation:
        await self.close()
        self.pool = self._pool()
        self.client, self.broken = await self.pool.acquire(), False
        try:
            result = await self.client.reset(seed=int(task.metadata["seed"]))
        except BaseException:
            self.broken = True
            raise
        return Observation(self.source.text(result.observation), "template")

    def action(self, text: str) -> dict[str, Any]:
        """The turn's text as the server's action: `{action_field: text}`, or the JSON object it holds."""
        if self.action_field is not None:
            return {self.action_field: text.strip().rstrip("".join(self.stop_strings)).strip()}
        m = JSON_OBJECT.search(text)
        try:
            out = json.loads(m.group()) if m else None
        except json.JSONDecodeError:
            out = None
        return out if isinstance(out, dict) else {}

    async def step(self, action: str) -> StepResult:
        try:
            result = await self.client.step(self.action(action))
        except RuntimeError as err:
            if INVALID not in str(err):
                self.broken = True
                raise
            return StepResult(Observation("invalid action", "env"), 0.0, done=False, info={"invalid": 1})
        except BaseException:  # cut by the runner's timeout, or the connection failed: not reused
            self.broken = True
            raise
        done = bool(result.done)
        obs = None if done else Observation(self.source.text(result.observation), "env")
        reward = None if result.reward is None else float(result.reward)
        return StepResult(obs, reward, done)

    async def close(self) -> None:
        if self.client is not None and self.pool is not None:
            client, self.client = self.client, None
            await self.pool.release(client, healthy=not self.broken)
