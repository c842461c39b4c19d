"""Score samples with a task's reward function; a reward that raises scores 0 and is counted."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

from schedrl.envs.base import Task, TaskSource
from schedrl.types import Sample, task_of

log = logging.getLogger(__name__)


class RewardError(RuntimeError):
    """The reward function raised on more samples than the run allows."""


class RewardScorer:
    """Calls `source.reward` per sample; stops the run when the error rate exceeds `max_error_rate`."""

    def __init__(self, source: TaskSource, max_error_rate: float = 0.05, min_samples: int = 50) -> None:
        self.source, self.max_error_rate, self.min_samples = source, max_error_rate, min_samples
        self.errors = 0
        self.total = 0
        self.last_error: str | None = None

    def __call__(self, tasks: Mapping[str, Task], samples: Sequence[Sample]) -> list[float]:
        rewards = [self._one(tasks[task_of(s)], s.text) for s in samples]
        rate = self.errors / max(1, self.total)
        if self.total >= self.min_samples and rate > self.max_error_rate:
            raise RewardError(
                f"the reward function raised on {self.errors} of {self.total} samples ({rate:.1%}), above "
                f"max_reward_error_rate={self.max_error_rate}; last error: {self.last_error}"
            )
        return rewards

    def _one(self, task: Task, text: str) -> float:
        self.total += 1
        try:
            reward = float(self.source.reward(task, text))
            if not math.isfinite(reward):
                raise ValueError(f"reward is not finite: {reward}")
            return reward
        except Exception as err:  # a user's reward function may raise anything
            self.errors += 1
            self.last_error = f"task {task.id!r}: {type(err).__name__}: {err}"
            log.warning("reward raised, scored 0: %s", self.last_error)
            return 0.0
