"""Every data scheduler: the budget is never exceeded, state survives save/load exactly, seeds are
deterministic, and its arguments are a checked, documented `Args` record."""

import dataclasses
import inspect
import json
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedrl.data import SCHEDULERS, DataContext, DataScheduler, ScoredGroup, check_args, make_scheduler
from schedrl.data.e2h import EasyToHardScheduler
from schedrl.data.paced import PacedScheduler
from schedrl.envs import make_task
from schedrl.registry import args_type

SOURCE = make_task("tiered")
SOURCES = {"self_play": make_task("search_qa")}  # a task with proposer and solver roles
ARGS = {name: ({} if name == "uniform" else {"pool_size": 48}) for name in SCHEDULERS}
ARGS["self_play"] = {"bank_size": 100}


def build(name, seed=0, group_size=4, steps=20, **extra):
    ctx = DataContext(SOURCES.get(name, SOURCE), seed, group_size, steps)
    return make_scheduler(name, ctx, **{**ARGS[name], **extra})


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


def test_argument_errors_name_scheduler_argument_and_value():
    with pytest.raises(
        ValueError, match="unknown data scheduler 'nope'; valid schedulers: coba, difficulty_profile"
    ):
        check_args("nope", {})
    with pytest.raises(
        ValueError, match="data scheduler 'coba': unknown argument 'bogus'; valid: pool_size, .*candidates"
    ):
        check_args("coba", {"bogus": 1})
    with pytest.raises(
        ValueError, match="data scheduler 'coba': argument 'min_group' must be an int >= 2, got 1"
    ):
        check_args("coba", {"min_group": 1})
    with pytest.raises(ValueError, match="data scheduler 'paced': argument 'tau' must be float, got 'high'"):
        make_scheduler("paced", DataContext(SOURCE, 0, 4, 20), tau="high")
    with pytest.raises(ValueError, match="data scheduler 'uniform' takes no arguments, got pool_size"):
        check_args("uniform", {"pool_size": 8})
    assert check_args("paced", {"tau": 0.3}) == PacedScheduler.Args(tau=0.3)
    assert check_args("uniform", {}) is None


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        (
            "zero_variance",
            {"acc_low": 0.5, "acc_high": 0.5},
            "argument 'acc_high' must be > acc_low .0.5., got 0.5",
        ),
        ("coba", {"min_group": 4, "max_group": 3}, "argument 'max_group' must be an int >= 4, got 3"),
        (
            "difficulty_profile",
            {"unsolvable_p": 0.95},
            r"argument 'unsolvable_p' must be a number in \[0, 0.9\]",
        ),
        ("dump_ucb", {"tau": 0.0}, r"argument 'tau' must be a number > 0, got 0.0"),
        ("domain_reweight", {"pool_size": 0}, "argument 'pool_size' must be an int >= 1, got 0"),
        ("e2h", {"order": ["A", 1]}, "argument 'order' must be"),
    ],
)
def test_values_are_checked_with_the_argument_and_value(name, args, message):
    with pytest.raises(ValueError, match=f"data scheduler '{name}': {message}"):
        SCHEDULERS.check(name, args)


def field_comments(args_cls) -> set[str]:
    """The fields of `args_cls` (and the `Args` it extends) declared with a `# comment` on their line."""
    source = "\n".join(inspect.getsource(c) for c in args_cls.__mro__ if "__dataclass_fields__" in vars(c))
    return set(re.findall(r"^\s*(\w+): [^#\n]+# \S", source, re.MULTILINE))


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_scheduler_declares_its_arguments(name):
    cls = SCHEDULERS.get(name)
    args_cls = args_type(cls)
    if args_cls is None:  # takes no arguments: its constructor takes the context alone
        assert list(inspect.signature(cls).parameters) == ["ctx"] and SCHEDULERS.check(name, {}) is None
        return
    assert args_cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    fields = dataclasses.fields(args_cls)
    assert all(f.default is not dataclasses.MISSING for f in fields)  # so check(name, {}) needs nothing
    assert {f.name for f in fields} <= field_comments(args_cls)  # each argument says what it is
    assert list(inspect.signature(cls).parameters) == ["ctx", "args"]
    assert SCHEDULERS.check(name, {}) == args_cls()
    checked = SCHEDULERS.check(name, ARGS[name])
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(checked, fields[0].name, 1)


def test_args_are_given_as_a_record_too():
    ctx = DataContext(SOURCE, 0, 4, 20)
    direct = PacedScheduler(ctx, PacedScheduler.Args(pool_size=48, tau=0.3))
    assert direct.tau == 0.3 and direct.pool_size == 48
    assert SCHEDULERS.build("paced", PacedScheduler.Args(pool_size=48, tau=0.3), ctx).state_dict() == (
        direct.state_dict()
    )
    assert EasyToHardScheduler.Args(order=["b", "a"]).order == ("b", "a")  # type: ignore[arg-type]


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
