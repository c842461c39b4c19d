"""ML-engineering agents' duration-aware updates: each episode's advantage weighed by its environment
time over the batch's mean (closed form), the time measured by the episode runner on both clocks, and the
`experiments` task whose best method on large data is the slowest."""

from __future__ import annotations

import asyncio

import pytest

from schedrl.config import AlgoConfig, ConfigError, config_from_dict
from schedrl.engine import HFEngine
from schedrl.envs import make_env, make_task
from schedrl.envs.base import Task
from schedrl.envs.experiments import ExperimentsEnv, ExperimentsTask, score
from schedrl.orchestrate.buffer import Group, sample_from_dict, sample_to_dict
from schedrl.orchestrate.staleness import StalenessBound
from schedrl.orchestrate.update_batch import UpdateBatch, duration_weights
from schedrl.rollout.clock import VirtualClock
from schedrl.rollout.episodes import EpisodeRunner
from schedrl.types import Request, Sample, SamplingParams


def _sample(i: int, reward: float, env_s: float | None) -> Sample:
    return Sample(
        f"s{i}", (1,), (2, 3), (-0.1, -0.2), (0, 0), "stop", SamplingParams(4), task_id="t", group_id="g",
        sample_index=i, reward=reward, trained=(True, True), turns=(0, 0), turn_rewards=(reward,), env_s=env_s,
    )  # fmt: skip


def test_duration_weights_in_closed_form():
    assert duration_weights([_sample(0, 0, 1.0), _sample(1, 0, 3.0)]).tolist() == pytest.approx([0.5, 1.5])
    assert duration_weights([_sample(0, 0, 0.0), _sample(1, 0, None)]).tolist() == [1.0, 1.0]  # no time


def test_a_slow_episode_s_advantage_is_amplified_and_a_fast_one_s_damped():
    # a group of four: two fast failures (0.1 s), a fast success (0.1 s) and a slow success (0.9 s)
    samples = [_sample(0, 0.0, 0.1), _sample(1, 0.0, 0.1), _sample(2, 1.0, 0.1), _sample(3, 1.0, 0.9)]
    group = Group("g", Task("t", "p", "", domain="d"), [None] * 4, done=dict(enumerate(samples)))
    plain = UpdateBatch.of([group], 0, StalenessBound(0), "drop", AlgoConfig())
    aware = UpdateBatch.of([group], 0, StalenessBound(0), "drop", AlgoConfig(duration_aware=True))
    # group advantages: rewards 0, 0, 1, 1 -> -+ 1/std (unbiased std 0.577) = -+0.866
    a = 0.5 / (1 / 3) ** 0.5
    assert plain.learner_adv.tolist() == pytest.approx([-a, -a, a, a], abs=1e-3)
    w = [0.1 / 0.3, 0.1 / 0.3, 0.1 / 0.3, 0.9 / 0.3]  # mean 0.3 s
    assert aware.learner_adv.tolist() == pytest.approx(
        [x * y for x, y in zip(plain.learner_adv.tolist(), w, strict=True)], abs=1e-3
    )
    assert aware.adv.tolist() == pytest.approx(plain.adv.tolist())  # what data schedulers see is unweighted
    rtg = UpdateBatch.of(
        [group], 0, StalenessBound(0), "drop", AlgoConfig(duration_aware=True, turn_credit="return_to_go")
    )
    assert rtg.learner_adv[3].abs().max() > 2 * rtg.learner_adv[2].abs().max()
    assert sample_from_dict(sample_to_dict(samples[3])).env_s == 0.9
    assert plain.record_metrics(StalenessBound(0), 0)["env_s_mean"] == pytest.approx(0.3)


def test_the_runner_measures_each_episode_s_environment_time(model, tokenizer):
    source = ExperimentsTask()
    tasks = source.sample("train", 4, seed=0)
    for clock in (None, VirtualClock(step_cost=lambda stats: 0.001)):
        runner = EpisodeRunner(
            HFEngine(model, tokenizer),
            tokenizer,
            lambda: ExperimentsEnv(source, unit_s=0.05),
            max_turns=1,
            clock=clock,
        )
        requests = [
            Request(f"e{i}", tuple(tokenizer(t.prompt).input_ids), SamplingParams(4, seed=i), task_id=t.id, group_id=f"g{i}")
            for i, t in enumerate(tasks)
        ]  # fmt: skip
        try:
            samples = runner.run(requests, {t.id: t for t in tasks})
        finally:
            runner.close()
        for s in samples:  # the random model's action is no method: one unit (0.05 s) of running
            assert s.env_s is not None and 0.05 <= s.env_s < (0.051 if clock else 0.5)


def test_the_experiments_task_s_best_method_and_its_time():
    src = make_task("experiments")
    tasks = src.sample("train", 200, seed=0)
    assert {t.metadata["rows_k"] for t in tasks} == set(range(1, 10))
    assert {src.solution(t) for t in tasks} == {"lin;", "knn;", "gbm;"}  # the warm-up shows all three
    for t in tasks:
        best = "gbm" if t.metadata["rows_k"] >= 5 else "lin"
        assert t.answer == best and src.reward(t, best + ";") == 1.0
        assert max(score(m, t.metadata["rows_k"]) for m in ("lin", "knn", "gbm")) == 1.0
    assert {t.id for t in src.sample("eval", 50, seed=0)}.isdisjoint(t.id for t in tasks)

    async def run(method):
        env = ExperimentsEnv(src, unit_s=0.0, slow=6)
        await env.reset(
            Task("x", "rows 7k:", "gbm", domain="experiments", metadata={"rows_k": 7, "variant": 0}), 0
        )
        return await env.step(method + ";")

    gbm, lin = asyncio.run(run("gbm")), asyncio.run(run("lin"))
    assert (gbm.reward, lin.reward, gbm.done) == (1.0, 0.4, True)
    env = ExperimentsEnv(src, unit_s=0.01, slow=6)
    assert [env.units(m) for m in ("lin", "knn", "gbm", "sql")] == [1, 2, 6, 1]


def test_bad_settings_are_named():
    with pytest.raises(ConfigError, match="'algo.duration_aware' .* needs a multi-turn task.env"):
        config_from_dict({"algo": {"duration_aware": True}})
    with pytest.raises(ValueError, match="unit_s"):
        make_env("experiments", ExperimentsTask(), unit_s=-1)
    with pytest.raises(ValueError, match="slow"):
        make_env("experiments", ExperimentsTask(), slow=0)
