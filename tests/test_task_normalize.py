"""AgentRL's task-level advantage normalisation: closed form, its gradient-free contract, a multi-task
batch where one task's reward scale no longer dominates, and a run on the tiered mix."""

from __future__ import annotations

import math

import pytest
import torch

from schedrl.algos.advantages import task_normalized


def test_task_normalized_in_closed_form():
    adv = torch.tensor([2.0, -2.0, 0.5, -0.5, 0.1, 7.0])
    task = torch.tensor([0, 0, 1, 1, 1, 2])
    out = task_normalized(adv, task, eps=1e-4)
    # task 0: mean 0, unbiased std sqrt(8) -> +-2/(sqrt 8 + eps)
    assert out[0].item() == pytest.approx(2 / (math.sqrt(8) + 1e-4)) and out[1].item() == pytest.approx(
        -out[0].item()
    )
    m = (0.5 - 0.5 + 0.1) / 3  # task 1
    sd = math.sqrt(sum((x - m) ** 2 for x in (0.5, -0.5, 0.1)) / 2)
    assert out[2:5].tolist() == pytest.approx([(x - m) / (sd + 1e-4) for x in (0.5, -0.5, 0.1)])
    assert out[5].item() == 0.0  # a task with one sample: nothing to compare it with
    with pytest.raises(ValueError, match="eps must be > 0"):
        task_normalized(adv, task, eps=0.0)


def test_a_tasks_reward_scale_no_longer_dominates():
    from schedrl.algos.advantages import group_advantages

    # two tasks, the second's rewards 100x the first's, groups of 2 (Dr. GRPO: no std division)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 100.0, 0.0, 100.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    task = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    raw = group_advantages(rewards, groups, std_normalize=False)
    assert raw[4].abs() / raw[0].abs() == pytest.approx(100.0)
    out = task_normalized(raw, task)
    assert out[4].item() == pytest.approx(out[0].item(), rel=1e-3)  # the same weight in the update


@pytest.mark.train
def test_a_run_on_a_multi_task_mix_normalises_by_task(tmp_path):
    import schedrl
    from schedrl.config import ConfigError
    from schedrl.training.run_dir import read_metrics

    cfg = {
        "steps": 2, "save_every": 0, "out_dir": str(tmp_path), "name": "mix", "sft": {"steps": 5},
        "eval": {"tasks": 0}, "min_start_reward": -1.0, "logging": {"backends": ["jsonl"]},
        "task": {"name": "tiered"}, "algo": {"task_normalize": True},
        "sampling": {"prompts_per_step": 8, "group_size": 4, "max_new_tokens": 8},
    }  # fmt: skip
    schedrl.train(cfg)
    assert len([r for r in read_metrics(tmp_path / "mix" / "metrics.jsonl") if "loss" in r]) == 2
    bad = {**cfg, "name": "bad", "algo": {"task_normalize": True, "turn_credit": "return_to_go"}}
    with pytest.raises(ConfigError, match=r"'algo.task_normalize' .* use broadcast"):
        schedrl.train(bad)


def test_the_update_batch_normalises_by_the_tasks_domain():
    from schedrl.algos.advantages import group_advantages
    from schedrl.config import AlgoConfig
    from schedrl.envs.base import Task
    from schedrl.orchestrate.buffer import Group
    from schedrl.orchestrate.staleness import StalenessBound
    from schedrl.orchestrate.update_batch import UpdateBatch
    from schedrl.types import Sample, SamplingParams

    def group(gid: str, domain: str, rewards: list[float]) -> Group:
        task = Task(gid, "p", "a", domain)
        g = Group(gid, task, [])
        for i, r in enumerate(rewards):
            g.done[i] = Sample(f"{gid}/{i}", (1,), (2,), (0.0,), (0,), "stop", SamplingParams(), text="x",
                               task_id=gid, group_id=gid, sample_index=i, reward=r)  # fmt: skip
        return g

    groups = [group("g0", "a", [1.0, 0.0]), group("g1", "a", [1.0, 1.0]), group("g2", "b", [50.0, 0.0, 20.0])]
    plain = UpdateBatch.of(groups, 0, StalenessBound(0), "drop", AlgoConfig(std_normalize=False))
    normed = UpdateBatch.of(
        groups, 0, StalenessBound(0), "drop", AlgoConfig(std_normalize=False, task_normalize=True)
    )
    raw = group_advantages(plain.rewards, plain.groups, std_normalize=False)
    assert plain.adv.tolist() == pytest.approx(raw.tolist())
    want = task_normalized(raw, torch.tensor([0, 0, 0, 0, 1, 1, 1]))
    assert normed.adv.tolist() == pytest.approx(want.tolist()) and normed.adv.tolist() != pytest.approx(
        raw.tolist()
    )
