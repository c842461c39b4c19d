"""Credit over the turns of a multi-turn episode: broadcast one advantage, or one per turn.

    broadcast       every model token of a trajectory gets its group advantage of the whole
                    episode's reward (the sum of its turn rewards), as GRPO does
    return_to_go    turn t's tokens get A_t = (G_t - b_t) / (std_g G_0 + eps), with the
                    discounted return-to-go G_t = sum_{k >= t} gamma^(k - t) r_k of the turn
                    rewards r_k (a turn's reward: what the environment returned for it, the
                    outcome reward on the last turn, tool rewards included) and b_t the mean of
                    G_t over the trajectory's group, a trajectory that ended before turn t
                    counting 0 (it collects nothing more)

Why this baseline. verl#7244 ("a turn-level baseline that stays unbiased under variable turn
counts") found that the natural per-turn construction, MT-GRPO's normalisation of each turn index
over the trajectories that reached it, then summed over the turns that follow, is biased whenever
the policy decides when to stop: turn t's baseline is a sum over the turns the trajectory goes on
to take, so it depends on its own later actions. The bias equals the group mean of the
intermediate rewards, a hidden bonus or penalty on every "take another turn" decision: the length
bias per-turn normalisation is meant to remove. Here b_t is one number per (group, turn index),
computed from every trajectory of the group at that index, never a sum over the trajectory's own
future turns, so it does not depend on when the trajectory stops; including the trajectory's own
G_t makes it (n - 1)/n times the leave-one-out estimator, as GRPO's baseline is. One scale per
group (the std of the whole-episode returns) keeps late turns, where most of the group has
stopped, from being divided by a near-zero spread.

A single constant baseline for every turn (the group mean of G_0) is unbiased too, but it is not a
good one: with intermediate rewards G_t shrinks as t grows, so every late turn's tokens get a
negative advantage whatever they did. On `guess` with `consistent_reward: 0.1` and gamma 0.9 that
pushed the policy down to held-out pass@1 0.25 in one seed (0.59 with broadcast); measured with
`examples/guess_game.yaml`, see the recipe.

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
    """Per trajectory, per model turn: A_t = (G_t - b_t) / (std_g G_0 + eps), b_t the group mean of G_t
    with ended trajectories at 0 (no scale when `std_normalize` is False). `turn_rewards[i]` holds one
    reward per model turn of trajectory i."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"turn discount must be in [0, 1], got {gamma!r}")
    if any(len(r) == 0 for r in turn_rewards):
        raise ValueError("turn_advantages: every trajectory needs at least one turn reward")
    rtg = [returns_to_go(r, gamma) for r in turn_rewards]
    width = max(len(g) for g in rtg)
    padded = torch.tensor([g + [0.0] * (width - len(g)) for g in rtg], dtype=torch.float64)  # (N, T)
    _, inv = torch.unique(group_index, return_inverse=True)
    n_groups = int(inv.max()) + 1
    count = torch.bincount(inv, minlength=n_groups).to(torch.float64)
    baseline = torch.zeros(n_groups, width, dtype=torch.float64).index_add(0, inv, padded) / count[:, None]
    _, std = group_stats(padded[:, 0], group_index)
    scale = (std + eps) if std_normalize else torch.ones_like(std)
    adv = (padded - baseline[inv]) / scale[:, None]
    return [adv[i, : len(g)].tolist() for i, g in enumerate(rtg)]


def per_token(turn_adv: Sequence[float], turns: Sequence[int]) -> list[float]:
    """Each completion token's advantage: its turn's (context tokens after a turn take that turn's; the
    learner's mask leaves them out)."""
    last = len(turn_adv) - 1
    return [turn_adv[min(t, last)] for t in turns]
