"""The environment protocol: a single-turn task is the one-step environment with the task's own reward,
and environments load by dotted path with errors that name it."""

from __future__ import annotations

import asyncio

import pytest

from schedrl.envs import make_task
from schedrl.envs.environment import Environment, Observation, SingleTurnEnv, StepResult, load_environment


class Countdown:
    """A test environment: say the numbers from the task's answer down to 1, one per turn."""

    stop_strings = ()

    def __init__(self, start: int = 3) -> None:
        self.start, self.next = start, start

    async def reset(self, task, seed: int) -> Observation:
        self.next = self.start
        return Observation(f"count down from {self.start}")

    async def step(self, action: str) -> StepResult:
        if action.strip() != str(self.next):
            return StepResult(None, 0.0, done=True, info={"wrong": action})
        self.next -= 1
        if self.next == 0:
            return StepResult(None, 1.0, done=True)
        return StepResult(Observation("next"), None, done=False)

    async def close(self) -> None:
        return None


def test_single_turn_env_is_the_task_with_its_reward():
    source = make_task("addition")
    (task,) = source.sample("train", 1, seed=0)

    async def episode(action: str):
        env = SingleTurnEnv(source)
        first = await env.reset(task, seed=0)
        result = await env.step(action)
        await env.close()
        return first, result

    first, right = asyncio.run(episode(f" {task.answer} "))
    assert first == Observation(task.prompt, "template")
    assert right == StepResult(None, source.reward(task, task.answer), done=True) and right.reward == 1.0
    assert asyncio.run(episode("nonsense"))[1].reward == 0.0
    assert isinstance(SingleTurnEnv(source), Environment)


def test_a_multi_turn_environment_runs_by_the_protocol():
    async def play(actions):
        env = load_environment("tests.test_environment:Countdown", start=3)
        await env.reset(None, seed=0)
        results = [await env.step(a) for a in actions]
        await env.close()
        return results

    results = asyncio.run(play(["3", "2", "1"]))
    assert [r.done for r in results] == [False, False, True] and results[-1].reward == 1.0
    assert asyncio.run(play(["3", "7"]))[-1] == StepResult(None, 0.0, done=True, info={"wrong": "7"})


def test_load_environment_errors_name_the_path():
    with pytest.raises(ValueError, match=r"environment 'tests.nope:Env': cannot import module 'tests.nope'"):
        load_environment("tests.nope:Env")
    with pytest.raises(ValueError, match=r"environment 'tests.test_environment:Countdown': cannot build it"):
        load_environment("tests.test_environment:Countdown", bogus=1)
    with pytest.raises(ValueError, match=r"'tests.test_environment:Observation'.*is not an Environment"):
        load_environment("tests.test_environment:Observation", text="x")


@pytest.mark.parametrize("env_name", ["single_turn", "tools"])
def test_gymnasium_wrapper_passes_the_env_checker(env_name):
    from gymnasium.utils.env_checker import check_env

    from schedrl.envs import make_env
    from schedrl.envs.gym_text import TextEnv

    source = make_task("calc", min_digits=2, max_digits=2)
    args = {"tools": ["schedrl.envs.calc:calc"]} if env_name == "tools" else {}
    env = TextEnv(make_env(env_name, source, **args), source)
    check_env(env, skip_render_check=True)
    obs, info = env.reset(seed=3)
    assert env.reset(seed=3) == (obs, info) and obs.endswith("=") and info["task_id"].startswith("calc-")
    a, b = obs.removesuffix("=").split("*")
    if env_name == "tools":
        obs, reward, terminated, truncated, info = env.step(f"<<calc {a}*{b}>>")
        assert (obs, reward, terminated, info) == (f"[{int(a) * int(b)}]", 0.0, False, {"tools": ["ok"]})
    obs, reward, terminated, truncated, _ = env.step(str(int(a) * int(b)))
    assert (obs, reward, terminated, truncated) == ("", 1.0, True, False)
    env.close()
