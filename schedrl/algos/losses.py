"""Policy-gradient losses as pure tensor functions ``(logp, old_logp, adv, mask, *, ...) -> (loss, stats)``.

Names: pi_theta is the policy being trained (``logp``, carries grad); pi_old the policy that sampled
the batch (``old_logp``, recorded by the engine, a constant); pi_ref a frozen reference (``ref_logp``,
a constant). Shapes: B sequences, T tokens, V vocabulary; ``mask`` (B, T) is 1 on completion tokens
and 0 on padding (bool or 0/1 float). Padding may hold any finite value: it is zeroed before use.

References: Schulman et al. 2017, "Proximal Policy Optimization Algorithms", arXiv:1707.06347;
Shao et al. 2024 (GRPO), arXiv:2402.03300; Yu et al. 2025, "DAPO", arXiv:2503.14476;
Schulman 2020, "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from schedrl.algos.registry import register
from schedrl.algos.spec import LossSpec
from schedrl.registry import check_arg

AGGS: tuple[str, ...] = ("token_mean", "seq_mean")
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")


def check_clip_high(clip_eps_high: float | None) -> None:
    check_arg(clip_eps_high is None or clip_eps_high >= 0, "clip_eps_high", clip_eps_high, ">= 0 or null")


@dataclass(frozen=True)
class ClipArgs:
    """The PPO-clip family's arguments: the ratio's trust region [1 - clip_eps, 1 + clip_eps_high]."""

    clip_eps: float = 0.2  # clip range of the ratio, low side
    clip_eps_high: float | None = None  # high side; None = clip_eps (larger: DAPO's clip-higher)

    def __post_init__(self) -> None:
        check_arg(0 <= self.clip_eps < 1, "clip_eps", self.clip_eps, "in [0, 1)")
        check_clip_high(self.clip_eps_high)


def masked_mean(x: Tensor, mask: Tensor, agg: str = "token_mean") -> Tensor:
    """Average x (B, T) over the tokens where mask (B, T) is set; 0 when there are none.

    token_mean: sum_{i,t} m_it x_it / sum_{i,t} m_it             (every token weighs the same; DAPO)
    seq_mean:   (1/|S|) sum_{i in S} (sum_t m_it x_it / n_i),     S = {i : n_i > 0}   (GRPO paper)

    seq_mean gives each sequence equal weight, so a token of a long answer counts less than one of a
    short answer (the length bias discussed by DAPO and Dr. GRPO).
    """
    if agg not in AGGS:
        raise ValueError(f"unknown agg {agg!r}; valid: {', '.join(AGGS)}")
    m = mask.bool()
    x = x.masked_fill(~m, 0.0)  # where, not x * m: keeps inf/NaN in padding out of values and grads
    if agg == "token_mean":
        return x.sum() / m.sum().clamp(min=1)
    n = m.sum(dim=-1)  # n_i, (B,)
    per_seq = x.sum(dim=-1) / n.clamp(min=1)  # (B,), 0 for empty rows
    return per_seq.sum() / (n > 0).sum().clamp(min=1)


def broadcast_adv(adv: Tensor, logp: Tensor) -> Tensor:
    if adv.dim() == 1 and adv.shape[0] == logp.shape[0]:
        return adv[:, None]  # (B,) -> (B, 1): one advantage per sequence
    if adv.shape == logp.shape:
        return adv
    raise ValueError(f"adv must be (B,) or (B, T) for logp {tuple(logp.shape)}; got {tuple(adv.shape)}")


@register(
    "loss",
    "ppo_clip",
    "PPO clipped surrogate -min(r A, clip(r, 1-eps_low, 1+eps_high) A)",
    LossSpec(args=ClipArgs),
)
def ppo_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    agg: str = "token_mean",
    with_stats: bool = True,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate, per token, aggregated with ``masked_mean(agg)``.

    rho_t = pi_theta(o_t | .) / pi_old(o_t | .) = exp(logp - old_logp)
    L_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)    (Schulman et al. 2017, Eq. 7)

    eps_low = clip_eps, eps_high = clip_eps_high or clip_eps; eps_high > eps_low is DAPO's
    "clip-higher". With old_logp == logp (one update per batch) rho = 1 and the gradient is the
    REINFORCE gradient -A grad(logp). old_logp and adv are detached. adv: (B,) or (B, T).

    Stats (floats, over masked tokens): ``clipfrac`` = fraction of tokens where the clipped term wins,
    rho A > clip(rho) A, i.e. (rho > 1 + eps_high and A > 0) or (rho < 1 - eps_low and A < 0), the
    tokens whose gradient is zeroed (TRL's ``is_region_clipped``); ``ratio_mean``, ``ratio_max``;
    ``approx_kl`` = mean(old_logp - logp), the k1 estimate of KL(pi_old || pi_theta). ``with_stats=False``
    skips them (an empty dict), for loops that log only some minibatches.
    """
    eps_low = clip_eps
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if not 0.0 <= eps_low < 1.0 or eps_high < 0.0:
        raise ValueError(f"need 0 <= clip_eps < 1 and clip_eps_high >= 0; got {eps_low} and {eps_high}")
    m = mask.bool()
    a = broadcast_adv(adv.detach().to(logp.dtype), logp)  # (B, 1) or (B, T)
    log_ratio = (logp - old_logp.detach()).masked_fill(~m, 0.0)  # (B, T); padding -> rho = 1, no overflow
    ratio = log_ratio.exp()  # rho_t
    unclipped = ratio * a  # rho A
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * a  # clip(rho) A
    loss = masked_mean(-torch.minimum(unclipped, clipped), m, agg)  # L = -min(rho A, clip(rho) A)
    if not with_stats:
        return loss, {}
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean((unclipped > clipped).to(logp.dtype), m).item(),
            "ratio_mean": masked_mean(ratio, m).item(),
            "ratio_max": ratio.masked_fill(~m, 0.0).max().item() if m.any() else 0.0,
            "approx_kl": masked_mean(-log_ratio, m).item(),  # k1: E_old[log pi_old - log pi_theta]
        }
    return loss, stats


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled from pi_theta.  (B, T) -> (B, T).

    With d = log pi_ref - log pi_theta (Schulman 2020):
    k1 = -d                 unbiased, high variance, can be negative
    k2 = d^2 / 2            biased, low variance, >= 0
    k3 = exp(d) - d - 1     unbiased, low variance, >= 0 (GRPO, Shao et al. 2024, Eq. 4)

    ref_logp is detached. k3 uses expm1(d) - d, exact for small d; it is not clamped, so a very
    unlikely token under pi_ref (d >> 0) gives a large value.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")
    d = ref_logp.detach() - logp  # log(pi_ref / pi_theta), (B, T)
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d**2
    return torch.expm1(d) - d  # exp(d) - 1 - d


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) per position.  (B, T, V) -> (B, T).

    H = -sum_v p_v log p_v, with log p from log_softmax (logsumexp-stable); -inf logits (masked
    vocabulary) contribute 0, as in ``torch.distributions.Categorical``.
    """
    logp = torch.log_softmax(logits, dim=-1)  # (B, T, V)
    logp = logp.clamp(min=torch.finfo(logp.dtype).min)  # -inf -> finite, so 0 * log 0 = 0
    return -(logp.exp() * logp).sum(dim=-1)


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / temperature) at ``tokens``.  logits (B, T, V), tokens (B, T) -> (B, T).

    log p(y) = z_y - logsumexp_v z_v with z = logits / temperature, computed without a full
    log_softmax; the only extra (B, T, V) tensor is z itself, and only when temperature != 1. Matches
    the engine's recorded logprob (temperature-scaled, before top-k/top-p). Pass float32 logits for
    float32 accuracy: the computation stays in the logits' dtype.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    z = logits if temperature == 1.0 else logits / temperature  # (B, T, V)
    picked = z.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)  # z_y, (B, T)
    return picked - torch.logsumexp(z, dim=-1)  # z_y - logsumexp(z)


@register(
    "loss",
    "grpo",
    "PPO-clip surrogate + kl_coef * KL(pi_theta || pi_ref) (GRPO)",
    LossSpec(frozenset({"ref_logp"}), args=ClipArgs, correctable=True),
)
def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    agg: str = "token_mean",
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
) -> tuple[Tensor, dict[str, float]]:
    """GRPO objective (Shao et al. 2024, Eq. 3), as a loss to minimise:

    L = masked_mean(-min(rho A, clip(rho) A)) + beta * masked_mean(KL_t(pi_theta || pi_ref))

    with beta = kl_coef and KL_t from ``kl_penalty(kl_estimator)``, both averaged with the same
    ``agg``. The paper uses agg="seq_mean" and k3; DAPO drops the KL (kl_coef=0, the default) and uses
    token_mean. ``ref_logp`` is required when kl_coef > 0; stats gain ``kl`` then.
    """
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0; got {kl_coef}")
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown estimator {kl_estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")
    loss, stats = ppo_clip_loss(
        logp, old_logp, adv, mask, clip_eps=clip_eps, clip_eps_high=clip_eps_high, agg=agg
    )
    if kl_coef > 0:
        if ref_logp is None:
            raise ValueError("grpo_loss: kl_coef > 0 needs ref_logp (log-probs under the reference policy)")
        m = mask.bool()
        kl_t = kl_penalty(logp.masked_fill(~m, 0.0), ref_logp.masked_fill(~m, 0.0), kl_estimator)  # (B, T)
        kl = masked_mean(kl_t, m, agg)
        loss = loss + kl_coef * kl  # + beta * KL
        stats["kl"] = kl.item()
    return loss, stats
