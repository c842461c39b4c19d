"""PPO with a learned value function: token-level GAE and the clipped value loss.

Neither fits a registry contract (an advantage estimator takes ``(rewards, group_index)`` per sample, a
loss ``(logp, old_logp, adv, mask)``): GAE needs per-token rewards and values, the value loss has no
log-probs. Both are exported plainly. The policy side of PPO is ``ppo_clip_loss`` fed the (B, T)
advantages from ``gae``.

Shapes: B sequences, T tokens; ``mask`` (B, T) is 1 on completion tokens (the actions), 0 elsewhere.

References: Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation", arXiv:1506.02438; Schulman et al. 2017, "Proximal Policy Optimization Algorithms",
arXiv:1707.06347, with the value clipping of OpenAI Baselines' ppo2; Engstrom et al. 2020,
"Implementation Matters in Deep Policy Gradients", arXiv:2005.12729.
"""

from __future__ import annotations

import torch
from torch import Tensor

from schedrl.algos.losses import masked_mean


def _float(x: Tensor) -> Tensor:
    x = x.detach()
    return x if x.is_floating_point() else x.float()


def gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation per token.  rewards, values, mask: (B, T) -> (adv, returns), (B, T).

    delta_t = r_t + gamma V_{t'} - V_t          t' = the next valid token after t; V_{t'} = 0 after the last
    A_t     = delta_t + gamma lam A_{t'}        (Schulman et al. 2016, Eq. 16, as a backward recursion)
    R_t     = A_t + V_t                          the lambda-return, target of the value loss

    Computed right to left over the valid tokens of each row only: a masked position is skipped, it
    neither reads nor passes on anything, so padding (any value, inf and NaN included) cannot leak into
    valid tokens, and a hole in the mask (e.g. tool-output tokens) is treated as absent. The last valid
    token is terminal (bootstraps 0). Simplified: a completion cut at the token budget is treated as
    terminal too, not bootstrapped from V. Outputs are detached and 0 on padding. For an outcome reward
    put r on the last valid token; lam = 1 gives Monte-Carlo returns, lam = 0 one-step TD.
    """
    if rewards.dim() != 2 or values.shape != rewards.shape or mask.shape != rewards.shape:
        raise ValueError(
            f"rewards, values and mask must all be (B, T); got {tuple(rewards.shape)}, "
            f"{tuple(values.shape)} and {tuple(mask.shape)}"
        )
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"need gamma and lam in [0, 1]; got gamma={gamma}, lam={lam}")
    m = mask.bool()
    v = _float(values).masked_fill(~m, 0.0)  # (B, T)
    r = _float(rewards).to(v.dtype).masked_fill(~m, 0.0)  # (B, T)
    adv = torch.zeros_like(v)
    next_value = v.new_zeros(v.shape[0])  # V_{t'}, (B,)
    next_adv = v.new_zeros(v.shape[0])  # A_{t'}, (B,)
    for t in reversed(range(v.shape[1])):
        valid = m[:, t]
        delta = r[:, t] + gamma * next_value - v[:, t]  # delta_t = r_t + gamma V_{t'} - V_t
        a_t = delta + gamma * lam * next_adv  # A_t = delta_t + gamma lam A_{t'}
        adv[:, t] = torch.where(valid, a_t, 0.0)
        next_value = torch.where(valid, v[:, t], next_value)  # padding passes the later token on
        next_adv = torch.where(valid, a_t, next_adv)
    return adv, (adv + v).masked_fill(~m, 0.0)  # R_t = A_t + V_t


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip_range: float | None = 0.2,
    agg: str = "token_mean",
) -> tuple[Tensor, dict[str, float]]:
    """PPO2 clipped value loss.  values, old_values, returns, mask: (B, T) -> (loss, stats).

    V_clip = clip(V, V_old - eps, V_old + eps) = V_old + clip(V - V_old, -eps, eps)
    L_t    = 0.5 * max((V - R)^2, (V_clip - R)^2)       (OpenAI Baselines ppo2; Engstrom et al. 2020)

    aggregated with ``masked_mean(agg)``. Taking the max makes the loss pessimistic: a value that moved
    more than eps from V_old towards R gets no further gradient. ``clip_range=None`` gives the plain
    0.5 (V - R)^2. ``values`` carries grad; old_values (the critic that scored the batch) and returns
    are detached. Engstrom et al. found the clipping does not help and can hurt; it is kept because it
    is the PPO2 default that peer libraries (CleanRL's ``clip_vloss``) reproduce.

    Stats: ``vf_clipfrac`` = fraction of tokens where the clipped term is strictly larger (its gradient
    is then 0); ``value_mean``.
    """
    if clip_range is not None and clip_range < 0:
        raise ValueError(f"clip_range must be >= 0 or None; got {clip_range}")
    m = mask.bool()
    v = values.masked_fill(~m, 0.0)  # (B, T)
    ret = returns.detach().to(v.dtype).masked_fill(~m, 0.0)
    unclipped = (v - ret) ** 2  # (V - R)^2
    if clip_range is None:
        loss_t, clipped = unclipped, unclipped
    else:
        old = old_values.detach().to(v.dtype).masked_fill(~m, 0.0)
        v_clip = old + (v - old).clamp(-clip_range, clip_range)  # V_old + clip(V - V_old, -eps, eps)
        clipped = (v_clip - ret) ** 2
        loss_t = torch.maximum(unclipped, clipped)
    loss = 0.5 * masked_mean(loss_t, m, agg)  # 0.5 * max(...)
    with torch.no_grad():
        stats = {
            "vf_clipfrac": masked_mean((clipped > unclipped).to(v.dtype), m).item(),
            "value_mean": masked_mean(v, m).item(),
        }
    return loss, stats
