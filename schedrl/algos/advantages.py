"""Advantage estimators: pure functions of rewards, no value network.

References: Shao et al. 2024, "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
Language Models" (GRPO), arXiv:2402.03300, Sec. 4.1.2.
"""

from __future__ import annotations

import torch
from torch import Tensor

from schedrl.algos.registry import register


def check_groups(rewards: Tensor, group_index: Tensor) -> None:
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_index must both be (N,); got {tuple(rewards.shape)} and {tuple(group_index.shape)}"
        )
    if group_index.dtype.is_floating_point or group_index.dtype == torch.bool:
        raise ValueError(f"group_index must be an integer tensor; got {group_index.dtype}")


def group_stats(rewards: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor]:
    """Per-sample mean and unbiased std of the sample's group.  rewards, group_index: (N,).

    mean_g = (1/n_g) sum_{i in g} r_i,  std_g = sqrt(sum_{i in g} (r_i - mean_g)^2 / (n_g - 1)),
    with std_g = 0 for a group of one. ``group_index`` values are arbitrary integer labels (need not be
    sorted or contiguous). Moments are taken after shifting each group by its max, so a group of equal
    rewards gets mean exactly r and std exactly 0 in any dtype.

    Returns (mean (N,), std (N,)), computed from ``rewards.detach()``.
    """
    check_groups(rewards, group_index)
    r = rewards.detach()
    r = r if r.is_floating_point() else r.float()
    _, inv = torch.unique(group_index, return_inverse=True)  # (N,) compact labels in [0, G)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    zeros = r.new_zeros(n_groups)
    shift = zeros.scatter_reduce(0, inv, r, reduce="amax", include_self=False)  # (G,)
    x = r - shift[inv]  # (N,) shifted data: exact zeros for an all-equal group
    count = torch.bincount(inv, minlength=n_groups).to(r.dtype)  # n_g, (G,)
    x_mean = zeros.index_add(0, inv, x) / count  # (G,)
    sq_dev = zeros.index_add(0, inv, (x - x_mean[inv]) ** 2)  # sum_i (r_i - mean_g)^2, (G,)
    std = (sq_dev / (count - 1).clamp(min=1)).sqrt()  # unbiased; sq_dev = 0 when n_g = 1
    return (shift + x_mean)[inv], std[inv]


@register(
    "advantage", "grpo", "group-normalised reward: (r - mean_g) / (std_g + eps), GRPO outcome supervision"
)
def group_advantages(
    rewards: Tensor, group_index: Tensor, *, std_normalize: bool = True, eps: float = 1e-4
) -> Tensor:
    """GRPO outcome advantage, shared by every token of a completion.  rewards, group_index: (N,) -> (N,).

    A_i = (r_i - mean_g(r)) / (std_g(r) + eps)   (std_normalize=True; Shao et al. 2024, Sec. 4.1.2)
    A_i =  r_i - mean_g(r)                         (std_normalize=False; Liu et al. 2025, "Dr. GRPO")

    g is the group of sample i (the completions of one prompt); groups may have different sizes. std is
    the unbiased sample std, as TRL's ``rewards.view(-1, G).std(dim=1)``; a group of one has std 0 and
    advantage 0. ``eps`` is added to the std (not inside the sqrt), as in TRL.

    References: Shao et al. 2024, arXiv:2402.03300; Liu et al. 2025, "Understanding R1-Zero-Like
    Training: A Critical Perspective", arXiv:2503.20783.
    """
    if eps <= 0 and std_normalize:
        raise ValueError(f"eps must be > 0 when std_normalize=True; got {eps}")
    mean, std = group_stats(rewards, group_index)
    r = rewards.detach().to(mean.dtype)
    adv = r - mean  # r_i - mean_g(r)
    return adv / (std + eps) if std_normalize else adv


@register(
    "advantage", "reward", "the raw reward, no baseline: for losses that bring their own (ppo, sao, pacs)"
)
def raw_reward(
    rewards: Tensor, group_index: Tensor, *, std_normalize: bool = True, eps: float = 1e-4
) -> Tensor:
    """A_i = r_i, as float and detached.  rewards, group_index: (N,) -> (N,).

    For losses whose baseline is not a group statistic: PPO's value head with GAE, SAO's value of the
    prompt, PACS's reward-as-label. ``std_normalize`` and ``eps`` are accepted for the estimator contract
    and ignored: any scaling would change PACS's labels or the critics' targets.
    """
    check_groups(rewards, group_index)
    r = rewards.detach()
    return r if r.is_floating_point() else r.float()


def task_normalized(adv: Tensor, task_index: Tensor, eps: float = 1e-4) -> Tensor:
    """AgentRL's task-level advantage normalisation.  adv, task_index: (N,) -> (N,).

    A'_i = (A_i - mean_t(A)) / (std_t(A) + eps), t the task type of sample i (its domain): within a
    multi-task batch each task's advantages are standardised among themselves, so a task whose rewards
    are larger or more spread out does not take the update over. A task with one sample, or with equal
    advantages, gets 0.

    Reference: Zhang et al. 2025, "AgentRL: Scaling Agentic Reinforcement Learning with a Multi-Turn,
    Multi-Task Framework", arXiv:2510.04206.
    """
    if eps <= 0:
        raise ValueError(f"eps must be > 0; got {eps}")
    mean, std = group_stats(adv, task_index)
    return (adv.detach().to(mean.dtype) - mean) / (std + eps)
