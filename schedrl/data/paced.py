"""Accuracy-prioritised sampling with error-prioritised replay (the data side of PACED-RL).

Rule (PACED-RL, Sec. 4): prompts whose estimated accuracy p is near a target tau carry the most
learning signal, so fresh prompts are drawn without replacement with weights

    w_i = exp(-(p_i - tau)^2 / (2 width^2))

and a replay buffer keeps the tasks whose accuracy estimate was most wrong when they were last
trained (error e_i = |p_i before the group - the group's accuracy|); a fraction ``replay_frac`` of
each batch is drawn from the buffer with weights e_i. A replayed task leaves the buffer and comes
back only if its new error is still at least ``min_error``.

Simplified relative to PACED-RL: the paper reads p from a GFlowNet's learned partition function
(p ~ beta log Z); without GFlowNets, p is the online estimate of ``TaskStats`` (decayed counts
shrunk toward the domain's rate), and its error is measured the same way.

References: Kim et al. 2026, "Beyond Normalization: Rethinking the Partition Function as a
Difficulty Scheduler for RLVR" (PACED-RL), arXiv:2602.12642.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from schedrl.data.base import Batch, DataContext, PoolScheduler, ScoredGroup, check_number
from schedrl.envs import Task


def weighted_sample(
    items: Sequence[Task], weights: Sequence[float], k: int, rng: random.Random
) -> list[Task]:
    """``k`` items without replacement, P ~ weight (Efraimidis-Spirakis keys u^(1/w)); zero weights never."""
    keyed = [(rng.random() ** (1.0 / w), i) for i, w in enumerate(weights) if w > 0]
    keyed.sort(key=lambda kv: (-kv[0], kv[1]))
    return [items[i] for _, i in keyed[:k]]


class PacedScheduler(PoolScheduler):
    """Fresh prompts near the target accuracy, plus replay of tasks whose estimate missed most."""

    name = "paced"

    def __init__(
        self,
        ctx: DataContext,
        pool_size: int = 1024,
        tau: float = 0.5,
        width: float = 0.2,
        replay_frac: float = 0.25,
        buffer_size: int = 256,
        min_error: float = 0.2,
    ) -> None:
        super().__init__(ctx, pool_size)
        self.tau = check_number(self.name, "tau", tau, 0, 1)
        self.width = check_number(self.name, "width", width, 0, lo_open=True)
        self.replay_frac = check_number(self.name, "replay_frac", replay_frac, 0, 1)
        self.buffer_size = check_number(self.name, "buffer_size", buffer_size, 1, integer=True)
        self.min_error = check_number(self.name, "min_error", min_error, 0, 1)
        self.buffer: dict[str, float] = {}  # task id -> accuracy-estimate error e_i

    def priority(self, p: float) -> float:
        return math.exp(-((p - self.tau) ** 2) / (2 * self.width**2))  # w_i, largest at p = tau

    def _select(self, budget: int, rng: random.Random) -> Batch:
        g, n_prompts = self.ctx.group_size, budget // self.ctx.group_size
        replay_ids = list(self.buffer)
        replay = [self.pool.by_id[i] for i in replay_ids]
        chosen = weighted_sample(
            replay,
            [self.buffer[i] for i in replay_ids],
            min(len(replay), round(self.replay_frac * n_prompts)),
            rng,
        )
        for t in chosen:
            del self.buffer[t.id]
        taken = {t.id for t in chosen}
        fresh = [t for t in self.pool.tasks if t.id not in taken]
        chosen += weighted_sample(
            fresh, [self.priority(self.stats.p(t)) for t in fresh], n_prompts - len(chosen), rng
        )
        return [(t, g) for t in chosen]

    def observe(self, groups: Sequence[ScoredGroup]) -> None:
        errors = {
            grp.task.id: abs(self.stats.p(grp.task) - grp.accuracy) for grp in groups
        }  # before the update
        super().observe(groups)
        for task_id, err in errors.items():
            if err >= self.min_error and task_id in self.pool.by_id:
                self.buffer[task_id] = err
            else:
                self.buffer.pop(task_id, None)
        if len(self.buffer) > self.buffer_size:  # keep the largest errors (ties: the earlier entry)
            keep = {k for k, _ in sorted(self.buffer.items(), key=lambda kv: -kv[1])[: self.buffer_size]}
            self.buffer = {k: v for k, v in self.buffer.items() if k in keep}

    def _extra_state(self) -> dict[str, Any]:
        return {"buffer": [[k, v] for k, v in self.buffer.items()]}

    def _load_extra(self, state: dict[str, Any]) -> None:
        self.buffer = {str(k): float(v) for k, v in state["buffer"]}
