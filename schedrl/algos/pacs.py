"""PACS: the verifiable reward as a class label, and the policy's own log-ratio as the classifier score.

Conventions as ``losses.py``; ``adv`` holds each sequence's reward in [0, 1] (use the ``reward``
advantage estimator) and ``group_index`` (B,) the prompt of each sequence.

References: Li et al. 2025, "Implicit Actor Critic Coupling via a Supervised Learning Framework for
RLVR" (PACS), arXiv:2509.02522.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from schedrl.algos.registry import register
from schedrl.algos.spec import LossSpec
from schedrl.registry import check_arg


@dataclass(frozen=True)
class PacsArgs:
    pacs_beta: float = 1.0  # beta of the score beta * log(pi_theta / pi_old) of a sequence

    def __post_init__(self) -> None:
        check_arg(self.pacs_beta > 0, "pacs_beta", self.pacs_beta, "> 0")


@register(
    "loss",
    "pacs",
    "BCE(sigmoid(leave-one-out score of beta log pi_theta/pi_old), reward label) (PACS)",
    LossSpec(frozenset({"groups"}), "sequence", args=PacsArgs),
)
def pacs_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    group_index: Tensor,
    pacs_beta: float = 1.0,
) -> tuple[Tensor, dict[str, float]]:
    """Supervised RLVR: predict the verifier's label from an implicit reward of the policy.

    psi_i = beta sum_t (log pi_theta(o_it) - log pi_old(o_it))       score of sequence i (actor = critic)
    s_i   = psi_i - (1/(n_g - 1)) sum_{j in g, j != i} psi_j          leave-one-out (RLOO) within its group
    L     = (1/B) sum_i BCE(sigmoid(s_i), R_i) = -(1/B) sum_i [R_i log sig(s_i) + (1 - R_i) log(1 - sig(s_i))]

    The gradient flows through every psi_j of the group. At pi_theta = pi_old every s = 0 and
    dL/dpsi_j = (1/B)(0.5 - R_j) - (1/B)(1/(n_g - 1)) sum_{i != j} (0.5 - R_i)
              = -(1/B)(R_j - mean_{i != j} R_i),
    so the first step is REINFORCE with RLOO's baseline; later steps saturate through the sigmoid once
    the score separates correct from incorrect answers, the coupling of actor and critic.

    A group of one has no baseline: s_i = psi_i. ``adv`` must lie in [0, 1] (soft labels allowed).
    Simplified: the paper's class-balancing weights of the BCE are not applied; pi_old (the sampling
    policy, recomputed by the learner) is the reference of the log-ratio.

    Stats: ``score_mean``, ``label_acc`` (fraction of sequences with (s_i > 0) == (R_i > 0.5)).
    """
    if pacs_beta <= 0:
        raise ValueError(f"pacs_beta must be > 0; got {pacs_beta}")
    if adv.shape != logp.shape[:1] or group_index.shape != adv.shape:
        raise ValueError(
            f"pacs_loss needs rewards and group_index of shape (B,); got {tuple(adv.shape)}, "
            f"{tuple(group_index.shape)}"
        )
    labels = adv.detach().to(logp.dtype)
    if bool(((labels < 0) | (labels > 1)).any()):
        raise ValueError("pacs_loss: rewards are labels and must lie in [0, 1]")
    m = mask.bool()
    psi = pacs_beta * (logp - old_logp.detach()).masked_fill(~m, 0.0).sum(dim=-1)  # (B,)
    _, inv = torch.unique(group_index, return_inverse=True)
    n_groups = int(inv.max()) + 1
    total = psi.new_zeros(n_groups).index_add(0, inv, psi)[inv]  # sum_{j in g} psi_j, (B,)
    n = torch.bincount(inv, minlength=n_groups).to(psi.dtype)[inv]  # n_g, (B,)
    baseline = torch.where(n > 1, (total - psi) / (n - 1).clamp(min=1), 0.0)  # mean_{j != i} psi_j
    score = psi - baseline
    loss = F.binary_cross_entropy_with_logits(score, labels)
    with torch.no_grad():
        stats = {
            "score_mean": score.mean().item(),
            "label_acc": ((score > 0) == (labels > 0.5)).float().mean().item(),
        }
    return loss, stats
