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
from dataclasses import dataclass
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

    @dataclass(frozen=True)
    class Args(PoolScheduler.Args):
        tau: float = 0.5  # target accuracy: fresh prompts estimated near it are drawn most
        width: float = 0.2  # width of the Gaussian priority around tau
        replay_frac: float = 0.25  # share of each batch's prompts drawn from the replay buffer
        buffer_size: int = 256  # most tasks the replay buffer holds (the largest errors stay)
        min_error: float = 0.2  # a trained task enters the buffer when its estimate missed by this much

        def __post_init__(self) -> None:
            super().__post_init__()
            check_number("tau", self.tau, 0, 1)
            check_number("width", self.width, 0, lo_open=True)
            check_number("replay_frac", self.replay_frac, 0, 1)
            check_number("buffer_size", self.buffer_size, 1, integer=True)
            check_number("min_error", self.min_error, 0, 1)

    def __init__(self, ctx: DataContext, args: Args = Args()) -> None:
        super().__init__(ctx, args)
        self.tau, self.width, self.replay_frac = args.tau, args.width, args.replay_frac
        self.buffer_size, self.min_error = args.buffer_size, args.min_error
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
