"""SAO: one rollout per prompt, a learned value of the prompt as the baseline, strict double-sided
token clipping.

Conventions as ``losses.py``; ``values`` (B, T) are the value head's V(s_t) at every target position
(``schedrl.training.value_head.ValueHead``), carrying grad.

References: Schulman et al. 2017, "Proximal Policy Optimization Algorithms", arXiv:1707.06347, for the
ratio and the clip. The paper defining SAO's exact objective was not available offline; the equation
below is assembled from SAO's three stated ingredients (a single sample per prompt, a value-model
baseline, strict two-sided token clipping) and nothing more, so treat it as an approximation of SAO.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from schedrl.algos.losses import ClipArgs, broadcast_adv, masked_mean
from schedrl.algos.registry import register
from schedrl.algos.spec import LossSpec
from schedrl.registry import check_arg


@dataclass(frozen=True)
class SAOArgs(ClipArgs):
    """The clip band and the weight of the prompt-value loss."""

    vf_coef: float = 0.1  # weight of the value loss

    def __post_init__(self) -> None:
        super().__post_init__()
        check_arg(self.vf_coef >= 0, "vf_coef", self.vf_coef, ">= 0")


def first_token_values(values: Tensor, mask: Tensor) -> Tensor:
    """V at each row's first completion target, i.e. the value of the prompt.  (B, T) -> (B,), 0 if empty."""
    m = mask.bool()
    first = m.to(torch.int8).argmax(dim=-1)  # (B,) index of the first valid target
    v = values.gather(-1, first[:, None]).squeeze(-1)
    return torch.where(m.any(dim=-1), v, torch.zeros_like(v))


@register(
    "loss",
    "sao",
    "one sample per prompt, A = r - V(prompt) from a value head, strict two-sided clip (SAO)",
    LossSpec(frozenset({"values"}), args=SAOArgs),
)
def sao_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    values: Tensor,
    vf_coef: float = 0.1,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    agg: str = "token_mean",
) -> tuple[Tensor, dict[str, float]]:
    """Single-sample policy gradient with a learned prompt baseline and a strict trust region.

    b_i = V(x_i)                      value head at the prompt (first completion target), trained below
    A_i = r_i - sg(b_i)               ``adv`` holds the rewards r_i (the ``reward`` advantage estimator)
    rho_t = pi_theta(o_t) / pi_old(o_t)
    L   = agg( -clip(rho_t, 1 - eps_low, 1 + eps_high) A_i ) + vf_coef * agg( 0.5 (b_i - r_i)^2 )

    Without a group there is no group mean to subtract, so the baseline is a learned V(x) of the prompt
    (a critic over prompts, not tokens: no GAE). The value term is aggregated like the policy term
    (every token of o_i carries sequence i's error), so token_mean weighs a sequence by its length, and
    micro-batching does not change the update. Strict double-sided clipping: PPO's min() clips only the
    side that would increase the objective, so a token whose ratio left the trust region in the other
    direction still has a gradient; here the loss is clip(rho) A alone, whose gradient is 0 whenever
    rho is outside [1 - eps_low, 1 + eps_high], whatever the sign of A. Inside, the gradient is PPO's.

    Stats: ``clipfrac`` (tokens outside the band), ``ratio_mean``, ``baseline_mean``, ``vf_loss``.
    """
    eps_low = clip_eps
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if not 0.0 <= eps_low < 1.0 or eps_high < 0.0:
        raise ValueError(f"need 0 <= clip_eps < 1 and clip_eps_high >= 0; got {eps_low} and {eps_high}")
    if vf_coef < 0:
        raise ValueError(f"vf_coef must be >= 0; got {vf_coef}")
    if adv.shape != logp.shape[:1]:
        raise ValueError(f"sao_loss needs one reward per sequence, (B,); got {tuple(adv.shape)}")
    m = mask.bool()
    r = adv.detach().to(logp.dtype)  # (B,)
    b = first_token_values(values, m)  # V(x_i), (B,), carries grad
    a = broadcast_adv(r - b.detach(), logp)  # A_i = r_i - sg(V(x_i)), (B, 1)
    ratio = (logp - old_logp.detach()).masked_fill(~m, 0.0).exp()  # rho_t
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)  # gradient 0 outside the band
    policy = masked_mean(-clipped * a, m, agg)
    rows = m.any(dim=-1)
    vf = masked_mean((0.5 * (b - r) ** 2)[:, None].expand_as(logp), m, agg)  # 0.5 (V(x_i) - r_i)^2 per token
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean((clipped != ratio).to(logp.dtype), m).item(),
            "ratio_mean": masked_mean(ratio, m).item(),
            "baseline_mean": b[rows].mean().item() if rows.any() else 0.0,
            "vf_loss": vf.item(),
        }
    return policy + vf_coef * vf, stats
