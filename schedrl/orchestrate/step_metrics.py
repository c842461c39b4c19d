"""The metrics every training step logs, whichever loop ran it (sync or async).

The progress bar, `schedrl report`, the benchmarks and the run's reward curve read
these keys; `STEP_KEYS` names the ones both loops must carry, and a test holds
each loop to it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from schedrl.envs.base import Task
from schedrl.types import Sample

# Wall-clock measurements: the keys on which two runs of one config differ.
TIMING_KEYS = ("gen_s", "train_s", "step_s", "tokens_per_s", "queue_s_mean")

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


def length_icc(lengths: torch.Tensor, groups: torch.Tensor, n_groups: int) -> float:
    """The share of the spread of log lengths that lies between prompt groups (an intraclass
    correlation in [0, 1]): 1 when a group's samples are all as long, 0 when the prompt says nothing
    about the length. The simulator's calibration draws correlated lengths with it."""
    logl = lengths.clamp(min=1.0).log()
    total = float(((logl - logl.mean()) ** 2).sum())
    if total <= 0.0:
        return 1.0  # every sample equally long
    count = torch.zeros(n_groups).index_add_(0, groups, torch.ones_like(logl))
    means = torch.zeros(n_groups).index_add_(0, groups, logl) / count.clamp(min=1.0)
    within = float(((logl - means[groups]) ** 2).sum())
    return min(1.0, max(0.0, 1.0 - within / total))


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
    env_s = [s.env_s for s in samples if s.env_s is not None]
    q = torch.quantile(lengths, torch.tensor([0.1, 0.5, 0.9])).tolist() if len(lengths) else [0.0] * 3
    queue = torch.tensor([s.timings.queue_s for s in samples], dtype=torch.float)
    return {
        "len_group_icc": length_icc(lengths, groups, n_groups),
        **({"turns_mean": sum(turns) / len(turns)} if turns else {}),
        **({"env_s_mean": sum(env_s) / len(env_s), "env_s_max": max(env_s)} if env_s else {}),
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "solved_frac": float((rewards >= 1).float().mean()),
        "zero_adv_group_frac": float((spread == 0).float().mean()),
        "completion_len_mean": float(lengths.mean()),
        "truncated_frac": sum(s.finish_reason == "length" for s in samples) / len(samples),
        "gen_tokens": float(lengths.sum()),
        # the length distribution and how long requests waited for admission (the report draws both)
        "len_p10": q[0],
        "len_p50": q[1],
        "len_p90": q[2],
        "len_max": float(lengths.max()) if len(lengths) else 0.0,
        # a step's attention work grows with it: the simulator's calibration reads it
        "len_sq_mean": float((lengths**2).mean()) if len(lengths) else 0.0,
        "queue_s_mean": float(queue.mean()) if len(queue) else 0.0,
    }


def scheduler_metrics(plan: Sequence[tuple[Task, int]]) -> dict[str, float]:
    """What the data scheduler decided for a step: group sizes and each domain's share of the samples."""
    sizes = [n for _, n in plan]
    total = max(1, sum(sizes))
    shares: dict[str, float] = {}
    for task, n in plan:
        shares[task.domain] = shares.get(task.domain, 0.0) + n / total
    return {
        "data/group_size_mean": sum(sizes) / max(1, len(sizes)),
        "data/group_size_max": float(max(sizes, default=0)),
        **{f"data/domain/{d}": v for d, v in sorted(shares.items())},
    }


def timing_metrics(gen_tokens: float, step_s: float, train_s: float) -> dict[str, float]:
    """`step_s`: wall seconds since the previous step ended; `train_s`: the learner's share of it
    (in the asynchronous pipeline generation overlaps it); tokens/s over the whole step."""
    return {"step_s": step_s, "train_s": train_s, "tokens_per_s": gen_tokens / step_s if step_s > 0 else 0.0}
