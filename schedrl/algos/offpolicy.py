"""Off-policy corrections for stale or resumed samples: decoupled PPO, truncated IS, cross-stage IS.

Three policies appear. pi_theta: the policy being trained (``logp``, carries grad). pi_prox: the
proximal policy, the learner's weights before this step's first update, recomputed by the learner
(``prox_logp``, passed as the registry's ``old_logp``, a constant). pi_behav: the policy that sampled
each token, as recorded by the engine (``behav_logp``, a constant); after an in-flight weight update or
a resumed prefix, different tokens of one sample come from different versions, and ``behav_logp``
holds each token's own version's log-prob. Shapes: B sequences, T tokens, ``mask`` (B, T) 1 on
completion tokens. Every importance weight is detached: it rescales a gradient, it is never trained.

References: Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for
Language Reasoning", arXiv:2505.24298 (decoupled PPO, after Hilton et al. 2022, "Batch size-invariance
for policy optimization", arXiv:2110.00641); Espeholt et al. 2018, "IMPALA", arXiv:1802.01561
(truncated importance weights); Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
Off-Policy RL Training" (TIS); Qu et al. 2025, "CoPRIS: Efficient and Stable Reinforcement Learning
via Concurrency-Controlled Partial Rollout with Importance Sampling".
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from schedrl.algos.grpo_variants import masked_kl
from schedrl.algos.losses import ClipArgs, broadcast_adv, grpo_loss, kl_penalty, masked_mean
from schedrl.algos.registry import available, loss_spec, register
from schedrl.algos.spec import LossSpec

# algo.correction -> the registered loss that replaces the PPO-clip surrogate of algo.loss; it reads that
# loss's arguments (its clip range) and algo.is_cap
CORRECTIONS = {"decoupled": "decoupled_ppo", "tis": "tis", "cross_stage": "cross_stage_is"}


def correctable_losses() -> list[str]:
    """The registered losses whose PPO-clip surrogate an off-policy correction may replace."""
    return [n for n in available("loss") if loss_spec(n).correctable]


def _check_cap(is_cap: float | None) -> float:
    if is_cap is None:
        return math.inf
    if not is_cap >= 1.0:  # also refuses NaN
        raise ValueError(f"is_cap must be >= 1 (or None for no cap); got {is_cap}")
    return float(is_cap)


def is_weight(num_logp: Tensor, behav_logp: Tensor, mask: Tensor, is_cap: float | None = None) -> Tensor:
    """Truncated importance weight per token.  (B, T) -> (B, T), detached, 1 on padding.

    w_t = min(exp(num_logp_t - behav_logp_t), C)          C = is_cap; None = no cap

    exp is taken of the log-ratio clamped to <= log C, so a huge ratio gives C without overflow.
    """
    cap = _check_cap(is_cap)
    m = mask.bool()
    log_ratio = (num_logp.detach() - behav_logp.detach()).masked_fill(~m, 0.0)  # padding -> w = 1
    return log_ratio.clamp(max=math.log(cap)).exp()  # min(rho, C) = exp(min(log rho, log C))


@torch.no_grad()
def offpolicy_stats(
    prox_logp: Tensor, behav_logp: Tensor, mask: Tensor, is_cap: float | None = None
) -> dict[str, float]:
    """How far the sampling policy is from the learner's, over the masked tokens of a batch.

    rho_t = pi_prox(o_t) / pi_behav(o_t). ``is_ratio_mean`` and ``is_ratio_max`` of rho (uncapped);
    ``is_capped_frac`` = fraction of tokens with rho > C; ``behaviour_kl`` = masked mean of the k3
    estimate of KL(pi_behav || pi_prox) from tokens sampled by pi_behav: with d = log rho,
    k3 = exp(d) - 1 - d >= 0 (Schulman 2020), 0 when the two policies agree.
    """
    cap = _check_cap(is_cap)
    m = mask.bool()
    log_ratio = (prox_logp - behav_logp).masked_fill(~m, 0.0)  # log rho, (B, T)
    ratio = log_ratio.exp()
    kl_t = kl_penalty(behav_logp.masked_fill(~m, 0.0), prox_logp.masked_fill(~m, 0.0), "k3")
    return {
        "is_ratio_mean": masked_mean(ratio, m).item(),
        "is_ratio_max": ratio.masked_fill(~m, 0.0).max().item() if m.any() else 0.0,
        "is_capped_frac": masked_mean((ratio > cap).to(ratio.dtype), m).item(),
        "behaviour_kl": masked_mean(kl_t, m).item(),
    }


def _weighted_ppo(
    logp: Tensor, prox_logp: Tensor, adv: Tensor, mask: Tensor, w: Tensor, **kw
) -> tuple[Tensor, dict[str, float]]:
    """-min(r A, clip(r) A) * w with r = pi_theta / pi_prox: since w >= 0, it is PPO-clip on w A."""
    a = broadcast_adv(adv.detach().to(logp.dtype), logp)  # (B, 1) or (B, T)
    loss, stats = grpo_loss(logp, prox_logp, w.to(logp.dtype) * a, mask, **kw)
    m = mask.bool()
    stats["is_weight_mean"] = masked_mean(w, m).item()
    return loss, stats


@register(
    "loss",
    "decoupled_ppo",
    "PPO-clip around pi_prox times sg(min(pi_prox / pi_behav, C)) (AReaL decoupled PPO)",
    LossSpec(frozenset({"behav_logp", "ref_logp"}), args=ClipArgs, correction=True),
)
def decoupled_ppo_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    behav_logp: Tensor,
    is_cap: float | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    agg: str = "token_mean",
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
) -> tuple[Tensor, dict[str, float]]:
    """Decoupled PPO: the trust region is centred on pi_prox, the sampling bias is corrected by IS.

    r_t = pi_theta(o_t) / pi_prox(o_t),   w_t = sg(min(pi_prox(o_t) / pi_behav(o_t), C))
    L   = agg( -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t) * w_t )  (+ beta agg(KL_t))

    (Fu et al. 2025, the decoupled objective; ``old_logp`` is pi_prox.) PPO's single pi_old plays two
    roles, the sampling policy and the trust-region centre; with stale samples they differ, and clipping
    around a policy several versions old either freezes learning or lets it run away. With pi_behav =
    pi_prox (w = 1) this is ``grpo_loss``. C = ``is_cap``, None for AReaL's default of no cap. The KL
    term, if any, is not weighted. Stats: those of ``grpo_loss`` (ratio r) and ``is_weight_mean``.
    """
    w = is_weight(old_logp, behav_logp, mask, is_cap)
    return _weighted_ppo(
        logp,
        old_logp,
        adv,
        mask,
        w,
        clip_eps=clip_eps,
        clip_eps_high=clip_eps_high,
        agg=agg,
        ref_logp=ref_logp,
        kl_coef=kl_coef,
        kl_estimator=kl_estimator,
    )


@register(
    "loss",
    "tis",
    "truncated IS policy gradient: -sg(min(pi_theta / pi_behav, C)) A log pi_theta",
    LossSpec(frozenset({"behav_logp", "ref_logp"}), correction=True),
)
def tis_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    behav_logp: Tensor,
    is_cap: float | None = 2.0,
    agg: str = "token_mean",
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
) -> tuple[Tensor, dict[str, float]]:
    """Truncated importance sampling: an off-policy REINFORCE gradient with capped token weights.

    w_t = sg(min(pi_theta(o_t) / pi_behav(o_t), C))
    L   = agg( -w_t A_t log pi_theta(o_t) )    (+ beta agg(KL_t))
    grad L = -agg( min(rho_t, C) A_t grad log pi_theta(o_t) )

    The per-token truncated IS estimator of IMPALA (Espeholt et al. 2018, the rho-bar of V-trace)
    without its value-function correction: truncation bounds the variance at the cost of a bias towards
    pi_behav when rho > C. The weight's numerator is the current pi_theta, so it tracks the policy
    across several updates on one batch; there is no trust-region clip (use ``decoupled_ppo`` with a
    cap for the TIS of Yao et al. 2025, whose numerator is the fixed pi_prox). ``old_logp`` (pi_prox)
    only feeds the stat ``approx_kl`` = mean(pi_prox - pi_theta log-probs). Simplified relative to
    IMPALA: the per-token state-distribution product of ratios is ignored, as in every LLM TIS.

    Stats: ``is_weight_mean``, ``is_weight_capped_frac`` (rho > C), ``approx_kl``; ``kl`` if kl_coef > 0.
    """
    cap = _check_cap(is_cap)
    kl_t = masked_kl(logp, ref_logp, mask, kl_coef, kl_estimator)  # validates eagerly
    m = mask.bool()
    a = broadcast_adv(adv.detach().to(logp.dtype), logp)
    w = is_weight(logp, behav_logp, mask, cap)  # sg(min(pi_theta / pi_behav, C))
    loss = masked_mean(-w * a * logp.masked_fill(~m, 0.0), m, agg)  # -sg(w) A log pi_theta
    if kl_t is not None:
        kl = masked_mean(kl_t, m, agg)
        loss = loss + kl_coef * kl
    with torch.no_grad():
        log_rho = (logp - behav_logp).masked_fill(~m, 0.0)
        stats = {
            "is_weight_mean": masked_mean(w, m).item(),
            "is_weight_capped_frac": masked_mean((log_rho > math.log(cap)).to(logp.dtype), m).item(),
            "approx_kl": masked_mean((old_logp - logp).masked_fill(~m, 0.0), m).item(),
        }
        if kl_t is not None:
            stats["kl"] = kl.item()
    return loss, stats


def cross_stage_weight(
    prox_logp: Tensor,
    behav_logp: Tensor,
    versions: Tensor,
    prox_version: int,
    mask: Tensor,
    is_cap: float | None = 2.0,
) -> tuple[Tensor, Tensor]:
    """Per-token weights of cross-stage IS and the stale-token mask.  (B, T) -> ((B, T), (B, T) bool).

    stale_t = v_t < v_prox
    w_t     = min(pi_prox(o_t) / pi_{v_t}(o_t), C)   if stale_t
            = 1                                      otherwise (v_t = v_prox)

    v_t (``versions``) is the policy version that generated token t and pi_{v_t}(o_t) = exp(behav_logp_t)
    its log-prob as recorded in that stage. A token newer than the proximal policy (v_t > v_prox) is an
    error: the caller's versions are inconsistent. Padding gets w = 1 and is never stale.
    """
    m = mask.bool()
    v = versions.masked_fill(~m, prox_version)
    if bool((v > prox_version).any()):
        raise ValueError(
            f"cross-stage IS: a token has version {int(v.max())} > the proximal policy's {prox_version}"
        )
    stale = v < prox_version
    w = torch.where(stale, is_weight(prox_logp, behav_logp, mask, is_cap), 1.0)
    return w, stale


@register(
    "loss",
    "cross_stage_is",
    "decoupled PPO whose IS weight corrects only tokens of older policy stages, by their stage (CoPRIS)",
    LossSpec(frozenset({"behav_logp", "versions", "ref_logp"}), args=ClipArgs, correction=True),
)
def cross_stage_is_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    behav_logp: Tensor,
    versions: Tensor,
    prox_version: int,
    is_cap: float | None = 2.0,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    agg: str = "token_mean",
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
) -> tuple[Tensor, dict[str, float]]:
    """Cross-stage importance sampling for samples resumed across weight updates.

    A partial rollout cut at version v_1 and resumed at v_2, v_3, ... has stages: runs of tokens that
    different policies generated, each with its own recorded log-prob. Per token:

    r_t = pi_theta(o_t) / pi_prox(o_t)
    w_t = sg(min(pi_prox(o_t) / pi_{v_t}(o_t), C))  for tokens of an older stage (v_t < v_prox), else 1
    L   = agg( -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t) * w_t )  (+ beta agg(KL_t))

    ``old_logp`` is pi_prox, of version ``prox_version``; ``versions`` (B, T) integer. CoPRIS
    concatenates the stages' buffered log-probs into one behaviour sequence and corrects with it; here
    the tokens generated by the proximal weights themselves get no weight, so the small engine-vs-learner
    numeric mismatch on fresh tokens is not "corrected" (that is what ``tis`` / ``decoupled_ppo`` do).
    With every token stale this equals ``decoupled_ppo`` with the same cap; with none stale, PPO-clip
    around pi_prox. Simplified: like every token-level IS, the shift of the context (an old-stage prefix
    conditions later tokens) is not corrected.

    Stats: those of ``grpo_loss``, ``is_weight_mean``, ``stale_token_frac``.
    """
    w, stale = cross_stage_weight(old_logp, behav_logp, versions, prox_version, mask, is_cap)
    loss, stats = _weighted_ppo(
        logp,
        old_logp,
        adv,
        mask,
        w,
        clip_eps=clip_eps,
        clip_eps_high=clip_eps_high,
        agg=agg,
        ref_logp=ref_logp,
        kl_coef=kl_coef,
        kl_estimator=kl_estimator,
    )
    stats["stale_token_frac"] = masked_mean(stale.to(logp.dtype), mask.bool()).item()
    return loss, stats
