"""Behaviour cloning before PPO: the policy first imitates a heuristic the environment can play.

Where a good heuristic exists (LPT for admission, a dispatching rule for a job shop), PPO from a
random policy spends most of its steps rediscovering it: one decision among sixty moves an episode's
return by a fraction of a percent, so the advantage of picking the longest request is buried in
noise. Cloning the heuristic first, then fine-tuning with PPO, starts the search there (the
pretraining-then-RL recipe of AlphaStar and of the learned job-shop dispatchers).

The environment names its heuristics: `env.unwrapped.teacher_action(name)` returns the action the
heuristic takes in the current state. `clone` plays the teacher for `decisions` steps on
environments seeded apart from training and evaluation, then minimises the cross-entropy of the
policy's masked action distribution against the teacher's actions, less `ent_weight` x its entropy
(as the `imitation` library's BC): without it the clone is deterministic, and PPO, which explores
by sampling, has nothing left to try.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from schedrl.classic.config import EnvSection, PretrainSection
from schedrl.classic.rollout import MASK_KEY

CLONE_SEED_BASE = 5 * 10**8  # teacher episodes' seeds: disjoint from training (seed + k) and evaluation


def teacher_dataset(e: EnvSection, teacher: str, decisions: int, seed: int):
    """(observations, masks, actions) of the teacher playing `decisions` steps, episode after episode."""
    env = gym.make(e.id, **e.kwargs)
    teacher_env: Any = env.unwrapped
    if not isinstance(env.action_space, gym.spaces.Discrete) or not hasattr(teacher_env, "teacher_action"):
        raise ValueError(
            f"config field 'pretrain.teacher': environment {e.id!r} has no teacher_action(name), "
            "so it names no heuristic to clone (cloning needs one, and discrete actions)"
        )
    obs_rows, mask_rows, actions = [], [], []
    episode = 0
    obs, info = env.reset(seed=CLONE_SEED_BASE + seed * 10_000)
    while len(actions) < decisions:
        try:
            a = int(teacher_env.teacher_action(teacher))
        except ValueError as err:
            raise ValueError(f"config field 'pretrain.teacher': {err}") from None
        obs_rows.append(np.asarray(obs, dtype=np.float32))
        n = int(env.action_space.n)  # type: ignore[attr-defined]
        mask_rows.append(
            np.asarray(info[MASK_KEY], dtype=bool) if MASK_KEY in info else np.ones(n, dtype=bool)
        )
        actions.append(a)
        obs, _, terminated, truncated, info = env.step(a)
        if terminated or truncated:
            episode += 1
            obs, info = env.reset(seed=CLONE_SEED_BASE + seed * 10_000 + episode)
    env.close()
    return (
        torch.from_numpy(np.stack(obs_rows)),
        torch.from_numpy(np.stack(mask_rows)),
        torch.tensor(actions),
    )


def clone(policy, e: EnvSection, p: PretrainSection, seed: int) -> dict[str, float]:
    """Fit `policy` to the teacher's actions; returns the final loss and the greedy agreement."""
    assert p.teacher is not None
    obs, masks, actions = teacher_dataset(e, p.teacher, p.decisions, seed)
    opt = torch.optim.Adam(policy.parameters(), lr=p.lr)
    gen = torch.Generator().manual_seed(seed)
    n, loss_sum, batches = len(actions), 0.0, 0
    for _ in range(p.epochs):
        order = torch.randperm(n, generator=gen)
        loss_sum, batches = 0.0, 0
        for start in range(0, n, p.batch_size):
            idx = order[start : start + p.batch_size]
            logp, entropy, _ = policy.evaluate(obs[idx], actions[idx], masks[idx], with_entropy=True)
            loss = -logp.mean() - p.ent_weight * entropy.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum, batches = loss_sum + loss.item(), batches + 1
    with torch.no_grad():
        chosen = torch.cat(
            [
                policy.act(obs[i : i + 1024], masks[i : i + 1024], deterministic=True)[0]
                for i in range(0, n, 1024)
            ]
        )
    return {
        "pretrain/loss": loss_sum / max(batches, 1),
        "pretrain/agreement": float((chosen == actions).float().mean()),
        "pretrain/decisions": float(n),
    }
