"""Every data scheduler: the budget is never exceeded, state survives save/load exactly, seeds are deterministic."""

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedrl.config import ConfigError, config_from_dict
from schedrl.data import SCHEDULERS, DataContext, DataScheduler, ScoredGroup, make_scheduler
from schedrl.envs import make_task

SOURCE = make_task("tiered")
ARGS = {name: ({} if name == "uniform" else {"pool_size": 48}) for name in SCHEDULERS}


def build(name, seed=0, group_size=4, steps=20, **extra):
    return make_scheduler(name, DataContext(SOURCE, seed, group_size, steps), **{**ARGS[name], **extra})


def fake_groups(batch, rng):
    """Scored groups with random 0/1 rewards and GRPO-like advantages (r - mean)."""
    out = []
    for task, n in batch:
        rewards = [float(rng.random() < 0.4) for _ in range(n)]
        mean = sum(rewards) / n
        out.append(ScoredGroup(task, tuple(rewards), tuple(r - mean for r in rewards), tokens=3 * n))
    return out


def run(sched, steps, budget, seed=0):
    rng, batches = random.Random(seed), []
    for _ in range(steps):
        batch = sched.next_batch(budget)
        batches.append([(t.id, n) for t, n in batch])
        sched.observe(fake_groups(batch, rng))
    return batches


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_protocol(name):
    assert isinstance(build(name), DataScheduler)


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
@settings(max_examples=8, deadline=None)
@given(budget=st.integers(4, 80), group_size=st.integers(2, 8), seed=st.integers(0, 3))
def test_budget_never_exceeded(name, budget, group_size, seed):
    sched = build(name, seed=seed, group_size=min(group_size, budget))
    rng = random.Random(seed)
    for _ in range(6):
        batch = sched.next_batch(budget)
        assert batch and all(isinstance(n, int) and n >= 1 for _, n in batch)
        assert sum(n for _, n in batch) <= budget
        sched.observe(fake_groups(batch, rng))


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_state_survives_save_and_load(name):
    a = build(name)
    run(a, 5, 32)
    saved = json.loads(json.dumps(a.state_dict()))  # as a checkpoint's state.json holds it
    b = build(name)
    b.load_state_dict(saved)
    assert b.state_dict() == a.state_dict()
    assert run(b, 4, 32, seed=9) == run(a, 4, 32, seed=9)  # and it goes on identically


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_seeded_runs_are_deterministic(name):
    assert run(build(name, seed=3), 5, 32) == run(build(name, seed=3), 5, 32)
    assert run(build(name, seed=3), 5, 32) != run(build(name, seed=4), 5, 32)


def test_small_budget_is_refused_with_the_value():
    with pytest.raises(ValueError, match="'coba': budget must be an int >= 2, got 1"):
        build("coba").next_batch(1)
    with pytest.raises(ValueError, match="'uniform': budget must be an int >= 4, got 3"):
        build("uniform").next_batch(3)


def test_config_errors_name_the_field():
    with pytest.raises(
        ConfigError, match="'data.scheduler' must be one of coba, difficulty_profile, .*got 'nope'"
    ):
        config_from_dict({"data": {"scheduler": "nope"}})
    with pytest.raises(
        ConfigError, match="'data.args'.*unknown argument 'bogus'; valid arguments: pool_size"
    ):
        config_from_dict({"data": {"scheduler": "coba", "args": {"bogus": 1}}})
    with pytest.raises(ConfigError, match="'data.args'.*'coba': min_group must be an int >= 2, got 1"):
        config_from_dict({"data": {"scheduler": "coba", "args": {"min_group": 1}}})
    cfg = config_from_dict({"data": {"scheduler": "paced", "args": {"tau": 0.3}}})
    assert cfg.data.scheduler == "paced" and cfg.data.args == {"tau": 0.3}


def test_variable_group_sizes_through_requests_and_advantages(tokenizer):
    import torch

    from schedrl.algos import registry
    from schedrl.data import scored_groups
    from schedrl.rollout import group_index, group_requests
    from schedrl.types import Sample, SamplingParams

    tasks = SOURCE.sample("train", 3, 0)
    params = SamplingParams(4)
    same = group_requests(tasks, tokenizer, params, 2, seed=0, step=5)
    assert group_requests(tasks, tokenizer, params, [2, 2, 2], seed=0, step=5) == same  # one count == a list
    requests = group_requests(tasks, tokenizer, params, [3, 1, 2], seed=0, step=5)
    assert [r.group_id for r in requests] == ["train/5/0"] * 3 + ["train/5/1"] + ["train/5/2"] * 2
    with pytest.raises(ValueError, match="group_size must be an int >= 1 or one per task"):
        group_requests(tasks, tokenizer, params, [3, 0, 2], seed=0, step=5)
    samples = [
        Sample(
            r.id, r.prompt_ids, (1,), (0.0,), (0,), "stop", r.params, task_id=r.task_id, group_id=r.group_id
        )
        for r in requests
    ]
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    adv = registry.get("advantage", "grpo")(rewards, group_index(samples), std_normalize=False)
    # group 0: mean 1/3 -> (2/3, -1/3, -1/3); group 1 (one sample): 0; group 2: mean 1/2 -> (1/2, -1/2)
    assert adv.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0, 0.5, -0.5])
    groups = scored_groups(tasks, samples, rewards, adv)
    assert [g.task.id for g in groups] == [t.id for t in tasks]
    assert [len(g.rewards) for g in groups] == [3, 1, 2] and groups[1].mean_abs_advantage == 0.0
    assert groups[0].accuracy == pytest.approx(1 / 3) and groups[0].tokens == 3
