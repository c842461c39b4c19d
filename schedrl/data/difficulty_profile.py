"""Difficulty profiling (sGPO): group size proportional to 1/p, trivial tasks dropped, easy to hard.

Rule: estimate each task's success rate p in one cheap pass (``probe_samples`` samples per pool
task), then give each task

    n = clip(ceil(scale / p), min_group, max_group)

samples, so a hard task gets enough draws to expect about ``scale`` successes (a group with no
success has no advantage). Tasks with p > ``trivial_p`` are dropped; tasks with
p < ``unsolvable_p`` are kept with probability ``unsolvable_keep`` per pass. Each pass over the
pool runs from easy to hard (p descending), and p is re-estimated online from every trained
group (``TaskStats``: decayed counts shrunk toward the domain's rate), so the next pass is
re-ordered and re-filtered.

Simplified relative to sGPO: the paper profiles once under the initial policy and trains on a
fixed schedule; here the profiling pass trains on its probe groups too (so its rollouts are not
wasted), the estimate borrows strength from the task's domain, and p is re-estimated online.

References: Sudalairaj, Xu, Srivastava and Giannone 2026, "sGPO: Trading Inference FLOPs for
Training Efficiency in RLVR", arXiv:2606.08854 (group size = 1 / success rate).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from schedrl.data.base import Batch, DataContext, PoolScheduler, check_number
from schedrl.envs import Task


class DifficultyProfileScheduler(PoolScheduler):
    """Probe every pool task once, then passes from easy to hard with group size ~ 1/p."""

    name = "difficulty_profile"

    @dataclass(frozen=True)
    class Args(PoolScheduler.Args):
        pool_size: int = 512  # distinct train tasks drawn once from the source
        probe_samples: int = 2  # samples per pool task in the profiling pass
        scale: float = 2.0  # successes a group should expect: n = scale / p
        min_group: int = 2  # smallest trained group (a group of one has no advantage)
        max_group: int = 16  # largest group, however hard the task
        trivial_p: float = 0.9  # tasks estimated above this success rate are dropped
        unsolvable_p: float = 0.05  # tasks estimated below this success rate are subsampled
        unsolvable_keep: float = 0.1  # chance an unsolvable task is kept in a pass

        def __post_init__(self) -> None:
            super().__post_init__()
            check_number("probe_samples", self.probe_samples, 1, integer=True)
            check_number("scale", self.scale, 0, lo_open=True)
            check_number("min_group", self.min_group, 2, integer=True)
            check_number("max_group", self.max_group, self.min_group, integer=True)
            check_number("trivial_p", self.trivial_p, 0, 1)
            check_number("unsolvable_p", self.unsolvable_p, 0, self.trivial_p)
            check_number("unsolvable_keep", self.unsolvable_keep, 0, 1)

    def __init__(self, ctx: DataContext, args: Args = Args()) -> None:
        super().__init__(ctx, args)
        self.probe_samples, self.scale = args.probe_samples, args.scale
        self.min_group, self.max_group = args.min_group, args.max_group
        self.trivial_p, self.unsolvable_p = args.trivial_p, args.unsolvable_p
        self.unsolvable_keep = args.unsolvable_keep
        self.queue: list[str] = []  # task ids left in this pass, easiest first
        self.passes = 0

    @property
    def min_budget(self) -> int:
        return max(self.min_group, self.probe_samples)

    def group_size(self, p: float) -> int:
        return min(self.max_group, max(self.min_group, math.ceil(self.scale / p)))  # n ~ scale / p

    def new_pass(self) -> list[str]:
        """Pool tasks to train on, easiest first: trivial dropped, unsolvable subsampled."""
        rng, keep = self.rng("pass", self.passes), []
        self.passes += 1
        for task in self.pool.tasks:
            p = self.stats.p(task)
            if p > self.trivial_p or (p < self.unsolvable_p and rng.random() >= self.unsolvable_keep):
                continue
            keep.append(task)
        if not keep:  # everything is trivial or out of reach: keep training on the whole pool
            keep = list(self.pool.tasks)
        return [t.id for t in sorted(keep, key=lambda t: -self.stats.p(t))]  # stable: ties keep pool order

    def _select(self, budget: int, rng: random.Random) -> Batch:
        unprofiled = [t for t in self.pool.tasks if not self.stats.seen(t)]
        if unprofiled:  # the cheap pass: probe_samples per task until every task has an estimate
            return [(t, self.probe_samples) for t in unprofiled[: budget // self.probe_samples]]
        batch: list[tuple[Task, int]] = []
        left, refilled = budget, False
        while left >= self.min_group:
            if not self.queue:
                if refilled:
                    break
                self.queue, refilled = self.new_pass(), True
            task = self.pool.by_id[self.queue[0]]
            n = self.group_size(self.stats.p(task))
            if n > left:
                n = left  # the last group takes what is left of the budget (left >= min_group)
            batch.append((task, n))
            self.queue.pop(0)
            left -= n
        return batch

    def _extra_state(self) -> dict[str, Any]:
        return {"queue": list(self.queue), "passes": self.passes}

    def _load_extra(self, state: dict[str, Any]) -> None:
        self.queue = [str(x) for x in state["queue"]]
        self.passes = int(state["passes"])
