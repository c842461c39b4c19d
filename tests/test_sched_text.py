"""Scheduling problems as verifiable text tasks: generators, verifiers with partial credit, hostile input."""

from __future__ import annotations

import random
from itertools import combinations

import pytest

from schedrl.envs import make_task
from schedrl.envs.base import Task
from schedrl.envs.scheduling.activity import compatible, parse_prompt

HOSTILE = [
    "",
    "   ",
    "a" * 10_000,
    "9" * 10_000,
    "1" * 40,
    "-1",
    "a,-3",
    "x;DROP TABLE",
    "\x00\x01",
    "١٢٣",  # Arabic-Indic digits: str.isdigit() but not ASCII
    "abc\n\ndef",
    "aa",
    "zzz",
    "0,0,0,0",
    "1e9",
    "NaN",
]


def _task(name, **kw) -> Task:
    return make_task(name, **kw).sample("train", 1, seed=0)[0]


def test_activity_verdicts_and_the_three_reward_variants():
    t = Task("t", "act:a0-2,b1-3,c2-4,d3-5=", "ac", "activity")
    scores = {}
    for reward in ("exact", "feasible_size", "gap"):
        src = make_task("activity", reward=reward)
        scores[reward] = [src.reward(t, c) for c in ("ac", "ca", "bd", "a", "ab", "ae", "aa", "a c", "")]
    # ac is optimal; ca is the same set; bd is another largest set (so this instance is not one the
    # generator would emit); a is feasible but short; ab overlaps; e is no activity; aa repeats; a space
    # is no letter.
    assert scores["exact"] == [1, 1, 0, 0, 0, 0, 0, 0, 0]
    assert scores["gap"] == [1, 1, 1, 0.5, 0, 0, 0, 0, 0]
    assert scores["feasible_size"] == [1, 1, 1, 0.75, 0, 0, 0, 0, 0]
    src = make_task("activity")
    assert src.judge(t, "ab").violation == "overlap: a0-2 and b1-3"
    assert src.judge(t, "ae").kind == "unknown" and src.judge(t, "aa").kind == "duplicate"
    assert not src.judge(t, "a c").parsed


def test_lis_verdicts_and_the_three_reward_variants():
    t = Task("t", "lis:51472=", "147", "lis")
    for reward, want in (
        ("exact", [1, 0, 0, 0, 0, 0]),
        ("gap", [1, 2 / 3, 0, 0, 0, 0]),
        ("feasible_size", [1, 0.5 + 0.5 * 2 / 3, 0, 0, 0, 0]),
    ):
        src = make_task("lis", reward=reward)
        got = [src.reward(t, c) for c in ("147", "47", "741", "145", "1,4", "-147")]
        assert got == pytest.approx(want), reward
    src = make_task("lis")
    assert src.judge(t, "741").kind == "subsequence"
    assert src.judge(t, "55").kind == "subsequence"  # one 5 in the input
    assert (
        make_task("lis").judge(Task("u", "lis:3314=", "314", "lis"), "33").violation
        == "increasing: 3 is followed by 3"
    )
    wide = make_task("lis", max_value=50)
    w = Task("w", "lis:40,3,17,9,25=", "3,17,25", "lis")
    assert (
        wide.reward(w, "3,17,25") == 1
        and wide.reward(w, "3,9,25") == 1
        and wide.reward(w, "3,9") == pytest.approx(2 / 3)
    )
    assert not wide.judge(w, "3,,9").parsed and not wide.judge(w, "3,99999999999").parsed


def _brute_activity(acts) -> int:
    return max(
        (r for r in range(len(acts) + 1) for c in combinations(acts.values(), r) if compatible(list(c))),
        default=0,
    )


def _brute_lis(values) -> int:
    return max(
        r
        for r in range(1, len(values) + 1)
        for c in combinations(values, r)
        if all(a < b for a, b in zip(c, c[1:], strict=False))
    )


@pytest.mark.parametrize("knobs", [{"min_n": 3, "max_n": 4}, {"min_n": 6, "max_n": 8, "horizon": 20}])
def test_activity_answers_are_the_unique_optimum_by_brute_force(knobs):
    src = make_task("activity", **knobs)
    for t in src.sample("train", 40, seed=1):
        acts = parse_prompt(t.prompt)
        assert knobs["min_n"] <= len(acts) <= knobs["max_n"] and t.difficulty == len(acts)
        best = _brute_activity(acts)
        assert len(t.answer) == best
        others = [
            c
            for c in combinations(sorted(acts), best)
            if compatible([acts[x] for x in c]) and "".join(c) != t.answer
        ]
        assert others == []  # the optimum is unique
        assert src.reward(t, src.solution(t)) == 1


@pytest.mark.parametrize("knobs", [{}, {"min_len": 8, "max_len": 10, "max_value": 30}])
def test_lis_answers_are_the_unique_optimum_by_brute_force(knobs):
    src = make_task("lis", **knobs)
    for t in src.sample("train", 40, seed=2):
        body = t.prompt.removeprefix("lis:").removesuffix("=")
        values = (
            [int(c) for c in body]
            if "," not in body and knobs.get("max_value", 9) <= 9
            else [int(x) for x in body.split(",")]
        )
        best = _brute_lis(values)
        answer = src._read(t.answer)
        assert len(answer) == best
        assert {
            c for c in combinations(values, best) if all(a < b for a, b in zip(c, c[1:], strict=False))
        } == {tuple(answer)}
        assert src.reward(t, src.solution(t)) == 1


@pytest.mark.parametrize("name", ["activity", "lis"])
def test_hostile_completions_score_zero_and_are_counted_never_raising(name):
    src = make_task(name)
    tasks = src.sample("train", len(HOSTILE), seed=3)
    rewards, metrics, errors = src.reward_batch(tasks, HOSTILE)
    assert len(rewards) == len(HOSTILE) and errors == [None] * len(HOSTILE)
    for t, c, r in zip(tasks, HOSTILE, rewards, strict=True):
        if c.strip() != t.answer:
            assert r == 0.0 or src.judge(t, c).feasible, (c[:20], r)
    assert metrics["parse_error_frac"] >= 0.5
    assert 0 <= metrics["feasible_frac"] <= 1 and set(metrics) >= {f"violated/{k}" for k in src.violations}


@pytest.mark.parametrize("name", ["activity", "lis"])
def test_train_and_eval_never_share_an_instance(name):
    src = make_task(name)
    train = {t.prompt for t in src.sample("train", 400, seed=4)}
    held = {t.prompt for t in src.sample("eval", 100, seed=4)}
    assert train and held and not train & held


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("activity", {"min_n": 5, "max_n": 3}, r"min_n \(5\) must be <= max_n \(3\)"),
        ("activity", {"max_n": 40}, r"max_n must be an int in \[2, 12\], got 40"),
        ("activity", {"horizon": 1}, r"horizon must be an int in \[2, 999\], got 1"),
        ("activity", {"reward": "f1"}, "reward must be one of exact, feasible_size, gap, got 'f1'"),
        ("lis", {"max_len": 99}, r"max_len must be an int in \[2, 16\], got 99"),
        ("lis", {"max_value": 0}, r"max_value must be an int in \[1, 1000000\], got 0"),
    ],
)
def test_impossible_generator_arguments_are_named(name, args, message):
    with pytest.raises(ValueError, match=message):
        make_task(name, **args)


def test_generated_solutions_cover_random_instances():
    rng = random.Random(0)
    for name, knobs in (("activity", {"min_n": 2, "max_n": 6}), ("lis", {"min_len": 2, "max_len": 9})):
        src = make_task(name, **knobs)
        for t in src.sample("eval", 30, seed=rng.randrange(10**6)):
            assert src.reward(t, src.solution(t)) == 1


RCPSP = """rcpsp
durations: 2 3 1
resources: 0 1 0
precedence: 0<2
downtime: r1@0-1
window: 2@2-6
disjunctive: 0~1
starts="""


def test_rcpsp_names_the_first_violated_constraint_of_each_kind():
    t = Task("t", RCPSP, "0,2,3", "rcpsp")
    src = make_task("rcpsp")
    assert src.reward(t, "0,2,3") == 1.0 and src.judge(t, "0,2,3").optimal
    cases = {
        "0,2,1": "precedence: activity 2 starts at 1, before activity 0 ends at 2",
        "0,0,2": "downtime: activity 1 runs on resource 1 over [0, 3), into its downtime [0, 1)",
        "0,2,6": "window: activity 2 runs over [6, 7), outside its window [2, 6)",
        "0,1,2": "disjunctive: activities 0 and 1 overlap",
        "0,2": "count: 2 start times for 3 activities",
    }
    for completion, violation in cases.items():
        assert src.judge(t, completion).violation == violation, completion
        assert src.reward(t, completion) == 0.0
    partial = make_task("rcpsp", reward="partial")
    assert partial.reward(t, "0,2,3") == 1.0
    assert partial.reward(t, "0,1,2") == pytest.approx(3 / 4)  # one of four constraints broken
    assert partial.reward(t, "0,2,1") == pytest.approx(2 / 4)  # precedence and window broken
    assert partial.reward(t, "0,0,1") == 0.0  # all four broken
    assert partial.reward(t, "0,x,1") == 0.0 and not partial.judge(t, "0,x,1").parsed


@pytest.mark.parametrize(
    "knobs",
    [
        {},
        {"levels": 4, "width": 3, "precedences": 4, "downtimes": 3, "windows": 5, "disjunctive": 4},
        {"levels": 1, "width": 5, "precedences": 0, "disjunctive": 3},
    ],
)
def test_rcpsp_instances_are_feasible_and_carry_each_knob(knobs):
    src = make_task("rcpsp", **knobs)
    for t in src.sample("train", 30, seed=5):
        assert src.reward(t, src.solution(t)) == 1.0
        lines = dict(line.split(": ", 1) for line in t.prompt.splitlines()[1:-1])
        assert len(lines.get("precedence", "").split()) == knobs.get("precedences", 2) * (
            knobs.get("levels", 3) - 1
        )
        assert len(lines.get("downtime", "").split()) == knobs.get("downtimes", 0)
        assert len(lines.get("window", "").split()) == knobs.get("windows", 0)
        assert len(lines.get("disjunctive", "").split()) == knobs.get("disjunctive", 0)
    rewards, metrics, _ = src.reward_batch(src.sample("eval", len(HOSTILE), seed=6), HOSTILE)
    assert rewards == [0.0] * len(HOSTILE) and metrics["parse_error_frac"] > 0.5


def test_rcpsp_impossible_arguments_are_named():
    with pytest.raises(ValueError, match=r"precedences must be an int in \[0, 4\], got 5"):
        make_task("rcpsp", width=2, precedences=5)  # more precedence arcs than pairs of adjacent levels
    with pytest.raises(ValueError, match="precedences must be 0 with a single level, got 2"):
        make_task("rcpsp", levels=1)
    with pytest.raises(ValueError, match=r"disjunctive must be an int in \[0, 15\], got 16"):
        make_task("rcpsp", levels=2, width=3, disjunctive=16)
    with pytest.raises(ValueError, match="reward must be feasible or partial, got 'gap'"):
        make_task("rcpsp", reward="gap")


def test_the_scheduling_mix_tags_tiers_and_scores_with_each_domains_verifier():
    mix = make_task("sched_tiered")
    tasks = mix.sample("train", 200, seed=7)
    tiers = {t.domain: t.difficulty for t in tasks}
    assert tiers == {"activity_pair": 0.0, "activity": 1.0, "lis": 1.0, "lis_long": 2.0, "rcpsp": 2.0}
    assert all(mix.reward(t, mix.solution(t)) == 1.0 for t in tasks)
    lis = next(t for t in tasks if t.domain == "lis")
    assert 0 < mix.reward(lis, lis.answer[:-1]) < 1  # the lis verifier's partial credit
    only = make_task("sched_tiered", weights={"lis": 1.0})
    assert {t.domain for t in only.sample("eval", 20, seed=0)} == {"lis"}
    long = make_task("sched_tiered", weights={"rcpsp_long": 1.0}).sample("eval", 20, seed=0)
    assert {(t.domain, t.difficulty) for t in long} == {("rcpsp_long", 2.0)}  # left out by default (above)
    assert min(len(t.answer) for t in long) >= 15  # 8 start times: every failure is a long one
    with pytest.raises(ValueError, match="task 'sched_tiered': unknown domain 'jobshop' in weights"):
        make_task("sched_tiered", weights={"jobshop": 1.0})
