"""UCB over domains (DUMP): train most on the domains whose groups currently carry the most signal.

Rule (DUMP, Alg. 1): each domain (task distribution) d keeps the mean absolute advantage of its
recent groups as its learnability score, plus an exploration bonus,

    UCB_d = mean_{last W groups of d} |A|  +  c * sqrt(2 ln N / n_d)

where n_d counts the groups drawn from d and N = sum_d n_d; a domain never drawn scores +inf.
Each prompt of the batch then picks its domain from softmax(UCB / tau) and a task of that domain
uniformly from the pool. Mean |A| is zero for a group whose samples all score alike (already
solved, or out of reach), so such domains fade out unless exploration brings them back.

Simplified relative to DUMP: domains are the tasks' ``domain`` labels; the window is counted in
groups, not steps.

References: Wang et al. 2025, "DUMP: Automated Distribution-Level Curriculum Learning for RL-based
LLM Post-training", arXiv:2504.09710.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schedrl.data.base import Batch, DataContext, PoolScheduler, ScoredGroup, check_number


class UCBDomainScheduler(PoolScheduler):
    """Domains drawn by softmax of UCB scores over mean |advantage|; ``G`` samples per task."""

    name = "dump_ucb"

    @dataclass(frozen=True)
    class Args(PoolScheduler.Args):
        window: int = 64  # W: a domain's score averages its last W groups
        c: float = 0.2  # weight of the exploration bonus
        tau: float = 0.1  # softmax temperature over the scores

        def __post_init__(self) -> None:
            super().__post_init__()
            check_number("window", self.window, 1, integer=True)
            check_number("c", self.c, 0)
            check_number("tau", self.tau, 0, lo_open=True)

    def __init__(self, ctx: DataContext, args: Args = Args()) -> None:
        super().__init__(ctx, args)
        self.window, self.c, self.tau = args.window, args.c, args.tau
        self.recent: dict[str, list[float]] = {}  # domain -> mean |A| of its last `window` groups
        self.drawn: dict[str, int] = {}  # domain -> groups drawn (n_d)

    def scores(self, domains: Sequence[str]) -> list[float]:
        """UCB_d for each domain (``inf`` for a domain never drawn)."""
        total = sum(self.drawn.get(d, 0) for d in domains)
        out = []
        for d in domains:
            n, recent = self.drawn.get(d, 0), self.recent.get(d, [])
            if n == 0:
                out.append(math.inf)
                continue
            mean = sum(recent) / len(recent) if recent else 0.0
            out.append(mean + self.c * math.sqrt(2 * math.log(max(total, 1)) / n))  # exploitation + bonus
        return out

    def probs(self, domains: Sequence[str]) -> list[float]:
        """softmax(UCB / tau); domains never drawn share all the mass while any are left."""
        s = self.scores(domains)
        if any(math.isinf(x) for x in s):
            return [1.0 / s.count(math.inf) if math.isinf(x) else 0.0 for x in s]
        top = max(s)
        e = [math.exp((x - top) / self.tau) for x in s]
        return [x / sum(e) for x in e]

    def _select(self, budget: int, rng: random.Random) -> Batch:
        g, domains = self.ctx.group_size, self.pool.domains
        probs = self.probs(domains)
        batch = []
        for _ in range(budget // g):
            d = rng.choices(domains, weights=probs)[0]
            batch.append((rng.choice(self.pool.by_domain[d]), g))
        return batch

    def observe(self, groups: Sequence[ScoredGroup]) -> None:
        super().observe(groups)
        for grp in groups:
            d = grp.task.domain
            self.drawn[d] = self.drawn.get(d, 0) + 1
            self.recent[d] = (self.recent.get(d, []) + [grp.mean_abs_advantage])[-self.window :]

    def _extra_state(self) -> dict[str, Any]:
        return {"recent": {k: list(v) for k, v in self.recent.items()}, "drawn": dict(self.drawn)}

    def _load_extra(self, state: dict[str, Any]) -> None:
        self.recent = {k: [float(x) for x in v] for k, v in state["recent"].items()}
        self.drawn = {k: int(v) for k, v in state["drawn"].items()}
