"""Zero-variance filtering with refill (DAPO dynamic sampling), with a band-pass on group accuracy.

Rule (DAPO, Sec. 3.2): a group whose samples are all right or all wrong has zero advantage and
gives no gradient, so keep only prompts with 0 < accuracy < 1 and refill the batch with more
prompts until it holds ``budget // G`` of them. The band-pass generalises the test to
``acc_low < accuracy < acc_high``.

Simplified relative to DAPO: DAPO generates, filters and generates again within a step (spending
extra rollouts on every filtered group). Here the test reads the task's latest observed group
(from an earlier step), so a filtered task is replaced before any token is spent on it; a task
never observed passes, and a filtered task becomes eligible again ``retry_after`` steps after its
last observation, since the policy has moved. Tasks come from a fixed pool in seeded epochs.

References: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv:2503.14476, Sec. 3.2 (dynamic sampling).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from schedrl.data.base import Batch, DataContext, EpochOrder, PoolScheduler, check_number
from schedrl.envs import Task
from schedrl.registry import check_arg


class ZeroVarianceScheduler(PoolScheduler):
    """Skip tasks whose last group fell outside the accuracy band; refill from the pool."""

    name = "zero_variance"

    @dataclass(frozen=True)
    class Args(PoolScheduler.Args):
        acc_low: float = 0.0  # a task whose last group's accuracy is <= this is skipped
        acc_high: float = 1.0  # ... and one whose last group's accuracy is >= this
        retry_after: int = 50  # steps after its last observation a skipped task is eligible again

        def __post_init__(self) -> None:
            super().__post_init__()
            check_number("acc_low", self.acc_low, 0, 1)
            check_number("acc_high", self.acc_high, 0, 1)
            check_arg(self.acc_low < self.acc_high, "acc_high", self.acc_high, f"> acc_low ({self.acc_low})")
            check_number("retry_after", self.retry_after, 1, integer=True)

    def __init__(self, ctx: DataContext, args: Args = Args()) -> None:
        super().__init__(ctx, args)
        self.acc_low, self.acc_high, self.retry_after = args.acc_low, args.acc_high, args.retry_after
        self.order = EpochOrder()
        self.filtered = 0  # tasks skipped so far (for logging)

    def passes(self, task: Task) -> bool:
        """Never seen, last accuracy inside the band, or last seen ``retry_after`` or more steps ago."""
        acc, last = self.stats.last_accuracy(task), self.stats.last_step(task)
        if acc is None or last is None or self.acc_low < acc < self.acc_high:
            return True
        return self.position - last >= self.retry_after

    def _select(self, budget: int, rng: random.Random) -> Batch:
        g = self.ctx.group_size
        n_prompts = budget // g
        kept, skipped = [], []
        for _ in range(len(self.pool.tasks)):  # at most one pass over the pool per step
            if len(kept) == n_prompts:
                break
            task = self.order.take(self, 1)[0]
            (kept if self.passes(task) else skipped).append(task)
        self.filtered += len(skipped)
        kept += skipped[: n_prompts - len(kept)]  # the whole pool is filtered: train on what is left
        return [(t, g) for t in kept]

    def _extra_state(self) -> dict[str, Any]:
        return {"order": self.order.state_dict(), "filtered": self.filtered}

    def _load_extra(self, state: dict[str, Any]) -> None:
        self.order.load_state_dict(state["order"])
        self.filtered = int(state["filtered"])
