"""Credit over the turns of a multi-turn episode: broadcast one advantage, or one per turn.

    broadcast       every model token of a trajectory gets its group advantage of the whole
                    episode's reward (the sum of its turn rewards), as GRPO does
    return_to_go    turn t's tokens get A_t = (G_t - mean_g G_0) / (std_g G_0 + eps), with the
                    discounted return-to-go G_t = sum_{k >= t} gamma^(k - t) r_k of the turn
                    rewards r_k (a turn's reward: what the environment returned for it, the
                    outcome reward on the last turn, tool rewards included)

Why one baseline for every turn, not one per turn index. verl#7244 ("a turn-level baseline that
stays unbiased under variable turn counts") found that the natural per-turn construction, MT-GRPO's
normalisation of each turn index over the group and then aggregating, is biased whenever the policy
decides when to stop: the baseline a trajectory receives sums over as many turn indices as it took
turns, so it depends on the trajectory's own actions. The bias equals the group mean of the
intermediate rewards, a hidden bonus or penalty on every "take another turn" decision, the length
bias per-turn normalisation is meant to remove. Here the baseline and scale are those of the group's
whole-episode returns G_0: the same numbers for every turn of every trajectory in the group, whatever
turn it stopped at, so no term depends on a trajectory's stopping turn. (It is the GRPO baseline,
so it shares GRPO's small bias from including the trajectory's own return in its group mean.)

Tool, environment and template tokens carry no loss under either: the learner's mask is the
ledger's `trained`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from schedrl.algos.advantages import group_stats

TURN_CREDITS = ("broadcast", "return_to_go")


def returns_to_go(rewards: Sequence[float], gamma: float) -> list[float]:
    """G_t = r_t + gamma * G_{t+1}, G past the last turn = 0."""
    out, g = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        g = float(rewards[t]) + gamma * g
        out[t] = g
    return out


def turn_advantages(
    turn_rewards: Sequence[Sequence[float]],
    group_index: Tensor,
    gamma: float = 1.0,
    std_normalize: bool = True,
    eps: float = 1e-4,
) -> list[list[float]]:
    """Per trajectory, per model turn: A_t = (G_t - mean_g G_0) / (std_g G_0 + eps) (no scale when
    `std_normalize` is False). `turn_rewards[i]` holds one reward per model turn of trajectory i."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"turn discount must be in [0, 1], got {gamma!r}")
    if any(len(r) == 0 for r in turn_rewards):
        raise ValueError("turn_advantages: every trajectory needs at least one turn reward")
    rtg = [returns_to_go(r, gamma) for r in turn_rewards]
    g0 = torch.tensor([g[0] for g in rtg], dtype=torch.float64)
    mean, std = group_stats(g0, group_index)
    scale = (std + eps) if std_normalize else torch.ones_like(std)
    return [[(x - float(m)) / float(s) for x in g] for g, m, s in zip(rtg, mean, scale, strict=True)]


def per_token(turn_adv: Sequence[float], turns: Sequence[int]) -> list[float]:
    """Each completion token's advantage: its turn's (context tokens after a turn take that turn's; the
    learner's mask leaves them out)."""
    last = len(turn_adv) - 1
    return [turn_adv[min(t, last)] for t in turns]
