"""Critic-free advantage estimators beyond GRPO's group z-score: RLOO and REINFORCE++.

Each shares the estimator contract ``(rewards, group_index, *, std_normalize, eps) -> adv``, all (N,),
so the pipeline can pick any of them by name; ``group_index`` labels the completions of one prompt.

References: Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning
from Human Feedback in LLMs" (RLOO), arXiv:2402.14740; Kool et al. 2019, "Buy 4 REINFORCE Samples, Get
a Baseline for Free!"; Hu et al. 2025, "REINFORCE++: Stabilizing Critic-Free Policy Optimization with
Global Advantage Normalization", arXiv:2501.03262.
"""

from __future__ import annotations

import torch
from torch import Tensor

from schedrl.algos.advantages import check_groups, group_stats
from schedrl.algos.grpo_variants import batch_std
from schedrl.algos.registry import register


def _float(rewards: Tensor) -> Tensor:
    r = rewards.detach()
    return r if r.is_floating_point() else r.float()


def _check_eps(eps: float, std_normalize: bool) -> None:
    if eps <= 0 and std_normalize:
        raise ValueError(f"eps must be > 0 when std_normalize=True; got {eps}")


@register("advantage", "rloo", "leave-one-out baseline: r_i - mean_{j != i in g} r_j (RLOO)")
def rloo_advantages(
    rewards: Tensor, group_index: Tensor, *, std_normalize: bool = False, eps: float = 1e-4
) -> Tensor:
    """RLOO advantage: each sample's baseline is the mean reward of the other samples of its prompt.

    A_i = r_i - (1 / (n_g - 1)) sum_{j in g, j != i} r_j = n_g / (n_g - 1) * (r_i - mean_g(r))

    The baseline excludes r_i, so it is independent of sample i and the estimator stays unbiased
    (Ahmadian et al. 2024; Kool et al. 2019). A group of one has no baseline: A = 0. Groups may
    differ in size and labels need not be sorted. std_normalize=True whitens over the whole batch,
    (A - mean_batch(A)) / (std_batch(A) + eps), as TRL's ``RLOOTrainer(normalize_advantages=True)``; the
    paper does not normalise, hence the default False (note the pipeline passes AlgoConfig.std_normalize,
    whose default is True).
    """
    _check_eps(eps, std_normalize)
    mean, _ = group_stats(rewards, group_index)  # validates shapes
    r = _float(rewards).to(mean.dtype)
    _, inv, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    n = counts[inv].to(r.dtype)  # n_g per sample, (N,)
    scale = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.zeros_like(n))  # n/(n-1); 0 for n = 1
    adv = scale * (r - mean)  # r_i - mean_{j != i} r_j = n/(n-1) (r_i - mean_g)
    if not std_normalize:
        return adv
    return (adv - adv.mean()) / (batch_std(adv) + eps)


@register(
    "advantage", "reinforce_pp", "global batch z-score: (r - mean_batch) / (std_batch + eps) (REINFORCE++)"
)
def reinforce_pp_advantages(
    rewards: Tensor, group_index: Tensor, *, std_normalize: bool = True, eps: float = 1e-4
) -> Tensor:
    """REINFORCE++ advantage: normalise with the statistics of the whole batch, not of a prompt group.

    A_i = (r_i - mean_batch(r)) / (std_batch(r) + eps)         (Hu et al. 2025, global normalisation)

    A group's own std is statistically tied to its centred rewards, which biases GRPO's z-score; the
    batch statistics are (nearly) independent of any one sample. ``group_index`` is only validated:
    REINFORCE++ is meant for one sample per prompt. std is unbiased, eps added outside it (as TRL).

    Simplified relative to the paper: one outcome reward per completion, so the return of every token
    is r (gamma = 1) and samples, not tokens, are normalised (the paper normalises token-level
    advantages, weighting long answers more); the paper's KL-in-reward is left to the loss (kl_coef).
    """
    check_groups(rewards, group_index)
    _check_eps(eps, std_normalize)
    r = _float(rewards)
    adv = r - r.mean()  # r_i - mean_batch(r)
    return adv / (batch_std(r) + eps) if std_normalize else adv


@register(
    "advantage",
    "reinforce_pp_baseline",
    "group-mean baseline, then std of the centred rewards over the batch (REINFORCE++ w/ baseline)",
)
def reinforce_pp_baseline_advantages(
    rewards: Tensor, group_index: Tensor, *, std_normalize: bool = True, eps: float = 1e-4
) -> Tensor:
    """REINFORCE++ with a group baseline, for several samples per prompt (reasoning tasks).

    A~_i = r_i - mean_g(r)
    A_i  = (A~_i - mean_batch(A~)) / (std_batch(A~) + eps)      (Hu et al. 2025, REINFORCE++ w/ baseline)

    Unlike Lite PPO (``lite_ppo``: std of the raw rewards r), the std is of the group-centred A~, so
    differences between prompts' mean rewards do not inflate it. mean_batch(A~) is 0 up to round-off
    (every group's deviations sum to 0) and is subtracted only to follow the paper. Groups of one give
    A~ = 0 and still count in the batch std. Simplifications as in ``reinforce_pp_advantages``.
    """
    _check_eps(eps, std_normalize)
    mean, _ = group_stats(rewards, group_index)
    centred = _float(rewards).to(mean.dtype) - mean  # A~ = r - mean_g(r)
    if not std_normalize:
        return centred
    return (centred - centred.mean()) / (batch_std(centred) + eps)
