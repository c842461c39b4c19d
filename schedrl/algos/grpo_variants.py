"""GRPO variants that change how the loss is normalised or the reward scaled: Dr. GRPO, DAPO, Lite PPO.

Same conventions as ``losses.py``: pi_theta (``logp``, carries grad), pi_old (``old_logp``, a
constant), pi_ref (``ref_logp``, a constant); ``mask`` (B, T) is 1 on completion tokens.

References: Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective" (Dr. GRPO),
arXiv:2503.20783; Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv:2503.14476; Liu et al. 2025, "Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning"
(Lite PPO), arXiv:2508.08221.
"""

from __future__ import annotations

import torch
from torch import Tensor

from schedrl.algos.advantages import group_stats
from schedrl.algos.losses import KL_ESTIMATORS, ClipArgs, grpo_loss, kl_penalty, ppo_clip_loss
from schedrl.algos.registry import register
from schedrl.algos.spec import LossSpec


def masked_kl(
    logp: Tensor, ref_logp: Tensor | None, mask: Tensor, kl_coef: float, estimator: str
) -> Tensor | None:
    """Per-token KL(pi_theta || pi_ref) (B, T), 0 on padding; None when kl_coef == 0 (checked eagerly).

    Shared by the variants here so each adds ``kl_coef * agg(KL_t)`` with its own aggregation, as
    ``grpo_loss`` does; with a linear agg this equals TRL's ``per_token_loss + beta * per_token_kl``.
    """
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0; got {kl_coef}")
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")
    if kl_coef == 0:
        return None
    if ref_logp is None:
        raise ValueError("kl_coef > 0 needs ref_logp (log-probs under the reference policy)")
    m = mask.bool()
    kl_t = kl_penalty(logp.masked_fill(~m, 0.0), ref_logp.masked_fill(~m, 0.0), estimator)  # (B, T)
    return kl_t.masked_fill(~m, 0.0)


@register(
    "loss",
    "drgrpo",
    "PPO-clip token sum / constant max_tokens: no length bias (Dr. GRPO)",
    LossSpec(frozenset({"ref_logp"}), "constant", args=ClipArgs),
)
def drgrpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    max_tokens: int | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
) -> tuple[Tensor, dict[str, float]]:
    """Dr. GRPO loss: the PPO-clip token losses summed and divided by a constant, not by lengths.

    L = (1 / max_tokens) sum_{i,t} m_it [ -min(rho_it A_i, clip(rho_it, 1-eps_low, 1+eps_high) A_i)
                                          + beta KL_t(pi_theta || pi_ref) ]

    GRPO's 1/|o_i| gives a short correct answer a larger per-token push than a long one and a long
    wrong answer a smaller penalty (Liu et al. 2025, Sec. 3); a constant keeps the gradient an
    unbiased policy gradient. The paper's objective is (1/G) sum_i sum_t; its code divides the token sum
    by a constant (the generation budget). ``max_tokens`` is that constant for the whole (B, T) batch:
    TRL's ``loss_type="dr_grpo"`` uses ``B * max_completion_length`` with B the rows of the micro-batch,
    so pass ``max_tokens = logp.shape[0] * max_completion_length`` to reproduce it. Pair with the
    advantage ``get("advantage", "grpo")(..., std_normalize=False)`` (no std division, the paper's other
    fix); no separate "drgrpo" advantage is registered because it would duplicate that flag.

    Stats as ``ppo_clip_loss`` (token means), plus ``kl`` = token mean of KL_t when kl_coef > 0.
    """
    if max_tokens is None or max_tokens <= 0:
        raise ValueError(
            f"drgrpo_loss needs max_tokens > 0 (e.g. batch rows * max completion length); got {max_tokens}"
        )
    kl_t = masked_kl(logp, ref_logp, mask, kl_coef, kl_estimator)  # validates eagerly
    m = mask.bool()
    token_mean, stats = ppo_clip_loss(
        logp, old_logp, adv, mask, clip_eps=clip_eps, clip_eps_high=clip_eps_high, agg="token_mean"
    )
    n_tokens = m.sum().clamp(min=1)
    loss = token_mean * n_tokens / max_tokens  # sum_{i,t} m_it L_it / max_tokens
    if kl_t is not None:
        loss = loss + kl_coef * kl_t.sum() / max_tokens  # + beta sum KL_t / max_tokens
        stats["kl"] = (kl_t.sum() / n_tokens).item()
    return loss, stats


@register(
    "loss",
    "dapo",
    "token-mean PPO-clip with clip-higher eps_high=0.28 (DAPO)",
    LossSpec(frozenset({"ref_logp"}), args=ClipArgs, correctable=True),
)
def dapo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = 0.28,
    agg: str = "token_mean",
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
) -> tuple[Tensor, dict[str, float]]:
    """DAPO policy loss (Yu et al. 2025) without dynamic sampling; a thin wrapper of ``grpo_loss``.

    L = (1 / sum_i |o_i|) sum_{i,t} -min(rho_it A_i, clip(rho_it, 1 - eps_low, 1 + eps_high) A_i)

    Clip-higher: eps_high (0.28) > eps_low (0.2) lets low-probability tokens grow, against entropy
    collapse. Token-level mean: every token weighs the same, so long answers are not under-weighted.
    ``agg`` must be "token_mean" (it is accepted only so the learner can pass it). ``clip_eps_high=None``
    means eps_high = eps_low, as everywhere in schedrl, so a config must set 0.28 explicitly. DAPO drops
    the KL term; kl_coef > 0 is still allowed (TRL allows beta with loss_type="dapo").

    Simplified: dynamic sampling (dropping all-correct/all-wrong groups) is a data filter, not a loss,
    and overlong shaping is a reward term (``overlong_reward_shaping``); neither lives here.
    """
    if agg != "token_mean":
        raise ValueError(f"dapo_loss is token-level by definition; agg must be 'token_mean', got {agg!r}")
    return grpo_loss(
        logp,
        old_logp,
        adv,
        mask,
        clip_eps=clip_eps,
        clip_eps_high=clip_eps_high,
        agg="token_mean",
        ref_logp=ref_logp,
        kl_coef=kl_coef,
        kl_estimator=kl_estimator,
    )


def overlong_reward_shaping(lengths: Tensor, max_len: int, cache_len: int) -> Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, Eq. 13), added to the task reward.  (N,) -> (N,).

    R_len(L) =  0                                  if L <= L_max - L_cache
             =  ((L_max - L_cache) - L) / L_cache  if L_max - L_cache < L <= L_max
             = -1                                  if L > L_max

    The penalty ramps linearly from 0 to -1 over the last ``cache_len`` tokens of the budget.
    ``lengths`` are completion lengths in tokens (any numeric dtype); the result is float.
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len; got cache_len={cache_len}, max_len={max_len}")
    n = lengths.detach()
    n = n if n.is_floating_point() else n.float()  # L, (N,)
    soft = max_len - cache_len  # L_max - L_cache
    ramp = (soft - n) / cache_len  # in [-1, 0) on the ramp
    penalty = torch.where(n > max_len, -torch.ones_like(n), ramp)
    return torch.where(n > soft, penalty, torch.zeros_like(n))


def batch_std(x: Tensor) -> Tensor:
    """Unbiased std over all of x (as TRL's ``nanstd(rewards)``); 0 for fewer than two elements."""
    return x.std() if x.numel() > 1 else x.new_zeros(())


@register(
    "advantage", "lite_ppo", "group-mean baseline, batch std: (r - mean_g) / (std_batch + eps) (Lite PPO)"
)
def lite_ppo_advantages(
    rewards: Tensor, group_index: Tensor, *, std_normalize: bool = True, eps: float = 1e-4
) -> Tensor:
    """Lite PPO advantage: group mean, batch std.  rewards, group_index: (N,) -> (N,).

    A_i = (r_i - mean_g(r)) / (std_batch(r) + eps)        (Liu et al. 2025, "Tricks or Traps")

    The group mean is the per-prompt baseline; the std is over the whole batch of rewards (unbiased),
    so an easy prompt with near-equal rewards is not blown up the way group-std GRPO does. Matches TRL's
    ``scale_rewards="batch"``. With std_normalize=False it reduces to Dr. GRPO's r - mean_g. Lite PPO
    pairs it with a token-level loss: use "dapo" or "ppo_clip"/"grpo" with agg="token_mean".
    """
    if eps <= 0 and std_normalize:
        raise ValueError(f"eps must be > 0 when std_normalize=True; got {eps}")
    mean, _ = group_stats(rewards, group_index)
    r = rewards.detach().to(mean.dtype)
    adv = r - mean  # r_i - mean_g(r)
    return adv / (batch_std(r) + eps) if std_normalize else adv
