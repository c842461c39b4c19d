"""Domain reweighting from historical rewards (RuleReasoner's domain-aware dynamic sampling).

Rule (RuleReasoner, Sec. 3): domains where the policy earns less reward are sampled more. With
r_d the domain's historical mean reward (an exponential moving average of its groups' mean
reward clipped to [0, 1], decay ``beta``),

    v_d = (1 - r_d) + eps,    w_d <- (1 - alpha) * w_d + alpha * v_d / sum_d' v_d'

starting from the pool's own domain mix. Each step splits ``budget // G`` prompts over the
domains in proportion to w (largest remainder) and draws each domain's tasks uniformly from the
pool; a domain not yet observed keeps its starting weight share.

Simplified relative to RuleReasoner: one update per step from the observed groups, and the
smoothing ``alpha`` stands in for the paper's re-normalised weight update.

References: Liu et al. 2025, "RuleReasoner: Reinforced Rule-based Reasoning via Domain-aware
Dynamic Sampling", arXiv:2506.08672.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schedrl.data.base import Batch, DataContext, PoolScheduler, ScoredGroup, check_number, largest_remainder


class DomainReweightScheduler(PoolScheduler):
    """Prompts split over domains by weights that grow where historical reward is low."""

    name = "domain_reweight"

    @dataclass(frozen=True)
    class Args(PoolScheduler.Args):
        alpha: float = 0.3  # smoothing of the weight update (1: the new weights replace the old)
        beta: float = 0.9  # decay of a domain's historical mean reward (EMA)
        eps: float = 0.05  # floor added to 1 - r_d, so a solved domain keeps some weight

        def __post_init__(self) -> None:
            super().__post_init__()
            check_number("alpha", self.alpha, 0, 1)
            check_number("beta", self.beta, 0, 1)
            check_number("eps", self.eps, 0, lo_open=True)

    def __init__(self, ctx: DataContext, args: Args = Args()) -> None:
        super().__init__(ctx, args)
        self.alpha, self.beta, self.eps = args.alpha, args.beta, args.eps
        self.reward: dict[str, float] = {}  # domain -> EMA of group mean reward (r_d)
        self.weights: dict[str, float] = {}  # domain -> w_d; empty until the pool is known

    def domain_weights(self) -> dict[str, float]:
        if not self.weights:
            n = len(self.pool.tasks)
            self.weights = {d: len(self.pool.by_domain[d]) / n for d in self.pool.domains}
        return self.weights

    def _select(self, budget: int, rng: random.Random) -> Batch:
        g, w = self.ctx.group_size, self.domain_weights()
        counts = largest_remainder([w[d] for d in self.pool.domains], budget // g)
        return [
            (rng.choice(self.pool.by_domain[d]), g)
            for d, k in zip(self.pool.domains, counts, strict=True)
            for _ in range(k)
        ]

    def observe(self, groups: Sequence[ScoredGroup]) -> None:
        super().observe(groups)
        by_domain: dict[str, list[float]] = {}
        for grp in groups:
            by_domain.setdefault(grp.task.domain, []).append(grp.accuracy)
        for d, rs in sorted(by_domain.items()):
            mean = sum(rs) / len(rs)
            self.reward[d] = (
                mean if d not in self.reward else self.beta * self.reward[d] + (1 - self.beta) * mean
            )
        w = self.domain_weights()
        v = {d: 1.0 - self.reward[d] + self.eps for d in w if d in self.reward}  # v_d = (1 - r_d) + eps
        if not v:
            return
        share = sum(w[d] for d in v)  # observed domains re-split their share; the rest keep theirs
        for d in v:
            w[d] = (1 - self.alpha) * w[d] + self.alpha * share * v[d] / sum(v.values())

    def _extra_state(self) -> dict[str, Any]:
        return {"reward": dict(self.reward), "weights": dict(self.weights)}

    def _load_extra(self, state: dict[str, Any]) -> None:
        self.reward = {k: float(v) for k, v in state["reward"].items()}
        self.weights = {k: float(v) for k, v in state["weights"].items()}
