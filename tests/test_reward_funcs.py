"""Reward functions in TRL's batch shape and schedrl's per-sample shape, with weights, as one batch."""

from __future__ import annotations

import pytest

from schedrl.envs.base import Task
from schedrl.envs.reward_funcs import RewardFuncs
from schedrl.envs.scoring import RewardScorer
from schedrl.envs.user import FileTask
from schedrl.types import Sample, SamplingParams


def _tasks(chat: bool = False) -> list[Task]:
    rows = [("1+1=", "2", "easy"), ("2+3=", "5", "hard"), ("4+4=", "8", "easy")]
    return [
        Task(
            f"t{i}",
            p,
            a,
            "x",
            metadata={"answer": a, "level": level},
            messages=({"role": "user", "content": p},) if chat else None,
        )
        for i, (p, a, level) in enumerate(rows)
    ]


def correct(completions, answer, **kwargs):
    return [1.0 if c == a else 0.0 for c, a in zip(completions, answer, strict=True)]


def short(task, completion):
    return -0.1 * len(completion)


def only_hard(prompts, completions, level, **kwargs):
    return [1.0 if lv == "hard" else None for lv in level]


def test_weighted_sum_of_a_batch_function_and_a_per_sample_one():
    funcs = RewardFuncs([correct, short], weights=[2.0, 0.5])
    assert funcs.batch == [True, False]
    rewards, metrics, _ = funcs.score(_tasks(), ["2", "55", "8"], [[1], [2, 2], [3]])
    # 2 * correct + 0.5 * (-0.1 * len)
    assert rewards == pytest.approx([2 - 0.05, 0 - 0.1, 2 - 0.05])
    assert metrics["rewards/correct/mean"] == pytest.approx(2 / 3)
    assert metrics["rewards/short/mean"] == pytest.approx(-0.4 / 3)
    assert metrics["reward/none_frac"] == 0.0


def test_none_leaves_a_function_out_of_that_sample_and_no_function_scores_zero():
    rewards, metrics, _ = RewardFuncs([only_hard, correct], weights=[1.0, 1.0]).score(
        _tasks(), ["0", "5", "8"], [[], [], []]
    )
    assert rewards == [0.0, 2.0, 1.0]  # only_hard applies to t1 only
    assert metrics["rewards/only_hard/mean"] == 1.0  # over the samples it applies to
    alone, metrics, _ = RewardFuncs([only_hard]).score(_tasks(), ["0", "5", "8"], [[], [], []])
    assert alone == [0.0, 1.0, 0.0] and metrics["reward/none_frac"] == pytest.approx(2 / 3)


def test_chat_prompts_reach_batch_functions_as_message_lists():
    seen = {}

    def spy(prompts, completions, completion_ids, **columns):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, columns=columns)
        return [0.0] * len(prompts)

    RewardFuncs([spy]).score(_tasks(chat=True), ["2", "5", "8"], [(7,), (8,), (9,)])
    assert seen["prompts"][0] == [{"role": "user", "content": "1+1="}]
    assert seen["completions"][1] == [{"role": "assistant", "content": "5"}]
    assert seen["ids"] == [[7], [8], [9]]
    assert seen["columns"] == {"answer": ["2", "5", "8"], "level": ["easy", "hard", "easy"]}


def test_bad_reward_functions_are_named():
    with pytest.raises(ValueError, match=r"reward function 'half' returned 2 values for 3 completions"):

        def half(completions, **kwargs):
            return [0.0, 0.0]

        RewardFuncs([half]).score(_tasks(), ["a", "b", "c"], [[], [], []])
    with pytest.raises(ValueError, match=r"reward function 'odd': takes neither"):

        def odd(x):
            return 0.0

        RewardFuncs([odd])
    with pytest.raises(ValueError, match="2 weights for 1 reward functions"):
        RewardFuncs([correct], weights=[1.0, 2.0])

    def nan(task, completion):
        return float("nan") if task.id == "t1" else 1.0

    # a per-sample function fails the sample it failed on, and only that one
    rewards, _, errors = RewardFuncs([nan]).score(_tasks(), ["a", "b", "c"], [[], [], []])
    assert rewards == [1.0, 0.0, 1.0] and errors[0] is None and errors[2] is None
    assert "reward function 'nan' returned nan for task 't1'" in str(errors[1])

    def batch_nan(completions, **kwargs):
        return [float("nan")] * len(completions)

    with pytest.raises(ValueError, match="reward function 'batch_nan' returned nan for task 't0'"):
        RewardFuncs([batch_nan]).score(_tasks(), ["a", "b", "c"], [[], [], []])


def _sample(i: int, text: str) -> Sample:
    return Sample(f"r{i}", (1,), (2,), (0.0,), (0,), "stop", SamplingParams(4), text=text, task_id=f"t{i}")


def test_the_scorer_calls_a_batch_reward_once_and_counts_a_batch_that_raises():
    rows = [{"prompt": t.prompt, "answer": t.answer, "id": t.id} for t in _tasks()]
    calls = []

    def counting(completions, answer, **kwargs):
        calls.append(len(completions))
        return correct(completions, answer)

    source = FileTask(rows=rows, eval_rows=rows[:1], reward=[counting])
    tasks = {t.id: t for t in source.splits["train"]}
    scorer = RewardScorer(source, max_error_rate=1.0)
    assert scorer(tasks, [_sample(0, " 2 "), _sample(1, "4"), _sample(2, "8")]) == [1.0, 0.0, 1.0]
    assert calls == [3] and scorer.take_metrics()["rewards/counting/mean"] == pytest.approx(2 / 3)
    assert scorer.take_metrics() == {}  # taken

    def boom(completions, **kwargs):
        raise RuntimeError("grader down")

    scorer = RewardScorer(FileTask(rows=rows, reward=boom), max_error_rate=1.0)
    assert scorer(tasks, [_sample(0, "2"), _sample(1, "5")]) == [0.0, 0.0]
    assert scorer.errors == 2 and "grader down" in str(scorer.last_error)
