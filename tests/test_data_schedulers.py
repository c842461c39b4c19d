"""Each data scheduler's allocation on synthetic statistics, against values worked out by hand."""

import math
import random
from dataclasses import dataclass
from typing import Any

import pytest

from schedrl.data import SCHEDULERS, DataContext, ScoredGroup, make_scheduler
from schedrl.data.base import PoolScheduler, check_number, largest_remainder
from schedrl.data.coba import allocate, group_value
from schedrl.data.e2h import level_probs
from schedrl.data.paced import weighted_sample
from schedrl.envs import Task, make_task
from schedrl.seeding import derive_seed

HERE = "tests.test_data_schedulers"


class ListSource:
    """A task source over a fixed list: ``sample`` cycles through it, so a pool is the list itself."""

    name = "list"

    def __init__(self, tasks):
        self.tasks = tasks

    def sample(self, split, n, seed):
        return [self.tasks[i % len(self.tasks)] for i in range(n)]

    def reward(self, task, completion):
        return float(completion.strip() == task.answer)

    def solution(self, task):
        return task.answer


def tasks(*specs):
    """Tasks named by ``"id:domain"`` (difficulty = the number after a second colon, if any)."""
    out = []
    for spec in specs:
        parts = spec.split(":")
        diff = float(parts[2]) if len(parts) > 2 else None
        out.append(Task(parts[0], f"{parts[0]}=", "1", parts[1], difficulty=diff))
    return out


def build(name, pool, group_size=2, steps=10, **args) -> Any:  # the concrete scheduler, for its attributes
    return make_scheduler(name, DataContext(ListSource(pool), 0, group_size, steps), **args)


def group(task, rewards, adv=None):
    return ScoredGroup(task, tuple(rewards), tuple(adv if adv is not None else [0.0] * len(rewards)))


def ids(batch):
    return [(t.id, n) for t, n in batch]


def test_uniform_is_the_seeded_task_stream():
    source = make_task("tiered")
    s = make_scheduler("uniform", DataContext(source, 7, 8, 10))
    for step in range(2):
        expected = source.sample("train", 16, derive_seed(7, "data", step))
        assert ids(s.next_batch(128)) == [(t.id, 8) for t in expected]


def test_largest_remainder():
    assert largest_remainder([0.5, 0.3, 0.2], 4) == [2, 1, 1]  # quotas 2.0, 1.2, 0.8
    assert largest_remainder([1, 1, 1], 4) == [2, 1, 1]  # equal remainders: the lower index first


def test_zero_variance_filters_and_refills():
    pool = tasks("a:x", "b:x", "c:x", "d:x", "e:x")
    s = build("zero_variance", pool, retry_after=3)
    s.next_batch(10)  # 5 prompts x G=2: the whole pool, nothing observed yet
    a, b, c, d, e = pool
    s.observe([group(a, [1, 1]), group(b, [0, 0]), group(c, [1, 0]), group(d, [0, 0]), group(e, [1, 0])])
    # a (all right), b and d (all wrong) are filtered; c and e (mixed) and nothing else refill 2 prompts
    assert sorted(t.id for t, _ in s.next_batch(4)) == ["c", "e"]
    assert s.filtered >= 1


def test_zero_variance_band_pass_and_retry():
    pool = tasks("a:x", "b:x", "c:x")
    s = build("zero_variance", pool, acc_low=0.3, acc_high=0.8, retry_after=2)
    s.next_batch(6)
    a, b, c = pool
    s.observe([group(a, [1, 0, 0, 0]), group(b, [1, 1, 0, 0]), group(c, [1, 1, 1, 1])])  # acc .25, .5, 1
    assert [t.id for t, _ in s.next_batch(2)] == ["b"]  # only 0.3 < 0.5 < 0.8 passes
    # Two steps after their last observation (position 1 -> 3) a and c are eligible again.
    s.next_batch(2)
    assert sorted(t.id for t, _ in s.next_batch(6)) == ["a", "b", "c"]


def test_dump_ucb_scores_by_hand():
    pool = tasks("a1:A", "a2:A", "b1:B", "c1:C")
    s = build("dump_ucb", pool, c=0.2, tau=0.1)
    a1, a2, b1, _ = pool
    s.observe([group(a1, [1, 0], [1.0, -1.0]), group(a2, [1, 0], [0.5, -0.5]), group(b1, [0, 0], [0.0, 0.0])])
    # N = 3 groups drawn; A: n=2, mean|A| = (1.0 + 0.5)/2 = 0.75; B: n=1, mean|A| = 0; C never drawn.
    # UCB_A = 0.75 + 0.2*sqrt(2 ln 3 / 2) = 0.75 + 0.2*1.048147 = 0.959629
    # UCB_B = 0.0  + 0.2*sqrt(2 ln 3 / 1) = 0.2*1.482304 = 0.296461
    sa, sb, sc = s.scores(["A", "B", "C"])
    assert sa == pytest.approx(0.959629, abs=1e-6) and sb == pytest.approx(0.296461, abs=1e-6)
    assert math.isinf(sc)
    assert s.probs(["A", "B", "C"]) == [0.0, 0.0, 1.0]  # an undrawn domain takes all the mass
    # softmax((0.959629, 0.296461) / 0.1): p_B = 1 / (1 + exp(6.63168)) = 1 / 759.8 = 0.0013162
    pa, pb = s.probs(["A", "B"])
    assert pb == pytest.approx(0.0013162, rel=1e-4) and pa + pb == pytest.approx(1.0)
    assert {t.domain for t, _ in s.next_batch(8)} == {"C"}  # exploration first


def test_domain_reweight_by_hand():
    pool = tasks("x1:x", "x2:x", "x3:x", "y1:y")
    s = build("domain_reweight", pool, alpha=0.3, beta=0.9, eps=0.05)
    assert s.domain_weights() == {"x": 0.75, "y": 0.25}  # the pool's own mix
    assert [t.domain for t, _ in s.next_batch(8)] == ["x", "x", "x", "y"]  # 4 prompts: 3, 1
    s.observe([group(pool[0], [1, 1]), group(pool[3], [0, 0])])  # r_x = 1, r_y = 0
    # v_x = 0.05, v_y = 1.05; w_x = 0.7*0.75 + 0.3*0.05/1.1 = 0.538636, w_y = 0.7*0.25 + 0.3*1.05/1.1 = 0.461364
    w = s.domain_weights()
    assert w["x"] == pytest.approx(0.538636, abs=1e-6) and w["y"] == pytest.approx(0.461364, abs=1e-6)
    # 4 prompts: quotas 2.15, 1.85 -> floors 2, 1 -> the spare one to y (remainder 0.85)
    assert sorted(t.domain for t, _ in s.next_batch(8)) == ["x", "x", "y", "y"]


@pytest.mark.parametrize("keep", [0.0, 1.0])
def test_difficulty_profile_by_hand(keep):
    pool = tasks("a:A", "b:B", "c:C", "d:D")
    s = build(
        "difficulty_profile",
        pool,
        probe_samples=8,
        scale=2.0,
        min_group=2,
        max_group=16,
        unsolvable_keep=keep,
    )
    assert ids(s.next_batch(32)) == [("a", 8), ("b", 8), ("c", 8), ("d", 8)]  # the profiling pass
    a, b, c, d = pool
    s.observe(
        [group(a, [1] * 8), group(b, [1] * 4 + [0] * 4), group(c, [0] * 8), group(d, [1] * 6 + [0] * 2)]
    )
    # p_domain = (s+1)/(n+2), p = (s + 4 p_domain)/(n + 4):
    # a: 0.9, (8+3.6)/12 = 0.9667 > 0.9 -> dropped as trivial
    # b: 0.5, (4+2)/12 = 0.5 -> n = ceil(2/0.5) = 4
    # c: 0.1, (0+0.4)/12 = 0.0333 < 0.05 -> unsolvable, kept with probability `keep`; n = 16 (60 clipped)
    # d: 0.7, (6+2.8)/12 = 0.7333 -> n = ceil(2.727) = 3
    assert s.stats.p(d) == pytest.approx(8.8 / 12)
    # Easy to hard: d (3), then b (4); 1 sample left < min_group.
    assert ids(s.next_batch(8)) == [("d", 3), ("b", 4)]
    if keep:
        assert ids(s.next_batch(8)) == [("c", 8)]  # 16 wanted, the budget caps it
    else:  # a new pass: d, b again
        assert ids(s.next_batch(8)) == [("d", 3), ("b", 4)]


def test_coba_heap_greedy_by_hand():
    assert group_value(0.5, 1) == 0.0  # a group of one carries no advantage
    assert group_value(0.1, 2) == pytest.approx(0.0162)  # 0.09 * (1 - 0.01 - 0.81)
    # gains: a->2 0.125, a->3 0.0625, a->4 0.03125 (max), b->2 0.0162
    assert allocate([0.5, 0.1], 6, 2, 4) == [4, 2]
    # three p = 0.5: 2 each (gain 0.125), the last sample to the first (gain 0.0625, ties to the lower index)
    assert allocate([0.5, 0.5, 0.5], 7, 2, 4) == [3, 2, 2]
    assert allocate([0.5, 0.5], 3, 2, 8) == [3, 0]  # 2 + 1; the second task's unit of 2 no longer fits


def test_coba_scheduler_spends_on_uncertain_tasks():
    pool = tasks("a:A", "b:B")
    s = build("coba", pool, candidates=2, min_group=2, max_group=8)
    s.next_batch(4)
    a, b = pool
    s.observe([group(a, [1] * 8), group(b, [1] * 4 + [0] * 4)])  # p_a = (8+3.6)/12, p_b = 0.5
    batch = dict(ids(s.next_batch(10)))
    assert sum(batch.values()) == 10 and batch["b"] == 8 and batch["a"] == 2


def test_e2h_gaussian_schedule_by_hand():
    # x = 0: w = (1, e^-0.5, e^-2) = (1, 0.606531, 0.135335), sum 1.741866 -> (0.574097, 0.348207, 0.077696)
    assert level_probs(0.0, 3, 0.5) == pytest.approx([0.574097, 0.348207, 0.077696], abs=1e-6)
    pool = tasks("e:x:0", "m:x:1", "h:x:2")
    s = build("e2h", pool, steps=3, sigma=0.5)

    def levels(batch):
        return [sum(t.id == name for t, _ in batch) for name in "emh"]

    assert levels(s.next_batch(32)) == [9, 6, 1]  # quotas 9.19, 5.57, 1.24 -> 9, 5, 1 + 1 to level 1
    assert levels(s.next_batch(32)) == [5, 7, 4]  # x = 0.5: 4.39, 7.23, 4.39 -> the spare to level 0 (tie)
    assert levels(s.next_batch(32)) == [1, 6, 9]  # x = 1: the mirror image of x = 0


def test_e2h_needs_difficulty_or_order():
    pool = tasks("a:A", "b:B")
    with pytest.raises(ValueError, match="give order"):
        build("e2h", pool).next_batch(4)
    s = build("e2h", pool, order=["B", "A"], steps=1)
    assert [t.id for t, _ in s.next_batch(4)] == ["b", "b"]  # x = 0: level 0 (B) gets 0.88 of 2 prompts


def test_paced_priorities_and_replay_by_hand():
    assert weighted_sample(tasks("a:x", "b:x", "c:x"), [0.0, 1.0, 0.0], 2, random.Random(0))[0].id == "b"
    pool = tasks("a:A", "b:B", "c:C", "d:D", "e:E", "f:F")
    s = build("paced", pool, tau=0.5, width=0.2, replay_frac=0.5, min_error=0.2)
    assert s.priority(0.5) == 1.0 and s.priority(0.9) == pytest.approx(math.exp(-2.0))  # (0.4)^2 / 0.08
    s.next_batch(8)
    a, b, c = pool[:3]
    # every estimate is the prior 0.5 before this batch: errors |0.5 - 1| = 0.5, |0.5 - 0.5| = 0, |0.5 - 0| = 0.5
    s.observe([group(a, [1, 1]), group(b, [1, 0]), group(c, [0, 0])])
    assert s.buffer == {"a": 0.5, "c": 0.5}
    batch = [t.id for t, _ in s.next_batch(8)]  # 4 prompts, round(0.5 * 4) = 2 replayed
    assert sorted(batch[:2]) == ["a", "c"] and not {"a", "c"} & set(batch[2:]) and s.buffer == {}


class FirstTasks(PoolScheduler):
    """A scheduler outside the registry: the pool's first ``count`` tasks every step, ``G`` samples each."""

    name = "first_tasks"

    @dataclass(frozen=True)
    class Args(PoolScheduler.Args):
        count: int = 1  # tasks per step

        def __post_init__(self) -> None:
            super().__post_init__()
            check_number("count", self.count, 1, integer=True)

    def __init__(self, ctx: DataContext, args: Args = Args()) -> None:
        super().__init__(ctx, args)
        self.count = args.count

    def _select(self, budget, rng):
        return [
            (t, self.ctx.group_size)
            for t in self.pool.tasks[: min(self.count, budget // self.ctx.group_size)]
        ]


def test_a_users_scheduler_builds_by_dotted_path():
    pool = tasks("a:x", "b:x", "c:x")
    s = build(f"{HERE}:FirstTasks", pool, count=2, pool_size=3)
    assert type(s).__name__ == "FirstTasks" and s.pool_size == 3
    assert ids(s.next_batch(8)) == [("a", 2), ("b", 2)]
    # imported by its path: a second copy of this module beside pytest's, so compare with that copy's class
    assert SCHEDULERS.check(f"{HERE}:FirstTasks", {}) == SCHEDULERS.get(f"{HERE}:FirstTasks").Args()
    with pytest.raises(
        ValueError, match=f"data scheduler '{HERE}:FirstTasks': argument 'count' must be an int >= 1, got 0"
    ):
        build(f"{HERE}:FirstTasks", pool, count=0)
    with pytest.raises(
        ValueError, match=f"data scheduler '{HERE}:FirstTasks': unknown argument 'cnt'; valid: .*count"
    ):
        SCHEDULERS.check(f"{HERE}:FirstTasks", {"cnt": 2})
    with pytest.raises(ValueError, match=f"data scheduler '{HERE}:Nope'.*no attribute 'Nope'"):
        SCHEDULERS.check(f"{HERE}:Nope", {})
