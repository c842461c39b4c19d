"""Rollouts of a Gymnasium vector environment, with its autoreset handled explicitly.

Gymnasium 1.x vector environments reset a finished copy by themselves, in one of two ways
(`envs.metadata["autoreset_mode"]`), and both are handled here:

- NEXT_STEP (the default, and the only mode of batched implementations such as CartPole's): the step
  that ends an episode returns its final observation; the copy's *next* step ignores the action and
  returns the reset observation with reward 0. That transition is no experience: it is stored with
  `valid = False`, trained on by nothing and not counted as an environment step. The value computed
  on the final observation (the policy acts on it, uselessly) bootstraps a time-limit cut.
- SAME_STEP: the step that ends an episode returns the next episode's first observation, and the
  final one in `info["final_obs"]`; a time-limit cut bootstraps from the critic's value of that.

A time limit (`truncated` without `terminated`) is not a terminal state: its reward gets
gamma V(final observation) added, as Stable-Baselines3 does, and the episode ends there for GAE. An
action mask comes from `info["action_mask"]` where the environment gives one. Observations are
normalized here (gymnasium's `RunningMeanStd`), not by a wrapper, so that the final observations
inside `info` are normalized too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers.utils import RunningMeanStd
from torch import Tensor

MASK_KEY = "action_mask"


@dataclass
class Rollout:
    """T steps of N copies. obs (T, N, D); actions (T, N) or (T, N, A); logp, values, rewards (T, N);
    ends (T, N): an episode ended after the step; valid (T, N): a real transition; masks (T, N, K) or
    None; last_value (N,): V of the observation after the last step."""

    obs: Tensor
    actions: Tensor
    logp: Tensor
    values: Tensor
    rewards: Tensor
    ends: Tensor
    valid: Tensor
    masks: Tensor | None
    last_value: Tensor


class ObsNormalizer:
    """Running mean and variance of observations (gymnasium's `RunningMeanStd`), clipped; frozen in
    evaluation; its state goes into checkpoints."""

    def __init__(self, shape: tuple[int, ...], clip: float, enabled: bool) -> None:
        self.enabled, self.clip = enabled, clip
        self.rms = RunningMeanStd(shape=shape)

    def __call__(self, obs: np.ndarray, update: bool = True) -> np.ndarray:
        if not self.enabled:
            return obs.astype(np.float32, copy=False)
        if update:
            self.rms.update(obs)
        out = (obs - self.rms.mean) / np.sqrt(self.rms.var + 1e-8)
        return np.clip(out, -self.clip, self.clip).astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.rms.mean, "var": self.rms.var, "count": self.rms.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rms.mean, self.rms.var, self.rms.count = state["mean"], state["var"], state["count"]


class RewardScaler:
    """Rewards divided by the running standard deviation of the discounted return, clipped (what SB3's
    `VecNormalize(norm_reward=True)` and gymnasium's `NormalizeReward` do); episode statistics keep the
    raw rewards. Off: rewards pass unchanged."""

    def __init__(self, n: int, gamma: float, clip: float, enabled: bool) -> None:
        self.enabled, self.gamma, self.clip = enabled, gamma, clip
        self.rms = RunningMeanStd(shape=())
        self.returns = np.zeros(n)

    def __call__(self, reward: np.ndarray, done: np.ndarray, valid: np.ndarray) -> np.ndarray:
        if not self.enabled:
            return reward
        self.returns = np.where(valid, self.returns * self.gamma + reward, self.returns)
        self.rms.update(self.returns[valid])
        self.returns[done] = 0.0
        scaled = reward / np.sqrt(self.rms.var + 1e-8)
        return np.clip(scaled, -self.clip, self.clip).astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.rms.mean, "var": self.rms.var, "count": self.rms.count, "returns": self.returns}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rms.mean, self.rms.var, self.rms.count = state["mean"], state["var"], state["count"]
        self.returns = state["returns"]


def action_mask(infos: dict, n: int, k: int | None) -> np.ndarray | None:
    if MASK_KEY not in infos:
        return None
    mask = np.asarray(infos[MASK_KEY], dtype=bool)
    if k is not None and mask.shape != (n, k):
        raise ValueError(f"info[{MASK_KEY!r}] must be (num_envs, n_actions) = ({n}, {k}); got {mask.shape}")
    return mask


class Collector:
    """Steps `envs` with `policy`; keeps the current observations, the reset-pending copies and the
    running episode returns between rollouts. `episodes` collects (return, length) of finished ones."""

    def __init__(
        self,
        envs: gym.vector.VectorEnv,
        policy: Any,
        normalizer: ObsNormalizer,
        gamma: float,
        reward_scale: RewardScaler | None = None,
    ):
        self.envs, self.policy, self.norm, self.gamma = envs, policy, normalizer, gamma
        self.reward_scale = reward_scale or RewardScaler(envs.num_envs, gamma, 10.0, enabled=False)
        self.mode = envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        if self.mode not in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP):
            raise ValueError(f"classic PPO handles NEXT_STEP and SAME_STEP autoreset, not {self.mode}")
        self.n = envs.num_envs
        space = envs.single_action_space
        self.n_actions = int(space.n) if isinstance(space, gym.spaces.Discrete) else None
        self.box = space if isinstance(space, gym.spaces.Box) else None
        self.obs: np.ndarray | None = None
        self.mask: np.ndarray | None = None
        self.pending_reset = np.zeros(self.n, dtype=bool)  # NEXT_STEP: the copy's next step is its reset
        self.ep_return = np.zeros(self.n)
        self.ep_length = np.zeros(self.n, dtype=np.int64)
        self.episodes: list[tuple[float, int]] = []
        self.steps = 0  # valid transitions so far

    def reset(self, seed: int) -> None:
        obs, infos = self.envs.reset(seed=seed)
        self.obs, self.mask = self.norm(np.asarray(obs)), action_mask(infos, self.n, self.n_actions)
        self.pending_reset[:] = False
        self.ep_return[:], self.ep_length[:] = 0.0, 0

    def take_episodes(self) -> list[tuple[float, int]]:
        """(return, length) of the episodes that ended since the last call."""
        out, self.episodes = self.episodes, []
        return out

    def state_dict(self) -> dict[str, Any]:
        keys = ("obs", "mask", "pending_reset", "ep_return", "ep_length", "episodes", "steps")
        return {**{k: getattr(self, k) for k in keys}, "reward_scale": self.reward_scale.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.reward_scale.load_state_dict(state.pop("reward_scale"))
        for k, v in state.items():
            setattr(self, k, v)

    def _env_action(self, action: Tensor) -> np.ndarray:
        a = action.numpy()
        if self.box is not None:  # the Gaussian's sample, clipped to the box (the unclipped one is trained)
            a = np.clip(a, self.box.low, self.box.high)
        return a

    def collect(self, n_steps: int) -> Rollout:
        assert self.obs is not None, "Collector.reset first"
        n, mode = self.n, self.mode
        obs_buf, act_buf, logp_buf, val_buf = [], [], [], []
        rew = np.zeros((n_steps, n), dtype=np.float32)
        ends = np.zeros((n_steps, n), dtype=bool)
        valid = np.ones((n_steps, n), dtype=bool)
        mask_buf: list[np.ndarray] = []
        truncated_at: list[tuple[int, np.ndarray]] = []  # NEXT_STEP: cuts to bootstrap from the next value
        for t in range(n_steps):
            obs_t = torch.from_numpy(self.obs)
            mask_t = None if self.mask is None else torch.from_numpy(self.mask)
            action, logp, value = self.policy.act(obs_t, mask_t)
            obs_buf.append(obs_t)
            act_buf.append(action)
            logp_buf.append(logp)
            val_buf.append(value)
            if self.mask is not None:
                mask_buf.append(self.mask)
            valid[t] = ~self.pending_reset
            next_obs, reward, terminated, truncated, infos = self.envs.step(self._env_action(action))
            reward = np.asarray(reward, dtype=np.float32) * valid[t]
            done = (np.asarray(terminated) | np.asarray(truncated)) & valid[t]
            cut = np.asarray(truncated) & ~np.asarray(terminated) & valid[t]
            rew[t], ends[t] = self.reward_scale(reward, done, valid[t]), done
            self.ep_return += reward
            self.ep_length += valid[t]
            for i in np.flatnonzero(done):
                self.episodes.append((float(self.ep_return[i]), int(self.ep_length[i])))
            self.ep_return[done], self.ep_length[done] = 0.0, 0
            self.steps += int(valid[t].sum())
            if cut.any():
                if mode == AutoresetMode.SAME_STEP:
                    final = np.stack([infos["final_obs"][i] for i in np.flatnonzero(cut)])
                    with torch.no_grad():
                        final_v = self.policy.value(torch.from_numpy(self.norm(final, update=False)))
                    rew[t, cut] += self.gamma * final_v.numpy()
                else:
                    truncated_at.append((t, cut))
            if mode == AutoresetMode.NEXT_STEP:
                self.pending_reset = done
            self.obs = self.norm(np.asarray(next_obs))
            self.mask = action_mask(infos, n, self.n_actions)
        last_value = self.policy.act(
            torch.from_numpy(self.obs), None if self.mask is None else torch.from_numpy(self.mask)
        )[2]
        values = torch.stack(val_buf)
        for t, cut in truncated_at:  # V(final obs) is the value the policy computed on it one step later
            nxt = values[t + 1] if t + 1 < n_steps else last_value
            rew[t, cut] += self.gamma * nxt.numpy()[cut]
        return Rollout(
            obs=torch.stack(obs_buf),
            actions=torch.stack(act_buf),
            logp=torch.stack(logp_buf),
            values=values,
            rewards=torch.from_numpy(rew),
            ends=torch.from_numpy(ends),
            valid=torch.from_numpy(valid),
            masks=torch.from_numpy(np.stack(mask_buf)) if mask_buf else None,
            last_value=last_value,
        )
