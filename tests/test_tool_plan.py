"""`tool_plan`: the plan grammar, the harness that runs it (its measured time follows the makespan), and
the reward, right answer x best makespan / the plan's, in closed form."""

from __future__ import annotations

import asyncio

import pytest

from schedrl.envs import make_task
from schedrl.envs.base import Task
from schedrl.envs.tool_plan import UNIT_S, UNITS, ToolPlanTask, best_units, execute, makespan, parse_plan


def _task(prompt: str, answer: int) -> Task:
    return Task("t", prompt, str(answer), "tool_plan")


def test_rewards_in_closed_form():
    src, t = ToolPlanTask(), _task("sq 3+inc 4=", 14)
    assert best_units(t.prompt) == 3
    assert src.reward(t, "a=sq 3,b=inc 4;z=sum a b") == 1.0
    assert src.reward(t, "a=sq 3;b=inc 4;z=sum a b") == pytest.approx(3 / 4)  # 2 + 1 + 1 units
    assert src.reward(t, "b=inc 4;a=sq 3;z=sum b a") == pytest.approx(3 / 4)
    t3 = _task("sq 2+sq 3+inc 1=", 15)
    assert src.reward(t3, "a=sq 2;b=sq 3;c=inc 1;z=sum a b c") == pytest.approx(3 / 6)
    assert src.reward(t3, "a=sq 2,b=sq 3;c=inc 1;z=sum a b c") == pytest.approx(3 / 4)


@pytest.mark.parametrize(
    "plan",
    [
        "a=sq 3,b=inc 4,z=sum a b",  # the sum reads letters of its own stage
        "a=sq 3,b=inc 5;z=sum a b",  # not the problem's calls
        "z=sum 9 5",  # the leaves computed without the tools
        "a=sq 3,b=inc 4;z=sum a",  # a wrong answer
        "a=sq 3,a=inc 4;z=sum a a",  # a letter bound twice
        "a=sq a,b=inc 4;z=sum a b",  # a leaf on a letter
        "a=sq 3,b=inc 4;",
        "a = sq 3",
        "",
    ],
)
def test_what_is_not_a_right_plan_scores_zero(plan):
    assert ToolPlanTask().reward(_task("sq 3+inc 4=", 14), plan) == 0.0


def test_the_harness_runs_stages_at_once_and_its_time_follows_the_makespan():
    par = parse_plan("a=sq 2,b=sq 3,c=sq 4;z=sum a b c")
    seq = parse_plan("a=sq 2;b=sq 3;c=sq 4;z=sum a b c")
    assert par is not None and seq is not None and (makespan(par), makespan(seq)) == (3, 7)
    (v1, wall_par), (v2, wall_seq) = asyncio.run(execute(par)), asyncio.run(execute(seq))
    assert v1 == v2 == 29
    assert wall_par >= 3 * UNIT_S and wall_seq >= 7 * UNIT_S and wall_seq - wall_par > 2.5 * UNIT_S


def test_a_batch_runs_at_once_and_logs_its_plans():
    src = ToolPlanTask()
    tasks = src.sample("train", 32, seed=0)
    best = [src.solution(t).replace(";", ",").replace(",z=", ";z=") for t in tasks]
    rewards, metrics, errors = src.reward_batch(tasks, [*best[:31], "nonsense"], [[]] * 32)
    assert rewards == [1.0] * 31 + [0.0] and errors == [None] * 32
    assert metrics["plan/valid_frac"] == pytest.approx(31 / 32) and metrics["plan/optimal_frac"] == 1.0
    assert metrics["plan/wall_ms_mean"] >= 1000 * UNIT_S * metrics["plan/units_mean"]
    for t in tasks:  # a demo is the best plan or the sequential one, (max leaf + 1) / (sum of leaves + 1)
        units = [UNITS[x.split()[0]] for x in t.prompt.removesuffix("=").split("+")]
        sequential = (max(units) + 1) / (sum(units) + 1)
        assert src.reward(t, src.solution(t)) == pytest.approx(1.0 if "," in src.solution(t) else sequential)


@pytest.mark.train
def test_warm_up_demos_and_bad_arguments():
    src = ToolPlanTask(sequential_demos=0.8)
    tasks = src.sample("train", 200, seed=1)
    sequential = sum("," not in src.solution(t) for t in tasks) / len(tasks)
    assert 0.7 < sequential < 0.9 and all(src.reward(t, src.solution(t)) > 0 for t in tasks)
    with pytest.raises(ValueError, match="sequential_demos"):
        make_task("tool_plan", sequential_demos=2.0)
    with pytest.raises(ValueError, match="max_leaves"):
        make_task("tool_plan", min_leaves=3, max_leaves=2)
