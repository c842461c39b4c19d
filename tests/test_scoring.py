"""The reward scorer: per-sample rewards in order, errors scored 0 and counted, the error-rate stop,
and rewards on several threads for tasks that wait on something outside the process."""

from __future__ import annotations

import threading
import time

import pytest

from schedrl.envs import Task
from schedrl.envs.scoring import RewardError, RewardScorer
from schedrl.types import Sample, SamplingParams


class Slow:
    """Reward = the completion as a number; "boom" raises; each call sleeps, like a sandbox run."""

    def __init__(self, workers: int) -> None:
        self.reward_workers, self.threads = workers, set()

    def reward(self, task, completion):
        self.threads.add(threading.get_ident())
        time.sleep(0.05)
        if completion == "boom":
            raise RuntimeError("the sandbox went away")
        return float(completion)


def _samples(texts):
    return [Sample(f"s{i}", (1,), (2,), (0.0,), (0,), "stop", SamplingParams(1), text=t, task_id="t")
            for i, t in enumerate(texts)]  # fmt: skip


TASKS = {"t": Task("t", "p", "", "d")}


@pytest.mark.parametrize("workers", [1, 4])
def test_rewards_come_back_in_order_and_errors_are_counted(workers):
    source = Slow(workers)
    scorer = RewardScorer(source, max_error_rate=0.5, min_samples=100)
    start = time.perf_counter()
    rewards = scorer(TASKS, _samples(["1", "2", "boom", "4", "5", "6", "7", "8"]))
    elapsed = time.perf_counter() - start
    assert rewards == [1.0, 2.0, 0.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert (scorer.errors, scorer.total) == (1, 8) and "the sandbox went away" in (scorer.last_error or "")
    if workers > 1:  # eight 50 ms rewards on four threads: two rounds, not eight
        assert len(source.threads) > 1 and elapsed < 0.3
    else:
        assert len(source.threads) == 1 and elapsed >= 0.4


def test_the_run_stops_above_the_error_rate():
    scorer = RewardScorer(Slow(4), max_error_rate=0.2, min_samples=4)
    with pytest.raises(RewardError, match=r"raised on 2 of 4 samples \(50.0%\)"):
        scorer(TASKS, _samples(["1", "boom", "boom", "1"]))
