"""Repair turns on the scheduling text tasks: each infeasible answer is told its first violation, the
reward is the answer's own, discounted per earlier attempt, and the feedback is context, never trained."""

from __future__ import annotations

import asyncio

import pytest

from schedrl.engine import EngineConfig, HFEngine
from schedrl.envs import make_env, make_task
from schedrl.envs.base import Task
from schedrl.envs.environment import Observation
from schedrl.rollout.episodes import EpisodeRunner
from schedrl.types import Request, SamplingParams

PROJECT = """rcpsp
durations: 2 3 1
resources: 0 1 0
precedence: 0<2
downtime: r1@0-1
window: 2@2-6
disjunctive: 0~1
starts="""


def play(env, task, answers):
    async def run():
        await env.reset(task, 0)
        return [await env.step(a) for a in answers]

    return asyncio.run(run())


def test_each_infeasible_answer_is_told_its_violation_until_a_feasible_one():
    task = Task("t", PROJECT, "0,2,3", "rcpsp")
    env = make_env("repair", make_task("rcpsp"), max_attempts=3, repair_discount=0.5)
    first, second, third = play(env, task, ["0,2,1", "0,1,2", "0,2,3"])
    assert first.observation == Observation(
        "\nprecedence: activity 2 starts at 1, before activity 0 ends at 2\nstarts=", "env"
    )
    assert second.observation == Observation("\ndisjunctive: activities 0 and 1 overlap\nstarts=", "env")
    assert first.reward is None and not first.done and not second.done
    assert third.done and not third.truncated and third.observation is None
    assert third.reward == pytest.approx(0.25)  # feasible on the third attempt: 1 x 0.5^2
    assert third.info == {"attempts": 3, "first_violation": "precedence"}
    # right the first time: the whole reward, one turn
    (only,) = play(env, task, ["0,2,3"])
    assert only.done and only.reward == 1.0 and only.info["attempts"] == 1


def test_the_last_attempt_ends_the_episode_with_its_own_grade():
    task = Task("t", PROJECT, "0,2,3", "rcpsp")
    feasible = make_env("repair", make_task("rcpsp"), max_attempts=2)
    garbage, last = play(feasible, task, ["ten thousand" * 1000, "0,1,2"])
    assert garbage.observation.text == "\nparse: not a schedule\nstarts=" and not garbage.done
    assert last.done and last.truncated and last.reward == 0.0
    partial = make_env("repair", make_task("rcpsp", reward="partial"), max_attempts=2, repair_discount=0.5)
    _, last = play(partial, task, ["0,0,1", "0,1,2"])
    assert last.reward == pytest.approx(0.5 * 3 / 4)  # one of four constraints broken, second attempt
    assert last.info["first_violation"] == "precedence"


def test_a_single_line_task_is_cued_with_its_equals_sign():
    source = make_task("lis", min_len=4, max_len=4)
    task = source.sample("eval", 1, seed=0)[0]
    wrong, right = play(make_env("repair", source), task, ["x", source.solution(task)])
    assert wrong.observation.text == "\nparse: not a schedule\n=" and right.reward == 1.0


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="task 'addition' has no verifier that names violations"):
        make_env("repair", make_task("addition"))
    with pytest.raises(ValueError, match="max_attempts must be an int >= 1, got 0"):
        make_env("repair", make_task("rcpsp"), max_attempts=0)
    with pytest.raises(ValueError, match=r"repair_discount must be in \(0, 1\], got 0.0"):
        make_env("repair", make_task("rcpsp"), repair_discount=0.0)
    with pytest.raises(ValueError, match="environment 'repair': cannot build it with"):
        make_env("repair", make_task("rcpsp"), attempts=2)


def test_episodes_on_a_real_model_carry_the_feedback_as_untrained_context(model, tokenizer):
    source = make_task("rcpsp")
    tasks = source.sample("eval", 3, seed=1)
    runner = EpisodeRunner(
        HFEngine(model, tokenizer, EngineConfig(max_concurrency=4)),
        tokenizer,
        lambda: make_env("repair", source, max_attempts=3),
        max_turns=3,
        max_turn_tokens=6,
    )
    requests = [
        Request(f"r{i}", tuple(tokenizer(t.prompt).input_ids), SamplingParams(18, seed=i), task_id=t.id)
        for i, t in enumerate(tasks)
    ]
    try:
        samples = runner.run(requests, {t.id: t for t in tasks})
    finally:
        runner.close()
    for s, t in zip(samples, tasks, strict=True):
        pairs = list(zip(s.token_ids, s.trained, s.turns, strict=True))
        feedback = tokenizer.decode([i for i, keep, _ in pairs if not keep])
        first = tokenizer.decode([i for i, keep, turn in pairs if keep and turn == 0])
        # the randomly initialised model never answers feasibly: every attempt but the last is told why
        assert s.reward == 0.0 and s.num_model_turns == 3 and feedback.count("\nstarts=") == 2
        assert feedback.startswith("\n" + source.judge(t, first).violation + "\nstarts=")
