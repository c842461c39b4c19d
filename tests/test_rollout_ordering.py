"""Length-aware admission order, the starvation guard, predictors, the ranker and Kendall's tau."""

import itertools
import random
from dataclasses import dataclass

import pytest
import torch

from schedrl.engine import EngineConfig, HFEngine
from schedrl.envs import make_task
from schedrl.rollout import (
    HistoryPredictor,
    LengthOrdered,
    RankerPredictor,
    SiblingPredictor,
    kendall_tau,
    make_admission,
    make_predictor,
)
from schedrl.rollout.ordering import LongestFirst, ShortestFirst
from schedrl.rollout.predictors import LengthPredictor
from schedrl.rollout.ranker import prompt_features
from schedrl.rollout.registry import ADMISSION
from schedrl.types import Request, Sample, SamplingParams

P = SamplingParams(max_new_tokens=64)


def req(rid, task=None, group=None, index=0, prompt=(5, 6)):
    return Request(rid, tuple(prompt), P, task_id=task, group_id=group, sample_index=index)


def finished(task, n, group=None, rid="old"):
    return Sample(rid, (5, 6), (1,) * n, (0.0,) * n, (0,) * n, "stop", P, task_id=task, group_id=group)


def history(lengths):
    pred = HistoryPredictor()
    for task, n in lengths.items():
        pred.on_finish(finished(task, n))
    return pred


def select_all(policy, queue, slots=100):
    return [queue[i].id for i in policy.select(queue, free_slots=slots, token_budget=10_000, num_running=0)]


@pytest.mark.parametrize(
    ("order", "expected"),
    [("fcfs", ["a", "b", "c", "d"]), ("lpt", ["c", "d", "a", "b"]), ("spt", ["b", "a", "d", "c"])],
)
def test_each_order_on_a_hand_made_queue(order, expected):
    pred = history({"ta": 10, "tb": 2, "tc": 40})  # td unseen: the prior, mean(10, 2, 40) = 17.3
    queue = [req("a", "ta"), req("b", "tb"), req("c", "tc"), req("d", "td")]
    assert pred.predict(queue[3]) == pytest.approx(52 / 3)
    assert select_all(LengthOrdered(order, pred), queue) == expected


def test_order_respects_slots_and_token_budget():
    policy = LengthOrdered("lpt", history({"ta": 10, "tb": 2, "tc": 40}))
    queue = [req("a", "ta"), req("b", "tb"), req("c", "tc", prompt=range(1, 30))]
    assert policy.select(queue, free_slots=2, token_budget=10_000, num_running=0) == [2, 0]
    policy = LengthOrdered("lpt", history({"ta": 10, "tb": 2, "tc": 40}))
    # c comes first, and c does not fit the token budget: nothing skips ahead of it
    assert policy.select(queue, free_slots=3, token_budget=10, num_running=0) == []


def test_sibling_probes_first_then_longest_group():
    pred = SiblingPredictor(SiblingPredictor.Args(default=5))
    policy = LengthOrdered("lpt", pred)
    queue = [req(f"{g}{i}", group=g, index=i) for g in "xyzw" for i in range(3)]
    assert select_all(policy, queue, slots=4) == ["x0", "y0", "z0", "w0"]  # one probe per group
    assert pred.predict(queue[1]) == 5  # nothing seen yet: the default prior
    # x's probe finished at 2 and w's at 12; y's probe has run 9 tokens so far and z's 4 (lower bounds)
    for k in range(1, 10):
        pred.on_token(queue[3], k, 0.0)
    for k in range(1, 5):
        pred.on_token(queue[6], k, 0.0)
    pred.on_finish(finished(None, 2, group="x", rid="x0"))
    pred.on_finish(finished(None, 12, group="w", rid="w0"))
    for n in (3, 6, 20, 30):  # realised lengths of earlier steps
        pred.on_finish(finished(None, n, group="old", rid=f"old{n}"))
    # y: mean of lengths > 9 = (12 + 20 + 30) / 3; z: mean of lengths > 4 = (6 + 12 + 20 + 30) / 4; w: 12; x: 2
    assert [pred.predict(queue[i]) for i in (4, 7, 10, 1)] == pytest.approx([62 / 3, 17, 12, 2])
    rest = [r for r in queue if r.id[1] != "0"]
    assert select_all(policy, rest) == ["y1", "y2", "z1", "z2", "w1", "w2", "x1", "x2"]
    # a group whose members have all finished is placed at its longest
    policy.select([req("v0", group="v")], free_slots=1, token_budget=100, num_running=0)
    pred.on_finish(finished(None, 9, group="v", rid="v0"))
    assert pred.predict(req("v1", group="v", index=1)) == 9


@pytest.mark.parametrize("order", ["fcfs", "lpt", "spt"])
def test_starvation_guard_admits_a_passed_over_request(order):
    """One slot per round; a fresh, better-ranked request arrives every round. Under spt the long
    request (and under lpt the short one) would wait forever; the guard admits it after max_wait_steps."""
    pred = history({"long": 50, "short": 1})
    policy = LengthOrdered(order, pred, max_wait_steps=5)
    victim = "short" if order == "lpt" else "long"
    other = "long" if order == "lpt" else "short"
    queue = [req("first", other), req("v", victim)]
    admitted_at = None
    for rnd in range(20):
        queue.append(req(f"n{rnd}", other))
        [i] = policy.select(queue, free_slots=1, token_budget=10_000, num_running=0)
        if queue.pop(i).id == "v":
            admitted_at = rnd
            break
    assert admitted_at is not None and admitted_at <= 5
    assert admitted_at == (1 if order == "fcfs" else 5)


def test_without_the_guard_spt_would_starve():
    """The same stream with a guard longer than the run: the long request is never admitted."""
    policy = LengthOrdered("spt", history({"long": 50, "short": 1}), max_wait_steps=10_000)
    queue = [req("v", "long")]
    for rnd in range(50):
        queue.append(req(f"n{rnd}", "short"))
        [i] = policy.select(queue, free_slots=1, token_budget=10_000, num_running=0)
        assert queue.pop(i).id != "v"


def test_lpt_in_the_engine_admits_longest_first_and_keeps_outputs(model, tokenizer):
    lengths = [3, 12, 1, 7, 20, 2]
    reqs = [
        Request(
            f"r{i}",
            tuple(tokenizer("12+3=").input_ids),
            SamplingParams(max_new_tokens=n, seed=i, ignore_eos=True),
            task_id=f"t{i}",
        )
        for i, n in enumerate(lengths)
    ]
    pred = history({f"t{i}": n for i, n in enumerate(lengths)})
    lpt = HFEngine(model, tokenizer, EngineConfig(max_concurrency=1), admission=LengthOrdered("lpt", pred))
    out = lpt.generate(reqs)
    fcfs = HFEngine(model, tokenizer, EngineConfig(max_concurrency=1)).generate(reqs)
    assert [s.token_ids for s in out] == [s.token_ids for s in fcfs]  # order changes timing, not tokens
    by_admission = sorted(out, key=lambda s: s.timings.admitted)
    assert [s.num_tokens for s in by_admission] == sorted(lengths, reverse=True)


def test_named_policy_is_built_and_bound_by_the_engine(model, tokenizer):
    engine = HFEngine(
        model,
        tokenizer,
        EngineConfig(max_concurrency=2),
        admission=make_admission("lpt", predictor="sibling"),
    )
    reqs = [
        Request(
            f"g{g}/{i}",
            tuple(tokenizer("7+8=").input_ids),
            SamplingParams(max_new_tokens=6, seed=i),
            group_id=f"g{g}",
            sample_index=i,
        )
        for g in range(3)
        for i in range(3)
    ]
    engine.generate(reqs)
    policy = engine.admission
    assert isinstance(policy, LengthOrdered) and not policy.state.running
    assert set(policy.predicted) == {r.id for r in reqs}
    with pytest.raises(ValueError, match="unknown length predictor 'nope'; valid: history, ranker, sibling"):
        make_admission("lpt", predictor="nope")
    with pytest.raises(ValueError, match="admission policy 'fcfs' takes no arguments"):
        make_admission("fcfs", predictor="sibling")


def brute_tau_b(x, y):
    conc = disc = tx = ty = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        sx, sy = (x[i] > x[j]) - (x[i] < x[j]), (y[i] > y[j]) - (y[i] < y[j])
        if sx and sy:
            conc, disc = conc + (sx == sy), disc + (sx != sy)
        tx, ty = tx + (sx == 0), ty + (sy == 0)
    n0 = len(x) * (len(x) - 1) / 2
    return (conc - disc) / ((n0 - tx) * (n0 - ty)) ** 0.5


def test_kendall_tau_matches_a_brute_force_count():
    rng = random.Random(0)
    for n in (2, 5, 17, 40):
        x = [rng.randint(0, 5) for _ in range(n)]  # many ties
        y = [xi + rng.randint(-3, 3) for xi in x]
        if len(set(x)) > 1 and len(set(y)) > 1:
            assert kendall_tau(x, y, chunk=7) == pytest.approx(brute_tau_b(x, y), abs=1e-12)
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0 and kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0


def test_ranker_loss_falls_and_ranks_longtail_prompts(tokenizer):
    task = make_task("longtail")
    tasks = task.sample("train", 600, 1)
    prompts = [tokenizer(t.prompt).input_ids for t in tasks]
    lengths = torch.tensor([len(task.solution(t)) + 1 for t in tasks], dtype=torch.float)
    ranker = RankerPredictor(RankerPredictor.Args(seed=0))
    x = prompt_features(prompts[:400], ranker.dim)
    losses = [ranker.train_step(x, lengths[:400]) for _ in range(150)]
    assert losses[-1] < 0.6 * losses[0]
    held_out = ranker.scores(prompts[400:]).tolist()
    assert kendall_tau(held_out, lengths[400:].tolist()) > 0.5


def test_config_names_the_admission_field_and_valid_choices():
    from schedrl.config import ConfigError, config_from_dict
    from schedrl.orchestrate.schedule import check_schedule

    def check(schedule):
        check_schedule(config_from_dict({"schedule": schedule}).schedule)

    cfg = config_from_dict({"schedule": {"admission": "lpt", "admission_args": {"predictor": "history"}}})
    assert cfg.schedule.admission == "lpt" and cfg.schedule.admission_args == {"predictor": "history"}
    check({"admission": "lpt", "admission_args": {"predictor": "history"}})
    with pytest.raises(
        ConfigError,
        match="'schedule.admission': unknown admission policy 'longest'; valid: fcfs, fcfs_guarded, las, learned, lpt",
    ):
        check({"admission": "longest"})
    with pytest.raises(ConfigError, match="'schedule.admission'.*unknown length predictor 'oracle'"):
        check({"admission": "spt", "admission_args": {"predictor": "oracle"}})
    with pytest.raises(ConfigError, match="'schedule.admission'.*past_future.*'kv_budget_tokens'"):
        check({"admission": "past_future"})


# ---- the registries' contract ----------------------------------------------------------------
def test_bad_arguments_name_the_policy_the_argument_and_the_value():
    with pytest.raises(ValueError, match=r"admission policy 'spt': unknown argument 'max_wait'; valid: "):
        make_admission("spt", max_wait=3)
    with pytest.raises(
        ValueError, match=r"admission policy 'lpt': argument 'max_wait_steps' must be > 0, got 0"
    ):
        ADMISSION.check("lpt", {"max_wait_steps": 0})
    with pytest.raises(ValueError, match=r"'past_future': argument 'quantile' must be in \(0, 1\], got 1.5"):
        ADMISSION.check("past_future", {"kv_budget_tokens": 10, "quantile": 1.5})
    # a nested predictor's arguments are checked with the policy's: a config check catches them
    with pytest.raises(
        ValueError,
        match=r"admission policy 'lpt': argument 'predictor_args': length predictor 'ranker': "
        r"argument 'lr' must be > 0, got 0",
    ):
        ADMISSION.check("lpt", {"predictor": "ranker", "predictor_args": {"lr": 0}})
    with pytest.raises(
        ValueError, match=r"'fcfs_guarded'.*'predictor_args'.*'sibling': unknown argument 'size'"
    ):
        ADMISSION.check("fcfs_guarded", {"predictor_args": {"size": 3}})
    with pytest.raises(
        ValueError, match=r"length predictor 'history': argument 'per_task' must be > 0, got 0"
    ):
        make_predictor("history", per_task=0)
    policy = make_admission("spt", predictor="history", predictor_args={"per_task": 3}, max_wait_steps=7)
    assert isinstance(policy, ShortestFirst) and isinstance(policy.predictor, HistoryPredictor)
    assert policy.predictor.per_task == 3
    assert (policy.order, policy.max_wait_steps) == ("spt", 7)


class Constant(LengthPredictor):
    """Predicts one length for every request."""

    @dataclass(frozen=True)
    class Args(LengthPredictor.Args):
        value: float = 1.0  # the prediction

    def __init__(self, args: Args = Args()) -> None:
        super().__init__(args)
        self.value = args.value

    def predict(self, request: Request) -> float:
        return self.value


class Reversed:
    """Admits the newest waiting request first (an admission policy of a user's own)."""

    @dataclass(frozen=True)
    class Args:
        most: int = 1  # requests admitted per round at most

    def __init__(self, args: Args = Args()) -> None:
        self.most = args.most

    def select(self, waiting, *, free_slots, token_budget, num_running):
        return list(range(len(waiting)))[::-1][: min(free_slots, self.most)]


def test_a_users_classes_build_through_the_registries_by_dotted_path():
    policy = make_admission("tests.test_rollout_ordering:Reversed", most=2)
    assert type(policy).__name__ == "Reversed" and vars(policy) == {"most": 2}
    assert select_all(policy, [req("a"), req("b"), req("c")]) == ["c", "b"]
    lpt = make_admission("lpt", predictor="tests.test_rollout_ordering:Constant", predictor_args={"value": 7})
    assert isinstance(lpt, LongestFirst) and lpt.predictor.predict(req("a")) == 7
    with pytest.raises(ValueError, match=r"'lpt': argument 'predictor_args'.*unknown argument 'val'"):
        ADMISSION.check(
            "lpt", {"predictor": "tests.test_rollout_ordering:Constant", "predictor_args": {"val": 1}}
        )
