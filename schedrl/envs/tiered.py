"""A mixed-difficulty, multi-domain suite for data schedulers: trivial, learnable and hard tiers.

Five domains built from the existing generators, each tagged with a difficulty tier (0, 1 or 2
in ``Task.difficulty``) for the offline tiny model at an 8-token completion budget:

- tier 0 (trivial): ``first``, the first of 3-6 digits (``"first:3821="`` -> ``"3"``), learned
  within a short supervised warm-up;
- tier 1 (learnable by RL): ``sort_short``, sort 2-3 digits; ``reverse_short``, reverse 2-3 digits;
- tier 2 (out of reach): ``addition_hard``, 3-digit addition (beyond the tiny model in a short
  run); ``sort_long``, sort 9-12 digits, whose answer does not fit in 8 tokens at all.

The tiers are a property of this pairing of model and budget, not of the problems; a larger model
or budget moves tasks between tiers. A scheduler may read ``difficulty`` (easy-to-hard curricula
do) or ignore it.
"""

from __future__ import annotations

import dataclasses
import random

from schedrl.envs.addition import AdditionTask
from schedrl.envs.base import GeneratedTasks, Task, check_count, check_split
from schedrl.envs.digits import DigitsTask, ReverseDigitsTask, SortDigitsTask


class FirstDigitTask(DigitsTask):
    """Answer the first digit of the string; reward is an exact string match."""

    name = "first"
    tag = "first"
    op = staticmethod(lambda digits: digits[0])


DEFAULT_WEIGHTS = {
    "first": 0.2,
    "sort_short": 0.2,
    "reverse_short": 0.15,
    "addition_hard": 0.2,
    "sort_long": 0.25,
}
_DOMAINS: dict[str, tuple[int, GeneratedTasks]] = {
    "first": (0, FirstDigitTask(3, 6)),
    "sort_short": (1, SortDigitsTask(2, 3)),
    "reverse_short": (1, ReverseDigitsTask(2, 3)),
    "addition_hard": (2, AdditionTask(3, 3)),
    "sort_long": (2, SortDigitsTask(9, 12)),
}


class TieredMix:
    """Sample a domain by weight, then a task from it; ``domain`` and ``difficulty`` name its tier.

    ``weights`` maps domain names to non-negative sampling weights (default ``DEFAULT_WEIGHTS``);
    a domain left out gets weight 0.
    """

    name = "tiered"
    domains: dict[str, tuple[int, GeneratedTasks]] = _DOMAINS  # name -> (tier, source)
    default_weights: dict[str, float] = DEFAULT_WEIGHTS

    def __init__(self, weights: dict[str, float] | None = None) -> None:
        weights = dict(self.default_weights if weights is None else weights)
        for domain, w in weights.items():
            if domain not in self.domains:
                raise ValueError(
                    f"task '{self.name}': unknown domain {domain!r} in weights; valid domains: "
                    f"{', '.join(self.domains)}"
                )
            if isinstance(w, bool) or not isinstance(w, int | float) or not w >= 0:
                raise ValueError(f"task '{self.name}': weights[{domain!r}] must be a number >= 0, got {w!r}")
        if sum(weights.values()) <= 0:
            raise ValueError(f"task '{self.name}': weights must have a positive sum, got {weights!r}")
        self._domains = [d for d in self.domains if weights.get(d, 0) > 0]
        self._weights = [float(weights[d]) for d in self._domains]

    def sample(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        rng = random.Random(seed)
        tasks = []
        for _ in range(check_count(n)):
            domain = rng.choices(self._domains, weights=self._weights)[0]
            tier, source = self.domains[domain]
            tasks.append(dataclasses.replace(source.draw(rng, split), domain=domain, difficulty=float(tier)))
        return tasks

    def _source(self, task: Task) -> GeneratedTasks:
        if task.domain not in self.domains:
            raise ValueError(
                f"task '{self.name}': unknown domain {task.domain!r}; valid domains: {', '.join(self.domains)}"
            )
        return self.domains[task.domain][1]

    def reward(self, task: Task, completion: str) -> float:
        return self._source(task).reward(task, completion)

    def solution(self, task: Task) -> str:
        return self._source(task).solution(task)
