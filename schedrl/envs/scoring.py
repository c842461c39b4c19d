"""Score samples with a task's reward function; a reward that raises scores 0 and is counted."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from schedrl.envs.base import Task, TaskSource
from schedrl.types import Sample, task_of

log = logging.getLogger(__name__)


class RewardError(RuntimeError):
    """The reward function raised on more samples than the run allows."""


class RewardScorer:
    """Calls `source.reward` per sample; stops the run when the error rate exceeds `max_error_rate`.

    A task whose reward waits on something outside the process (a sandbox, a server) declares
    `reward_workers = n`: its rewards then run on n threads at once, in sample order. A task with
    `reward_batch(tasks, completions, completion_ids) -> (rewards, metrics, errors)` (batch reward
    functions, as TRL's) is scored in one call: a sample with an error scores 0 and is counted, and if
    the call raises, every sample of it does.
    `take_metrics()` gives the batch metrics' means since the last call."""

    def __init__(self, source: TaskSource, max_error_rate: float = 0.05, min_samples: int = 50) -> None:
        self.source, self.max_error_rate, self.min_samples = source, max_error_rate, min_samples
        self.errors = 0
        self.total = 0
        self.last_error: str | None = None
        self._metrics: dict[str, list[float]] = {}  # key -> [weighted sum, weight]

    def take_metrics(self) -> dict[str, float]:
        out = {k: total / n for k, (total, n) in self._metrics.items() if n}
        self._metrics = {}
        return out

    def __call__(self, tasks: Mapping[str, Task], samples: Sequence[Sample]) -> list[float]:
        workers = int(getattr(self.source, "reward_workers", 1) or 1)
        batch = getattr(self.source, "reward_batch", None)
        if batch is not None and samples:
            outcomes = self._score_batch(batch, [tasks[task_of(s)] for s in samples], samples)
        elif workers > 1 and len(samples) > 1:
            with ThreadPoolExecutor(min(workers, len(samples))) as pool:
                outcomes = list(pool.map(lambda s: self._score(tasks[task_of(s)], s.text), samples))
        else:
            outcomes = [self._score(tasks[task_of(s)], s.text) for s in samples]
        rewards = []
        for reward, error in outcomes:  # counted here, on one thread
            self.total += 1
            if error is not None:
                self.errors += 1
                self.last_error = error
                log.warning("reward raised, scored 0: %s", error)
            rewards.append(reward)
        rate = self.errors / max(1, self.total)
        if self.total >= self.min_samples and rate > self.max_error_rate:
            raise RewardError(
                f"the reward function raised on {self.errors} of {self.total} samples ({rate:.1%}), above "
                f"max_reward_error_rate={self.max_error_rate}; last error: {self.last_error}"
            )
        return rewards

    def _score_batch(
        self, batch, tasks: list[Task], samples: Sequence[Sample]
    ) -> list[tuple[float, str | None]]:
        try:
            rewards, metrics, errors = batch(tasks, [s.text for s in samples], [s.token_ids for s in samples])
        except Exception as err:  # a user's reward function may raise anything: the batch scores 0
            return [(0.0, f"{type(err).__name__}: {err}")] * len(samples)
        for k, v in metrics.items():
            acc = self._metrics.setdefault(k, [0.0, 0.0])
            acc[0] += v * len(samples)
            acc[1] += len(samples)
        return [(float(r), e) for r, e in zip(rewards, errors, strict=True)]

    def _score(self, task: Task, text: str) -> tuple[float, str | None]:
        """(reward, None), or (0.0, what went wrong) when the reward raised or was not finite."""
        try:
            reward = float(self.source.reward(task, text))
            if not math.isfinite(reward):
                raise ValueError(f"reward is not finite: {reward}")
            return reward, None
        except Exception as err:  # a user's reward function may raise anything
            return 0.0, f"task {task.id!r}: {type(err).__name__}: {err}"
