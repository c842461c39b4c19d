"""An `Environment` as a Gymnasium environment with text observations and actions.

    env = TextEnv(make_env("tools", source, tools=["schedrl.envs.calc:calc"]), source)
    obs, info = env.reset(seed=0)           # the task's prompt
    obs, reward, terminated, truncated, info = env.step("<<calc 12*34>>")

Each `reset` draws a task from the source's split with the Gymnasium seed, so a seed fixes the
episode; the asynchronous environment runs on the wrapper's own event loop. It passes
`gymnasium.utils.env_checker.check_env`.

Importing this module registers the guess game as the Gymnasium id `schedrl/Guess-v0` (`guess_text_env`);
`gymnasium.make("schedrl.envs.gym_text:schedrl/Guess-v0")` imports it first.
"""

from __future__ import annotations

import asyncio
import string
from typing import Any

import gymnasium
from gymnasium import spaces

from schedrl.envs.base import TaskSource
from schedrl.envs.environment import Environment

CHARSET = string.printable


class TextEnv(gymnasium.Env):
    metadata = {"render_modes": []}

    def __init__(
        self, env: Environment, source: TaskSource, split: str = "train", max_length: int = 4096
    ) -> None:
        self.env, self.source, self.split, self.max_length = env, source, split, max_length
        self.observation_space = spaces.Text(max_length, min_length=0, charset=CHARSET)
        self.action_space = spaces.Text(max_length, min_length=0, charset=CHARSET)
        self._loop = asyncio.new_event_loop()

    def _text(self, text: str) -> str:
        return "".join(c for c in text if c in CHARSET)[: self.max_length]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        task_seed = int(self.np_random.integers(0, 2**31 - 1))
        (task,) = self.source.sample(self.split, 1, task_seed)
        obs = self._loop.run_until_complete(self.env.reset(task, task_seed))
        return self._text(obs.text), {"task_id": task.id}

    def solution(self, seed: int) -> str:
        """The source's reference answer (or transcript) for the episode `reset(seed=seed)` starts: what
        a schedrl `gym` task's SFT warm-up trains on."""
        from gymnasium.utils.seeding import np_random

        rng, _ = np_random(seed)
        (task,) = self.source.sample(self.split, 1, int(rng.integers(0, 2**31 - 1)))
        return self.source.solution(task)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        result = self._loop.run_until_complete(self.env.step(action))
        obs = self._text(result.observation.text) if result.observation is not None else ""
        done = result.done and not result.truncated
        return obs, float(result.reward or 0.0), done, bool(result.truncated), dict(result.info)

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.run_until_complete(self.env.close())
            self._loop.close()


def guess_text_env(high: int = 63, max_guesses: int = 8, consistent_reward: float = 0.0) -> TextEnv:
    """The guess task's higher/lower game (`schedrl.envs.guess`) as a Gymnasium text environment."""
    from schedrl.envs.guess import GuessEnv, GuessTask

    source = GuessTask(high)
    return TextEnv(GuessEnv(source, max_guesses, consistent_reward), source)


GUESS_ID = "schedrl/Guess-v0"
if GUESS_ID not in gymnasium.registry:
    gymnasium.register(GUESS_ID, entry_point="schedrl.envs.gym_text:guess_text_env")
