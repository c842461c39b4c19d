"""Losses that change how the importance ratio enters: GSPO (one ratio per sequence), CISPO (clipped,
stop-gradient ratio as a REINFORCE weight).

Same conventions as ``losses.py``: pi_theta (``logp``, carries grad), pi_old (``old_logp``, a
constant), pi_ref (``ref_logp``, a constant); ``mask`` (B, T) is 1 on completion tokens.

References: Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071; MiniMax 2025,
"MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention" (CISPO), arXiv:2506.13585;
Khatri et al. 2025, "The Art of Scaling Reinforcement Learning Compute for LLMs" (ScaleRL),
arXiv:2510.13786.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from schedrl.algos.grpo_variants import masked_kl
from schedrl.algos.losses import ClipArgs, broadcast_adv, check_clip_high, masked_mean
from schedrl.algos.registry import register
from schedrl.algos.spec import LossSpec
from schedrl.registry import check_arg


@dataclass(frozen=True)
class CispoArgs(ClipArgs):
    """`ClipArgs` whose clip_eps may be 1: CISPO's weight then has no lower bound."""

    def __post_init__(self) -> None:
        check_arg(0 <= self.clip_eps <= 1, "clip_eps", self.clip_eps, "in [0, 1]")
        check_clip_high(self.clip_eps_high)


@register(
    "loss",
    "gspo",
    "PPO-clip on the sequence ratio exp(mean_t log rho_t), one A per sequence (GSPO)",
    LossSpec(frozenset({"ref_logp"}), args=ClipArgs),
)
def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 3e-4,
    clip_eps_high: float | None = 4e-4,
    agg: str = "seq_mean",
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
) -> tuple[Tensor, dict[str, float]]:
    """GSPO: clip a length-normalised sequence ratio instead of each token's ratio.

    s_i = (pi_theta(o_i | q) / pi_old(o_i | q))^(1/|o_i|) = exp((1/|o_i|) sum_t (logp_it - old_logp_it))
    L   = (1/G) sum_i -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)   (+ beta agg(KL_t))

    Every token of o_i gets the same weight s_i / |o_i| in the gradient, so one noisy token ratio no
    longer decides whether its whole sequence is clipped. Ratios of a sequence-level quantity sit near
    1, hence the paper's tiny clip range (3e-4, 4e-4, the defaults). adv must be (B,): one per sequence.

    agg="seq_mean" is the paper's 1/G average (TRL: importance_sampling_level="sequence",
    loss_type="grpo"); agg="token_mean" weighs sequence i by |o_i| (TRL's loss_type="dapo" with the
    sequence level). Rows without tokens get s = 1 and are skipped by seq_mean. Simplified: the paper's
    GSPO-token variant (per-token advantages through sg[s_i] pi_theta / sg[pi_theta]) is not provided.

    Stats: ``clipfrac`` (fraction of non-empty sequences whose clipped term wins), ``ratio_mean`` and
    ``ratio_max`` of s_i over them, ``approx_kl`` = token mean of old_logp - logp; ``kl`` if kl_coef > 0.
    """
    eps_low = clip_eps
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if not 0.0 <= eps_low < 1.0 or eps_high < 0.0:
        raise ValueError(f"need 0 <= clip_eps < 1 and clip_eps_high >= 0; got {eps_low} and {eps_high}")
    if adv.shape != logp.shape[:1]:
        raise ValueError(f"gspo_loss needs one advantage per sequence, (B,); got {tuple(adv.shape)}")
    kl_t = masked_kl(logp, ref_logp, mask, kl_coef, kl_estimator)  # validates eagerly
    m = mask.bool()
    n = m.sum(dim=-1)  # |o_i|, (B,)
    log_ratio = (logp - old_logp.detach()).masked_fill(~m, 0.0)  # (B, T)
    s = (log_ratio.sum(dim=-1) / n.clamp(min=1)).exp()  # s_i = exp(mean_t log rho_it), (B,)
    a = adv.detach().to(logp.dtype)  # (B,)
    unclipped = s * a  # s A
    clipped = s.clamp(1.0 - eps_low, 1.0 + eps_high) * a  # clip(s) A
    per_seq = -torch.minimum(unclipped, clipped)  # (B,)
    loss = masked_mean(per_seq[:, None].expand_as(logp), m, agg)  # each token of o_i carries L_i
    if kl_t is not None:
        kl = masked_mean(kl_t, m, agg)
        loss = loss + kl_coef * kl  # + beta * KL
    with torch.no_grad():
        rows = n > 0
        stats = {
            "clipfrac": (unclipped > clipped)[rows].to(logp.dtype).mean().item() if rows.any() else 0.0,
            "ratio_mean": s[rows].mean().item() if rows.any() else 0.0,
            "ratio_max": s[rows].max().item() if rows.any() else 0.0,
            "approx_kl": masked_mean(-log_ratio, m).item(),
        }
        if kl_t is not None:
            stats["kl"] = kl.item()
    return loss, stats


@register(
    "loss",
    "cispo",
    "REINFORCE weighted by sg(clip(rho, 1-eps_low, 1+eps_high)), no token dropped (CISPO)",
    LossSpec(frozenset({"ref_logp"}), args=CispoArgs),
)
def cispo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 1.0,
    clip_eps_high: float | None = 4.0,
    agg: str = "token_mean",
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
) -> tuple[Tensor, dict[str, float]]:
    """CISPO: clip the importance weight, not the update, and stop its gradient.

    w_t = sg(clip(rho_t, 1 - eps_low, 1 + eps_high)),   rho_t = exp(logp_t - old_logp_t)
    L   = (1 / sum_i |o_i|) sum_{i,t} -w_t A_t log pi_theta(o_t | .)   (+ beta agg(KL_t))

    (MiniMax 2025, the CISPO objective.) The gradient is -w_t A_t grad log pi_theta for every token:
    PPO's clip zeroes the gradient of tokens outside the trust region (often rare "reflective" tokens),
    CISPO only caps their weight. On-policy (rho = 1) the gradient equals PPO's REINFORCE gradient. The
    loss value itself is not a surrogate of the objective; only its gradient is meaningful.

    Defaults follow MiniMax-M1 (no lower bound: clip_eps=1.0 gives 1 - eps_low = 0 < rho always) and
    TRL/ScaleRL's recommended weight cap of 5 (clip_eps_high=4.0). clip_eps may be in [0, 1] here.
    TRL convention differs: its ``loss_type="cispo"`` caps ``min(rho, epsilon_high)`` with epsilon_high
    an absolute bound and no lower clip, i.e. TRL epsilon_high = 1 + clip_eps_high, clip_eps = 1.

    Stats: ``clipfrac`` = fraction of tokens whose weight was clipped (either side, any sign of A; TRL's
    ``cispo_clip_ratio`` counts only rho > cap with A > 0), ``ratio_mean``, ``ratio_max``, ``approx_kl``.
    """
    eps_low = clip_eps
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if not 0.0 <= eps_low <= 1.0 or eps_high < 0.0:
        raise ValueError(f"need 0 <= clip_eps <= 1 and clip_eps_high >= 0; got {eps_low} and {eps_high}")
    kl_t = masked_kl(logp, ref_logp, mask, kl_coef, kl_estimator)  # validates eagerly
    m = mask.bool()
    a = broadcast_adv(adv.detach().to(logp.dtype), logp)  # (B, 1) or (B, T)
    log_ratio = (logp - old_logp.detach()).masked_fill(~m, 0.0)  # (B, T)
    ratio = log_ratio.exp()  # rho_t
    w = ratio.clamp(1.0 - eps_low, 1.0 + eps_high).detach()  # sg(clip(rho))
    loss = masked_mean(-w * a * logp.masked_fill(~m, 0.0), m, agg)  # -sg(w) A log pi_theta
    if kl_t is not None:
        kl = masked_mean(kl_t, m, agg)
        loss = loss + kl_coef * kl  # + beta * KL
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean((w != ratio).to(logp.dtype), m).item(),
            "ratio_mean": masked_mean(ratio, m).item(),
            "ratio_max": ratio.masked_fill(~m, 0.0).max().item() if m.any() else 0.0,
            "approx_kl": masked_mean(-log_ratio, m).item(),
        }
        if kl_t is not None:
            stats["kl"] = kl.item()
    return loss, stats
