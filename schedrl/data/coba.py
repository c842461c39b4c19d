"""Budget allocation (CoBA-RL): spend the step's samples where the expected training value is highest.

Rule (CoBA-RL, heap-based greedy allocation): each candidate task i has a value V_i(n) for n
samples, concave in n; a max-heap holds every task's marginal gain, and the budget goes one
unit at a time to the largest gain until it runs out or no gain is left. Here

    V_i(n) = p_i (1 - p_i) * (1 - p_i^n - (1 - p_i)^n)

the expected reward variance under the current policy times the chance that a group of n is
informative (not all right, not all wrong). V_i(1) = 0 (a group of one has no advantage), so the
first unit a task receives is ``min_group`` samples; later units are single samples up to
``max_group``. The total never exceeds the budget. Candidates are the next ``candidates`` pool
tasks in seeded epoch order; p_i is re-estimated from every trained group (``TaskStats``).

Worked example (min_group 2, max_group 4, budget 6; p = 0.5 and 0.1): gains 0.125 (a -> 2),
0.0625 (a -> 3), 0.03125 (a -> 4), then 0.0162 (b -> 2): allocation (4, 2).

Simplified relative to CoBA-RL: the paper's capability-oriented value (a Beta-shaped function of
the pass rate whose shape follows the global failure rate) is replaced by p(1 - p) times the
informative-group probability above.

References: Yao et al. 2026, "CoBA-RL: Capability-Oriented Budget Allocation for Reinforcement
Learning in LLMs", arXiv:2602.03048.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from typing import Any

from schedrl.data.base import Batch, DataContext, EpochOrder, PoolScheduler, check_number


def group_value(p: float, n: int) -> float:
    """V(n) = p (1 - p) (1 - p^n - (1 - p)^n): reward variance times P(the group is informative)."""
    q = 1.0 - p
    return p * q * (1.0 - p**n - q**n)


def allocate(ps: list[float], budget: int, min_group: int, max_group: int) -> list[int]:
    """Heap-greedy sample counts for tasks with success rates ``ps``; ``sum <= budget``, each 0 or in range."""
    counts = [0] * len(ps)
    heap = [(-group_value(p, min_group), i, min_group) for i, p in enumerate(ps)]  # (-gain, task, new n)
    heapq.heapify(heap)
    left = budget
    while heap and left > 0:
        neg_gain, i, n = heapq.heappop(heap)
        if -neg_gain <= 0 or n - counts[i] > left:
            continue
        left -= n - counts[i]
        counts[i] = n
        if n < max_group:
            heapq.heappush(heap, (-(group_value(ps[i], n + 1) - group_value(ps[i], n)), i, n + 1))
    return counts


class BudgetAllocScheduler(PoolScheduler):
    """Heap-greedy group sizes over a window of candidate tasks, by expected training value."""

    name = "coba"

    @dataclass(frozen=True)
    class Args(PoolScheduler.Args):
        candidates: int = 64  # pool tasks (in epoch order) the budget is split over each step
        min_group: int = 2  # a task's first unit of samples (a group of one has no advantage)
        max_group: int = 32  # most samples one task gets in a step

        def __post_init__(self) -> None:
            super().__post_init__()
            check_number("candidates", self.candidates, 1, integer=True)
            check_number("min_group", self.min_group, 2, integer=True)
            check_number("max_group", self.max_group, self.min_group, integer=True)

    def __init__(self, ctx: DataContext, args: Args = Args()) -> None:
        super().__init__(ctx, args)
        self.candidates, self.min_group, self.max_group = args.candidates, args.min_group, args.max_group
        self.order = EpochOrder()

    @property
    def min_budget(self) -> int:
        return self.min_group

    def _select(self, budget: int, rng: random.Random) -> Batch:
        tasks = self.order.take(self, self.candidates)
        counts = allocate([self.stats.p(t) for t in tasks], budget, self.min_group, self.max_group)
        batch = [(t, n) for t, n in zip(tasks, counts, strict=True) if n > 0]
        return batch or [(tasks[0], self.min_group)]

    def _extra_state(self) -> dict[str, Any]:
        return {"order": self.order.state_dict()}

    def _load_extra(self, state: dict[str, Any]) -> None:
        self.order.load_state_dict(state["order"])
