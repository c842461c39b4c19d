"""Pure tensor math of RL post-training: advantage estimators and policy losses, picked by name.

adv = get("advantage", "grpo")(rewards, group_index)
loss, stats = get("loss", "grpo")(logp, old_logp, adv, mask, kl_coef=0.04, ref_logp=ref_logp)
"""

from schedrl.algos.advantages import group_advantages, group_stats, raw_reward
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
from schedrl.algos.offpolicy import (
    cross_stage_is_loss,
    cross_stage_weight,
    decoupled_ppo_loss,
    is_weight,
    offpolicy_stats,
    tis_loss,
)
from schedrl.algos.pacs import pacs_loss
from schedrl.algos.ppo import gae, ppo_advantages, ppo_loss, terminal_rewards, value_loss, whiten
from schedrl.algos.rapid import rapid_loss
from schedrl.algos.ratio_variants import cispo_loss, gspo_loss
from schedrl.algos.registry import KINDS, available, get, register
from schedrl.algos.reinforce import (
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from schedrl.algos.rover import rover_loss, vocab_mean_logp
from schedrl.algos.sao import first_token_values, sao_loss

__all__ = [
    "AGGS",
    "KINDS",
    "KL_ESTIMATORS",
    "available",
    "cispo_loss",
    "cross_stage_is_loss",
    "cross_stage_weight",
    "dapo_loss",
    "decoupled_ppo_loss",
    "drgrpo_loss",
    "entropy_from_logits",
    "first_token_values",
    "gae",
    "get",
    "group_advantages",
    "group_stats",
    "grpo_loss",
    "gspo_loss",
    "is_weight",
    "kl_penalty",
    "lite_ppo_advantages",
    "masked_mean",
    "offpolicy_stats",
    "overlong_reward_shaping",
    "pacs_loss",
    "ppo_advantages",
    "ppo_clip_loss",
    "ppo_loss",
    "rapid_loss",
    "raw_reward",
    "register",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "rover_loss",
    "sao_loss",
    "terminal_rewards",
    "tis_loss",
    "token_logprobs",
    "value_loss",
    "vocab_mean_logp",
    "whiten",
]
