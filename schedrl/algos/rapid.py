"""RAPID: large-batch inference, then off-policy minibatch updates with an importance-weighted group
policy gradient.

Conventions as ``losses.py``: pi_theta (``logp``, carries grad); pi_old (``old_logp``), the policy that
generated the large batch, a constant; ``mask`` (B, T) 1 on completion tokens.

References: Huang, Anupam, Lee, Li, Bastani 2025, "RAPID: An Efficient Reinforcement Learning Algorithm
for Small Language Models", arXiv:2510.03515.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from schedrl.algos.losses import masked_mean
from schedrl.algos.registry import register
from schedrl.algos.spec import LossSpec
from schedrl.registry import check_arg


@dataclass(frozen=True)
class RapidArgs:
    is_cap: float = 2.0  # cap C of the sequence importance weight; >= 1, .inf = no cap

    def __post_init__(self) -> None:
        check_arg(self.is_cap >= 1, "is_cap", self.is_cap, ">= 1")


@register(
    "loss",
    "rapid",
    "group advantage x sg(min(pi_theta / pi_old, C)) sequence IS weight, off-policy minibatches (RAPID)",
    LossSpec(args=RapidArgs),
)
def rapid_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    is_cap: float | None = 2.0,
    agg: str = "seq_mean",
) -> tuple[Tensor, dict[str, float]]:
    """Importance-weighted group-relative policy gradient for updates on stale minibatches.

    w_i = sg(min(pi_theta(o_i | q) / pi_old(o_i | q), C)) = sg(min(exp(sum_t (logp_it - old_logp_it)), C))
    L   = agg( -w_i A_i log pi_theta(o_it | q, o_i,<t) )
    grad L = -agg( w_i A_i grad log pi_theta(o_it | .) )

    RAPID samples one large batch with the inference engine, then takes several minibatch steps on it;
    every step after the first is off-policy, so the group-relative REINFORCE gradient A_i grad log
    pi_theta(o_i) is reweighted by the whole-sequence ratio pi_theta / pi_old, whose expectation under
    pi_old is the on-policy gradient. The weight is truncated at C (``is_cap``) to bound its variance,
    which biases it towards pi_old when pi_theta has moved far. A_i is the group advantage (``grpo``
    estimator), one per sequence. The schedule part of RAPID is configuration, not loss: a large
    ``sampling.prompts_per_step`` with ``optim.minibatches`` > 1 (and ``ppo_epochs``).

    Simplified: no trust-region clip and no KL term; the exact clipping of the paper's weight (we cap
    from above only) is not reproduced. On the first minibatch pi_theta = pi_old, w = 1, and the gradient
    is GRPO's on-policy gradient.

    Stats: ``is_weight_mean`` (mean w_i over non-empty rows), ``is_weight_capped_frac``, ``approx_kl``.
    """
    cap = math.inf if is_cap is None else is_cap
    if not cap >= 1.0:
        raise ValueError(f"is_cap must be >= 1 (or None for no cap); got {is_cap}")
    if adv.shape != logp.shape[:1]:
        raise ValueError(f"rapid_loss needs one advantage per sequence, (B,); got {tuple(adv.shape)}")
    m = mask.bool()
    log_ratio = (logp.detach() - old_logp.detach()).masked_fill(~m, 0.0)  # (B, T)
    seq_log_w = log_ratio.sum(dim=-1)  # log pi_theta(o_i) / pi_old(o_i), (B,)
    w = seq_log_w.clamp(max=math.log(cap)).exp()  # sg(min(w_i, C))
    a = adv.detach().to(logp.dtype)
    loss = masked_mean(-(w * a)[:, None] * logp.masked_fill(~m, 0.0), m, agg)  # -w_i A_i log pi_theta
    with torch.no_grad():
        rows = m.any(dim=-1)
        stats = {
            "is_weight_mean": w[rows].mean().item() if rows.any() else 0.0,
            "is_weight_capped_frac": (seq_log_w > math.log(cap))[rows].float().mean().item()
            if rows.any()
            else 0.0,
            "approx_kl": masked_mean(-log_ratio, m).item(),
        }
    return loss, stats
