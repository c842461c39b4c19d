"""Uniform sampling: ``budget // G`` fresh tasks from the source, ``G`` samples each.

Rule: step k trains on ``source.sample("train", budget // G, derive_seed(seed, "data", k))``, every
task with the run's group size G. This is the fixed-``n`` baseline every framework ships, and
exactly the task stream of the synchronous loop before data schedulers existed.

References: Shao et al. 2024, "DeepSeekMath" (GRPO), arXiv:2402.03300: a fixed group of G
samples per prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from schedrl.data.base import Batch, DataContext, ScoredGroup, check_batch, check_budget
from schedrl.seeding import derive_seed


class UniformScheduler:
    """Fresh tasks each step, ``G`` samples each; observations are ignored."""

    name = "uniform"

    def __init__(self, ctx: DataContext) -> None:
        self.ctx = ctx
        self.position = 0  # batches handed out so far

    def next_batch(self, budget: int) -> Batch:
        g = self.ctx.group_size
        check_budget(self.name, budget, g)
        tasks = self.ctx.source.sample(
            "train", budget // g, derive_seed(self.ctx.seed, "data", self.position)
        )
        self.position += 1
        return check_batch(self.name, [(t, g) for t in tasks], budget)

    def observe(self, groups: Sequence[ScoredGroup]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])
