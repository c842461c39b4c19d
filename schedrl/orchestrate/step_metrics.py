"""The metrics every training step logs, whichever loop ran it (sync or async).

The progress bar, `schedrl report`, the benchmarks and the run's reward curve read
these keys; `STEP_KEYS` names the ones both loops must carry, and a test holds
each loop to it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from schedrl.types import Sample

# Keys on every step row of metrics.jsonl, in both loops.
STEP_KEYS = (
    "reward_mean",
    "reward_std",
    "solved_frac",
    "zero_adv_group_frac",
    "completion_len_mean",
    "truncated_frac",
    "gen_tokens",
    "reward_errors",
    "step_s",
    "train_s",
    "tokens_per_s",
    "lr",
)


def rollout_metrics(
    samples: Sequence[Sample], rewards: torch.Tensor, groups: torch.Tensor
) -> dict[str, float]:
    """Reward, length and spread statistics of one step's scored samples."""
    n_groups = int(groups.max()) + 1
    spread = torch.zeros(n_groups).scatter_reduce(0, groups, rewards, "amax", include_self=False)
    spread -= torch.zeros(n_groups).scatter_reduce(0, groups, rewards, "amin", include_self=False)
    # model tokens only: a multi-turn sample's tool and environment tokens are context
    lengths = torch.tensor([s.num_model_tokens for s in samples], dtype=torch.float)
    turns = [s.num_model_turns for s in samples if s.turns is not None]
    return {
        **({"turns_mean": sum(turns) / len(turns)} if turns else {}),
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "solved_frac": float((rewards >= 1).float().mean()),
        "zero_adv_group_frac": float((spread == 0).float().mean()),
        "completion_len_mean": float(lengths.mean()),
        "truncated_frac": sum(s.finish_reason == "length" for s in samples) / len(samples),
        "gen_tokens": float(lengths.sum()),
    }


def timing_metrics(gen_tokens: float, step_s: float, train_s: float) -> dict[str, float]:
    """`step_s`: wall seconds since the previous step ended; `train_s`: the learner's share of it
    (in the asynchronous pipeline generation overlaps it); tokens/s over the whole step."""
    return {"step_s": step_s, "train_s": train_s, "tokens_per_s": gen_tokens / step_s if step_s > 0 else 0.0}
