"""Per-turn credit: returns-to-go, the one group baseline, token placement, and the rewards that feed them."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from schedrl.algos.turn_credit import per_token, returns_to_go, turn_advantages
from schedrl.api import resolve_config
from schedrl.config import ConfigError, config_from_dict
from schedrl.engine import EngineConfig, HFEngine
from schedrl.envs import make_env, make_task
from schedrl.orchestrate.update_batch import learner_advantages
from schedrl.rollout.episodes import EpisodeRunner
from schedrl.training.batch import collate, target_rows
from schedrl.types import Request, Sample, SamplingParams


def test_returns_to_go_in_closed_form():
    assert returns_to_go([0.2, 0.0, 1.0], 0.5) == pytest.approx([0.2 + 0.25, 0.5, 1.0])
    assert returns_to_go([0.2, 0.0, 1.0], 1.0) == pytest.approx([1.2, 1.0, 1.0])
    assert returns_to_go([1.0], 0.0) == [1.0]


def test_per_turn_baselines_in_closed_form_with_ended_trajectories_at_zero():
    # group 0: a 3-turn and a 1-turn trajectory; group 1: two 2-turn ones
    rewards = [[0.2, 0.0, 1.0], [0.0], [0.5, 0.5], [0.0, 0.0]]
    groups = torch.tensor([0, 0, 1, 1])
    adv = turn_advantages(rewards, groups, gamma=0.5, std_normalize=False)
    g = [0.45, 0.5, 1.0]  # returns-to-go of trajectory 0; trajectory 1 has G_0 = 0 and stops
    b = [(g[0] + 0.0) / 2, (g[1] + 0.0) / 2, (g[2] + 0.0) / 2]  # the stopped one counts 0 at turns 1, 2
    assert adv[0] == pytest.approx([g[t] - b[t] for t in range(3)])
    assert adv[1] == pytest.approx([0.0 - b[0]])
    b1 = [(0.75 + 0.0) / 2, (0.5 + 0.0) / 2]
    assert adv[2] == pytest.approx([0.75 - b1[0], 0.5 - b1[1]]) and adv[3] == pytest.approx([-b1[0], -b1[1]])
    scaled = turn_advantages(rewards, groups, gamma=0.5, std_normalize=True, eps=0.0)
    std0 = math.sqrt(((0.45 - b[0]) ** 2 + (0.0 - b[0]) ** 2) / 1)  # unbiased std of the group's G_0
    assert scaled[0] == pytest.approx([x / std0 for x in adv[0]])
    # every turn index of a group averages to zero: no turn is pushed down for coming late
    for t in range(2):
        assert adv[2][t] + adv[3][t] == pytest.approx(0.0)
    # the baseline of a turn is not a sum over the trajectory's own later turns: adding a fourth,
    # zero-reward turn to trajectory 0 leaves every earlier advantage of its group unchanged
    longer = turn_advantages(
        [[0.2, 0.0, 1.0, 0.0], [0.0]], torch.tensor([0, 0]), gamma=1.0, std_normalize=False
    )
    shorter = turn_advantages([[0.2, 0.0, 1.0], [0.0]], torch.tensor([0, 0]), gamma=1.0, std_normalize=False)
    assert longer[0][:3] == pytest.approx(shorter[0]) and longer[1] == pytest.approx(shorter[1])


def test_bad_discounts_and_empty_trajectories_are_refused():
    with pytest.raises(ValueError, match="turn discount must be in"):
        turn_advantages([[1.0]], torch.tensor([0]), gamma=1.5)
    with pytest.raises(ValueError, match="at least one turn reward"):
        turn_advantages([[]], torch.tensor([0]))
    with pytest.raises(ConfigError, match="'algo.turn_credit' must be one of broadcast, return_to_go"):
        resolve_config({"algo": {"turn_credit": "per_step"}})
    with pytest.raises(ConfigError, match="needs algo.advantage 'grpo'"):
        resolve_config({"algo": {"turn_credit": "return_to_go", "advantage": "reward"}})


def test_token_advantages_sit_where_collate_puts_the_completion():
    prompts, comps = [[1, 2, 3], [4]], [[5, 6, 7, 8], [9, 10]]
    turns = [[0, 0, 1, 1], [0, 0]]
    adv = [per_token([0.5, -1.0], turns[0]), per_token([2.0], turns[1])]
    assert adv[0] == [0.5, 0.5, -1.0, -1.0] and adv[1] == [2.0, 2.0]
    rows = target_rows(prompts, comps, adv)
    batch = collate(prompts, comps, pad_id=0)
    assert rows.shape == batch.mask.shape
    assert rows[batch.mask.bool()].tolist() == [0.5, 0.5, -1.0, -1.0, 2.0, 2.0]
    assert rows[~batch.mask.bool()].abs().sum() == 0


def _episode_sample(rewards, turns):
    n = len(turns)
    return Sample(
        "e", (1, 2), tuple(range(5, 5 + n)), (0.0,) * n, (0,) * n, "stop", SamplingParams(n),
        reward=sum(rewards), turns=tuple(turns), turn_rewards=tuple(rewards),
    )  # fmt: skip


def test_learner_advantages_broadcast_or_per_turn():
    samples = [_episode_sample([0.0, 1.0], [0, 0, 1, 1]), _episode_sample([0.0], [0, 0])]
    groups = torch.tensor([0, 0])
    adv = torch.tensor([0.7, -0.7])
    broadcast = config_from_dict({})
    assert torch.equal(learner_advantages(broadcast.algo, samples, groups, adv), adv)
    rtg = config_from_dict(
        {"algo": {"turn_credit": "return_to_go", "turn_discount": 0.5, "std_normalize": False}}
    )
    rows = learner_advantages(rtg.algo, samples, groups, adv)
    mask = collate([s.prompt_ids for s in samples], [s.token_ids for s in samples], 0).mask.bool()
    b0, b1 = (0.5 + 0.0) / 2, (1.0 + 0.0) / 2  # G = [0.5, 1.0] and [0.0]: turn 1 of the second counts 0
    assert rows[0][mask[0]].tolist() == pytest.approx([0.5 - b0, 0.5 - b0, 1.0 - b1, 1.0 - b1])
    assert rows[1][mask[1]].tolist() == pytest.approx([-b0, -b0])


def test_episodes_record_each_turns_reward_and_tokens(model, tokenizer):
    source = make_task("guess", high=15)
    tasks = source.sample("train", 4, seed=0)
    engine = HFEngine(model, tokenizer, EngineConfig(max_concurrency=4))
    runner = EpisodeRunner(
        engine, tokenizer, lambda: make_env("guess", source, max_guesses=3, consistent_reward=0.1), stop=(";",),
        max_turns=3, max_turn_tokens=4,
    )  # fmt: skip
    reqs = [
        Request(f"e{i}", tuple(tokenizer(t.prompt).input_ids), SamplingParams(12, seed=i), task_id=t.id)
        for i, t in enumerate(tasks)
    ]
    try:
        samples = runner.run(reqs, {t.id: t for t in tasks})
    finally:
        runner.close()
    for s in samples:
        assert s.turns is not None and s.turn_rewards is not None and len(s.turns) == len(s.token_ids)
        model_turns = {t for t, m in zip(s.turns, s.trained or (), strict=True) if m}
        assert len(s.turn_rewards) == len(model_turns)
        assert sum(s.turn_rewards) == pytest.approx(s.reward)
        # a guess inside or outside the range (or not a number), a win, or a lost last turn
        assert all(any(r == pytest.approx(v) for v in (0.1, -0.1, 1.0, 0.0)) for r in s.turn_rewards)


def test_guess_env_rewards_a_consistent_guess_and_penalises_a_wasted_one():
    env = make_env("guess", make_task("guess", high=63), consistent_reward=0.1)
    task = make_task("guess", high=63).sample("train", 1, seed=3)[0]
    secret = int(task.answer)

    async def play():
        await env.reset(task, 0)
        first = await env.step("0;" if secret > 0 else "63;")  # inside [0, 63]
        again = await env.step("0;" if secret > 0 else "63;")  # already ruled out
        return first, again

    first, again = asyncio.run(play())
    assert first.reward == pytest.approx(0.1) and again.reward == pytest.approx(-0.1)


def test_tool_rewards_count_calls_that_ran_and_calls_that_did_not():
    source = make_task("calc", min_digits=2, max_digits=2, ops="*")
    env = make_env("tools", source, tools=["schedrl.envs.calc:calc"], call_reward=0.2)
    task = source.sample("train", 1, seed=0)[0]

    async def play():
        await env.reset(task, 0)
        good = await env.step("<<calc 12*3>>")
        bad = await env.step("<<nope 1>>")
        return good, bad

    good, bad = asyncio.run(play())
    assert good.reward == pytest.approx(0.2) and good.info["tools"] == ["ok"]
    assert bad.reward == pytest.approx(-0.2) and bad.info["tools"] != ["ok"]
