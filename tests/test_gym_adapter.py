"""Gymnasium text environments through the `gym` adapter: an episode equals driving the Gymnasium
environment by hand; a task is a reset seed whose prompt is the first observation (a group starts from
one state); the environment's reference transcript wins; train and eval seeds are apart; bad ids, text
that is not text, and a task without solutions are named; a run trains on it."""

from __future__ import annotations

import asyncio

import gymnasium
import pytest
from gymnasium import spaces

from schedrl.envs import make_env, make_task
from schedrl.envs.gym_adapter import GymEnv, GymTasks

GUESS = "schedrl.envs.gym_text:schedrl/Guess-v0"
KWARGS = {"high": 63, "max_guesses": 6, "consistent_reward": 0.1}


def turns_of(transcript: str) -> list[str]:
    """The model turns of a guess transcript ("31;+47;-39;"): each guess with its ';'."""
    return [t.lstrip("+-") + ";" for t in transcript.split(";") if t]


def by_hand(seed: int, actions: list[str]) -> list[tuple]:
    env = gymnasium.make(GUESS, **KWARGS)
    obs, _ = env.reset(seed=seed)
    out: list = [obs]
    for a in actions:
        obs, reward, terminated, truncated, _ = env.step(a)
        out.append((None if terminated or truncated else obs, reward, terminated or truncated))
        if terminated or truncated:
            break
    env.close()
    return out


def adapted(source: GymTasks, task, actions: list[str]) -> list[tuple]:
    env = make_env("gym", source, stop=[";"])

    async def play():
        obs = await env.reset(task, seed=12345)  # the episode's own seed: the task's seed decides
        out: list = [obs.text]
        for a in actions:
            r = await env.step(a)
            out.append((None if r.observation is None else r.observation.text, r.reward, r.done))
            if r.done:
                break
        await env.close()
        return out

    return asyncio.run(play())


def test_an_episode_equals_driving_gymnasium_by_hand():
    source = make_task("gym", id=GUESS, kwargs=KWARGS)
    assert isinstance(source, GymTasks)
    for task in source.sample("train", 3, seed=0):
        seed = task.metadata["seed"]
        wrong = ["1;", "62;", "x;", "30;", "31;", "33;"]
        assert adapted(source, task, wrong) == by_hand(seed, wrong)
        solution = turns_of(source.solution(task))
        played = adapted(source, task, solution)
        assert played == by_hand(seed, solution) and played[-1][1:] == (1.0, True)  # the transcript wins
        assert played[0] == task.prompt  # the prompt is the first observation


def test_tasks_are_reset_seeds_split_by_hash():
    source = GymTasks(GUESS, KWARGS)
    train, again, held = (source.sample(s, 50, seed=1) for s in ("train", "train", "eval"))
    assert [t.id for t in train] == [t.id for t in again]  # deterministic
    assert not {t.metadata["seed"] for t in train} & {t.metadata["seed"] for t in held}
    assert all(t.prompt.startswith("guess 0-63") for t in train + held)


class NoSolution(gymnasium.Env):
    observation_space = spaces.Text(16)
    action_space = spaces.Text(16)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "hello", {}

    def step(self, action):
        return "", 0.0, True, False, {}


gymnasium.register("schedrl-test/NoSolution-v0", entry_point=f"{__name__}:NoSolution")


def test_bad_environments_are_named():
    with pytest.raises(ValueError, match=r"gym environment 'schedrl-test/Nothing-v0': .*Nothing"):
        GymTasks("schedrl-test/Nothing-v0").sample("train", 1, 0)
    with pytest.raises(ValueError, match=r"'CartPole-v1': observations must be text, got ndarray"):
        GymTasks("CartPole-v1").sample("train", 1, 0)
    plain = GymTasks("schedrl-test/NoSolution-v0")
    (task,) = plain.sample("train", 1, 0)
    with pytest.raises(ValueError, match=r"has no reference solutions .* set sft.steps: 0"):
        plain.solution(task)
    with pytest.raises(ValueError, match=r"rewarded by its environment's steps: run it with task.env: gym"):
        plain.reward(task, "x")
    with pytest.raises(ValueError, match=r"env 'gym' runs the 'gym' task's environments, got task 'sort'"):
        GymEnv(make_task("sort"))


@pytest.mark.train
def test_a_run_trains_on_a_gymnasium_environment(tmp_path):
    import schedrl
    from schedrl.training.run_dir import read_metrics

    cfg = {
        "steps": 2, "save_every": 0, "out_dir": str(tmp_path), "name": "gym", "sft": {"steps": 10},
        "eval": {"tasks": 4, "k": 1}, "min_start_reward": -1.0, "logging": {"backends": ["jsonl"]},
        "task": {"name": "gym", "args": {"id": GUESS, "kwargs": KWARGS}, "env": "gym",
                 "env_args": {"stop": [";"]}, "max_turns": 6, "max_observation_tokens": 4},
        "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 24},
    }  # fmt: skip
    result = schedrl.train(cfg)
    rows = [r for r in read_metrics(tmp_path / "gym" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(r["turns_mean"] >= 1 for r in rows)
    assert 0.0 <= result.eval_after["pass@1"] <= 1.0
