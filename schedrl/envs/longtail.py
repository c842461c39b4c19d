"""A mixture of built-in tasks whose correct answers have a long-tailed length distribution.

Most tasks are short additions (answers of 1-3 characters), some are medium (countdown,
short sort/reverse) and a few are long sort/reverse over 16-48 digits. This reproduces the
long-tail of response lengths that length-aware rollout schedulers target.

References: the long-tail problem as described by APRIL (Active Partial Rollouts in RL) and
Seer (online context learning for synchronous LLM RL); the mixture itself is a schedrl test bed.
"""

from __future__ import annotations

import dataclasses
import random

from schedrl.envs.addition import AdditionTask
from schedrl.envs.base import GeneratedTasks, Task, check_count, check_int_range, check_order, check_split
from schedrl.envs.countdown import CountdownTask
from schedrl.envs.digits import ReverseDigitsTask, SortDigitsTask


def _check_weight(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"task 'longtail': {name} must be a number >= 0, got {value!r}")
    return float(value)


class LongtailMix:
    """Sample a domain by weight, then a task from it; each task's ``domain`` names its sub-task.

    Domains: ``addition`` (1-2 digit operands), ``countdown``, ``sort_medium``/``reverse_medium``
    (4-8 digits) and ``sort_long``/``reverse_long`` (``long_min_len``-``long_max_len`` digits).
    """

    name = "longtail"

    def __init__(
        self,
        short_weight: float = 0.7,
        medium_weight: float = 0.2,
        long_weight: float = 0.1,
        long_min_len: int = 16,
        long_max_len: int = 48,
    ) -> None:
        short = _check_weight("short_weight", short_weight)
        medium = _check_weight("medium_weight", medium_weight)
        long = _check_weight("long_weight", long_weight)
        if short + medium + long <= 0:
            raise ValueError("task 'longtail': short_weight + medium_weight + long_weight must be > 0")
        check_int_range(self.name, "long_min_len", long_min_len, 1)
        check_int_range(self.name, "long_max_len", long_max_len, 1)
        check_order(self.name, "long_min_len", long_min_len, "long_max_len", long_max_len)
        self.components: dict[str, tuple[float, GeneratedTasks]] = {
            "addition": (short, AdditionTask(1, 2)),
            "countdown": (medium / 2, CountdownTask()),
            "sort_medium": (medium / 4, SortDigitsTask(4, 8)),
            "reverse_medium": (medium / 4, ReverseDigitsTask(4, 8)),
            "sort_long": (long / 2, SortDigitsTask(long_min_len, long_max_len)),
            "reverse_long": (long / 2, ReverseDigitsTask(long_min_len, long_max_len)),
        }
        self._domains = [d for d, (w, _) in self.components.items() if w > 0]
        self._weights = [self.components[d][0] for d in self._domains]

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        rng = random.Random(seed)
        tasks = []
        for _ in range(check_count(n)):
            domain = rng.choices(self._domains, weights=self._weights)[0]
            task = self.components[domain][1].draw(rng, split)
            tasks.append(dataclasses.replace(task, domain=domain))
        return tasks

    def _source(self, task: Task) -> GeneratedTasks:
        if task.domain not in self.components:
            valid = ", ".join(self.components)
            raise ValueError(f"task 'longtail': unknown domain {task.domain!r}; valid domains: {valid}")
        return self.components[task.domain][1]

    def reward(self, task: Task, completion: str) -> float:
        return self._source(task).reward(task, completion)

    def solution(self, task: Task) -> str:
        return self._source(task).solution(task)
