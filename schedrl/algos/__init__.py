"""Pure tensor math of RL post-training: advantage estimators and policy losses, picked by name.

adv = get("advantage", "grpo")(rewards, group_index)
loss, stats = get("loss", "grpo")(logp, old_logp, adv, mask, kl_coef=0.04, ref_logp=ref_logp)
"""

from schedrl.algos.advantages import group_advantages, group_stats
from schedrl.algos.losses import (
    AGGS,
    KL_ESTIMATORS,
    entropy_from_logits,
    grpo_loss,
    kl_penalty,
    masked_mean,
    ppo_clip_loss,
    token_logprobs,
)
from schedrl.algos.registry import KINDS, available, get, register

__all__ = [
    "AGGS",
    "KINDS",
    "KL_ESTIMATORS",
    "available",
    "entropy_from_logits",
    "get",
    "group_advantages",
    "group_stats",
    "grpo_loss",
    "kl_penalty",
    "masked_mean",
    "ppo_clip_loss",
    "register",
    "token_logprobs",
]
