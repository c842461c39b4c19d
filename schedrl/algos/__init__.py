"""Pure tensor math of RL post-training: advantage estimators and policy losses, picked by name.

adv = get("advantage", "grpo")(rewards, group_index)
loss, stats = get("loss", "grpo")(logp, old_logp, adv, mask, kl_coef=0.04, ref_logp=ref_logp)
"""

from schedrl.algos.advantages import group_advantages, group_stats
from schedrl.algos.grpo_variants import (
    dapo_loss,
    drgrpo_loss,
    lite_ppo_advantages,
    overlong_reward_shaping,
)
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
from schedrl.algos.ppo import gae, value_loss
from schedrl.algos.ratio_variants import cispo_loss, gspo_loss
from schedrl.algos.registry import KINDS, available, get, register
from schedrl.algos.reinforce import (
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)

__all__ = [
    "AGGS",
    "KINDS",
    "KL_ESTIMATORS",
    "available",
    "cispo_loss",
    "dapo_loss",
    "drgrpo_loss",
    "entropy_from_logits",
    "gae",
    "get",
    "group_advantages",
    "group_stats",
    "grpo_loss",
    "gspo_loss",
    "kl_penalty",
    "lite_ppo_advantages",
    "masked_mean",
    "overlong_reward_shaping",
    "ppo_clip_loss",
    "register",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "token_logprobs",
    "value_loss",
]
