"""PPO with a learned value function: token-level GAE and the clipped value loss.

GAE does not fit the advantage contract (``(rewards, group_index)`` per sample): it needs per-token
rewards and values, so it is exported plainly, and the learner calls ``ppo_advantages`` itself when the
loss takes ``returns``. The registered ``ppo`` loss is PPO-clip on those token advantages plus the
clipped value loss; the value head is ``schedrl.training.value_head.ValueHead``.

Shapes: B sequences, T tokens; ``mask`` (B, T) is 1 on completion tokens (the actions), 0 elsewhere.

References: Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation", arXiv:1506.02438; Schulman et al. 2017, "Proximal Policy Optimization Algorithms",
arXiv:1707.06347, with the value clipping of OpenAI Baselines' ppo2; Engstrom et al. 2020,
"Implementation Matters in Deep Policy Gradients", arXiv:2005.12729.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from schedrl.algos.losses import ClipArgs, grpo_loss, masked_mean
from schedrl.algos.registry import register
from schedrl.algos.spec import LossSpec
from schedrl.registry import check_arg


def _float(x: Tensor) -> Tensor:
    x = x.detach()
    return x if x.is_floating_point() else x.float()


def gae(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
    *,
    ends: Tensor | None = None,
    last_value: Tensor | None = None,
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

    For a stream of environment steps (classic RL: one row per environment, T steps of a rollout),
    ``ends`` (B, T) marks the steps after which an episode ended: nothing flows back across them
    (V_{t'} = A_{t'} = 0 there; a time-limit cut bootstraps by adding gamma V(final obs) to its
    reward first). ``last_value`` (B,) is V of the state after the last step, bootstrapped into a
    row that did not end there.
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
    if ends is not None and ends.shape != rewards.shape:
        raise ValueError(f"ends must be (B, T) like rewards {tuple(rewards.shape)}; got {tuple(ends.shape)}")
    if last_value is not None and last_value.shape != rewards.shape[:1]:
        raise ValueError(f"last_value must be (B,) = ({rewards.shape[0]},); got {tuple(last_value.shape)}")
    adv = torch.zeros_like(v)
    next_value = v.new_zeros(v.shape[0]) if last_value is None else _float(last_value).to(v.dtype)  # V_{t'}
    next_adv = v.new_zeros(v.shape[0])  # A_{t'}, (B,)
    for t in reversed(range(v.shape[1])):
        valid = m[:, t]
        if ends is not None:  # an episode ended after step t: nothing of the next one flows back
            next_value = next_value.masked_fill(ends[:, t].bool(), 0.0)
            next_adv = next_adv.masked_fill(ends[:, t].bool(), 0.0)
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
    with_stats: bool = True,
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
    is then 0); ``value_mean``. ``with_stats=False`` skips them.
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
    if not with_stats:
        return loss, {}
    with torch.no_grad():
        stats = {
            "vf_clipfrac": masked_mean((clipped > unclipped).to(v.dtype), m).item(),
            "value_mean": masked_mean(v, m).item(),
        }
    return loss, stats


def terminal_rewards(scores: Tensor, mask: Tensor) -> Tensor:
    """Put each sequence's outcome score on its last valid token.  scores (B,), mask (B, T) -> (B, T).

    r_t = score_i if t is the last t with mask_it = 1, else 0. Rows without tokens get all zeros.
    """
    if scores.shape != mask.shape[:1]:
        raise ValueError(f"scores must be (B,) for mask {tuple(mask.shape)}; got {tuple(scores.shape)}")
    m = mask.bool()
    t = torch.arange(m.shape[1], device=m.device)
    last = torch.where(m, t, -1).max(dim=-1).values  # (B,), -1 for an empty row
    onehot = (t[None, :] == last[:, None]) & m  # (B, T)
    return torch.where(onehot, _float(scores).to(torch.get_default_dtype())[:, None], 0.0)


def whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(x - mean) / (std + eps) over the masked entries of x (B, T), 0 on padding; std is unbiased."""
    m = mask.bool()
    vals = x[m]
    if vals.numel() < 2:
        return x.masked_fill(~m, 0.0) * 0.0
    return ((x - vals.mean()) / (vals.std() + eps)).masked_fill(~m, 0.0)


def ppo_advantages(
    scores: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
    normalize: bool = True,
) -> tuple[Tensor, Tensor]:
    """Token advantages and returns of PPO for outcome rewards.  scores (B,), values/mask (B, T).

    r = terminal_rewards(scores, mask);  A, R = gae(r, V, mask, gamma, lam);  A <- whiten(A) if normalize

    Whitening over the batch's tokens is the PPO default of CleanRL (``norm_adv``) and of LLM PPO
    implementations; the value target R is the un-whitened lambda-return.
    """
    adv, returns = gae(terminal_rewards(scores, mask).to(values.dtype), values, mask, gamma, lam)
    return (whiten(adv, mask) if normalize else adv), returns


@dataclass(frozen=True)
class PPOArgs(ClipArgs):
    """The policy's clip band, the clipped value loss, and GAE's discounts (read by token advantages)."""

    vf_coef: float = 0.1  # weight of the value loss
    vf_clip: float | None = 0.2  # clip range of the value around the old value; None = no clipping
    gae_gamma: float = 1.0  # GAE discount
    gae_lambda: float = 0.95  # GAE lambda: 1 = Monte Carlo returns, 0 = one-step TD

    def __post_init__(self) -> None:
        super().__post_init__()
        check_arg(self.vf_coef >= 0, "vf_coef", self.vf_coef, ">= 0")
        check_arg(self.vf_clip is None or self.vf_clip >= 0, "vf_clip", self.vf_clip, ">= 0 or null")
        for name in ("gae_gamma", "gae_lambda"):
            check_arg(0 <= getattr(self, name) <= 1, name, getattr(self, name), "in [0, 1]")


def gae_token_advantages(
    scores: Tensor, old_values: Tensor, mask: Tensor, *, gae_gamma: float, gae_lambda: float
) -> tuple[Tensor, Tensor]:
    """`ppo_advantages` under the config's names: what the learner calls for a loss with input "returns"."""
    return ppo_advantages(scores, old_values, mask, gae_gamma, gae_lambda)


@register(
    "loss",
    "ppo",
    "PPO-clip on GAE token advantages + vf_coef * clipped value loss (value head)",
    LossSpec(
        frozenset({"values", "returns", "ref_logp"}),
        args=PPOArgs,
        token_advantages=gae_token_advantages,
        advantage_options=("gae_gamma", "gae_lambda"),
    ),
)
def ppo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    vf_coef: float = 0.1,
    vf_clip: float | None = 0.2,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    agg: str = "token_mean",
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
) -> tuple[Tensor, dict[str, float]]:
    """PPO with a learned critic (Schulman et al. 2017, Eq. 9 without the entropy term):

    L = agg(-min(rho_t A_t, clip(rho_t) A_t)) + c_v * 0.5 agg(max((V_t - R_t)^2, (V_clip,t - R_t)^2))
        (+ beta agg(KL_t))

    ``adv`` (B, T) are the GAE advantages and ``returns`` the lambda-returns of ``ppo_advantages``,
    computed from ``old_values`` (the critic before this step's update, a constant); ``values`` is the
    critic now and carries grad. c_v = vf_coef, the clip of V is ``vf_clip`` (None: no clipping). The
    entropy bonus lives in the learner. Simplified relative to InstructGPT-style RLHF PPO: the KL to the
    reference is a loss term (kl_coef) rather than a per-token reward.

    Stats: those of ``grpo_loss`` plus ``vf_loss``, ``vf_clipfrac``, ``value_mean``.
    """
    if vf_coef < 0:
        raise ValueError(f"vf_coef must be >= 0; got {vf_coef}")
    if adv.shape != logp.shape:
        raise ValueError(
            f"ppo_loss needs token advantages (B, T) = {tuple(logp.shape)}; got {tuple(adv.shape)}"
        )
    loss, stats = grpo_loss(
        logp,
        old_logp,
        adv,
        mask,
        clip_eps=clip_eps,
        clip_eps_high=clip_eps_high,
        agg=agg,
        ref_logp=ref_logp,
        kl_coef=kl_coef,
        kl_estimator=kl_estimator,
    )
    v_loss, v_stats = value_loss(values, old_values, returns, mask, clip_range=vf_clip, agg=agg)
    stats |= v_stats
    stats["vf_loss"] = v_loss.item()
    return loss + vf_coef * v_loss, stats
