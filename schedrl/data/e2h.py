"""Easy-to-hard curriculum with fading (E2H): a Gaussian schedule over difficulty levels.

Rule (E2H Reasoner, the Gaussian schedule E2H-G): with K difficulty levels i = 0 (easiest) ..
K - 1, level means mu_i = i / (K - 1) and training progress x = t / (T - 1),

    w_i(t) = exp(-(x - mu_i)^2 / (2 sigma^2)),    p_i(t) = w_i(t) / sum_j w_j(t)

so training starts on easy tasks, the mass moves to harder ones, and easy levels fade out
rather than staying in the mix (they are no longer worth their rollouts once learned). Each
step splits ``budget // G`` prompts over the levels by p(t) (largest remainder) and draws each
level's tasks uniformly from the pool.

Levels come from ``Task.difficulty`` (its distinct values, ascending) when every pool task has
one, else from ``order`` (domain names, easiest first).

References: Parashar et al. 2025, "Curriculum Reinforcement Learning from Easy to Hard Tasks
Improves LLM Reasoning", arXiv:2506.06632.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from schedrl.data.base import Batch, DataContext, PoolScheduler, check_number, largest_remainder
from schedrl.envs import Task
from schedrl.registry import check_arg


def level_probs(x: float, k: int, sigma: float) -> list[float]:
    """p_i at progress x in [0, 1] for k levels: softmax-free normalised Gaussian weights."""
    mus = [i / (k - 1) if k > 1 else 0.0 for i in range(k)]
    w = [math.exp(-((x - mu) ** 2) / (2 * sigma**2)) for mu in mus]  # w_i = exp(-(x - mu_i)^2 / 2 sigma^2)
    return [v / sum(w) for v in w]


class EasyToHardScheduler(PoolScheduler):
    """Prompts split over difficulty levels by a Gaussian schedule that slides from easy to hard."""

    name = "e2h"

    @dataclass(frozen=True)
    class Args(PoolScheduler.Args):
        sigma: float = 0.5  # width of each level's Gaussian over training progress
        order: tuple[str, ...] | None = None  # domain names, easiest first, for tasks without a difficulty

        def __post_init__(self) -> None:
            super().__post_init__()
            check_number("sigma", self.sigma, 0, lo_open=True)
            names = isinstance(self.order, list | tuple) and all(isinstance(d, str) for d in self.order)
            check_arg(self.order is None or names, "order", self.order, "a list of domain names")
            if isinstance(self.order, list):  # a frozen record holds a tuple
                object.__setattr__(self, "order", tuple(self.order))

    def __init__(self, ctx: DataContext, args: Args = Args()) -> None:
        super().__init__(ctx, args)
        self.sigma, self.order = args.sigma, args.order
        self._levels: list[list[Task]] | None = None

    @property
    def levels(self) -> list[list[Task]]:
        """Pool tasks per level, easiest level first."""
        if self._levels is None:
            tasks = self.pool.tasks
            if all(t.difficulty is not None for t in tasks):
                values = sorted({t.difficulty for t in tasks if t.difficulty is not None})
                self._levels = [[t for t in tasks if t.difficulty == v] for v in values]
            elif self.order is not None:
                missing = sorted({t.domain for t in tasks} - set(self.order))
                if missing:
                    raise ValueError(
                        f"data scheduler {self.name!r}: order lacks the pool's domains {missing}; "
                        f"order = {self.order!r}"
                    )
                self._levels = [lv for lv in ([t for t in tasks if t.domain == d] for d in self.order) if lv]
            else:
                raise ValueError(
                    f"data scheduler {self.name!r}: the tasks carry no difficulty; give order "
                    f"(domain names, easiest first), e.g. {sorted({t.domain for t in tasks})}"
                )
        return self._levels

    def progress(self) -> float:
        return min(1.0, self.position / max(1, self.ctx.steps - 1))  # x = t / (T - 1)

    def _select(self, budget: int, rng: random.Random) -> Batch:
        g, levels = self.ctx.group_size, self.levels
        counts = largest_remainder(level_probs(self.progress(), len(levels), self.sigma), budget // g)
        return [(rng.choice(lv), g) for lv, k in zip(levels, counts, strict=True) for _ in range(k)]
