"""The actor-critic of classic PPO: two MLPs (policy and value), discrete or diagonal-Gaussian actions,
invalid-action masks.

The shape of Stable-Baselines3's `MlpPolicy` (separate 64-64 tanh networks, orthogonal weights with
gain sqrt(2) in the hidden layers, 0.01 on the policy head and 1 on the value head, a state-independent
log standard deviation), without `torch.distributions`: acting is the hot loop of a classic run, and a
distribution object per step costs more than the two small forwards. `act` samples; `evaluate` gives
log-probabilities, entropies and values of stored actions for the loss.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from schedrl.algos.losses import entropy_from_logits

LOG_2PI = math.log(2 * math.pi)


def mlp(sizes: list[int], activation: type[nn.Module], out_gain: float, ortho: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        linear = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        if ortho:
            nn.init.orthogonal_(linear.weight, out_gain if last else math.sqrt(2))
            nn.init.zeros_(linear.bias)
        layers.append(linear)
        if not last:
            layers.append(activation())
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """`obs_dim` features in; `n_actions` logits (discrete) or an `action_dim` mean (continuous) out."""

    def __init__(
        self,
        obs_dim: int,
        *,
        n_actions: int | None = None,
        action_dim: int | None = None,
        hidden: tuple[int, ...] = (64, 64),
        activation: str = "tanh",
        ortho_init: bool = True,
        log_std_init: float = 0.0,
    ) -> None:
        super().__init__()
        if (n_actions is None) == (action_dim is None):
            raise ValueError("ActorCritic takes n_actions (discrete) or action_dim (continuous), not both")
        act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
        self.discrete = n_actions is not None
        out = n_actions if n_actions is not None else action_dim
        assert out is not None
        self.pi = mlp([obs_dim, *hidden, out], act, 0.01, ortho_init)
        self.v = mlp([obs_dim, *hidden, 1], act, 1.0, ortho_init)
        self.log_std = None if self.discrete else nn.Parameter(torch.full((out,), float(log_std_init)))

    @classmethod
    def for_spaces(cls, obs_space: gym.Space, action_space: gym.Space, **kwargs) -> ActorCritic:
        """The network for one environment's observation and action spaces (vector spaces: a single copy)."""
        if not isinstance(obs_space, gym.spaces.Box) or obs_space.shape is None:
            raise ValueError(f"classic PPO needs a Box observation space, got {obs_space}")
        obs_dim = int(np.prod(obs_space.shape))
        if isinstance(action_space, gym.spaces.Discrete):
            return cls(obs_dim, n_actions=int(action_space.n), **kwargs)
        if isinstance(action_space, gym.spaces.Box) and action_space.shape is not None:
            return cls(obs_dim, action_dim=int(np.prod(action_space.shape)), **kwargs)
        raise ValueError(f"classic PPO acts in a Discrete or Box action space, got {action_space}")

    def value(self, obs: Tensor) -> Tensor:
        return self.v(obs.flatten(1)).squeeze(-1)

    def _logits(self, obs: Tensor, mask: Tensor | None) -> Tensor:
        logits = self.pi(obs.flatten(1))
        if mask is not None:
            if not bool(mask.any(-1).all()):
                raise ValueError("an action mask allows no action for some observation")
            logits = logits.masked_fill(~mask, float("-inf"))  # masked actions are never sampled
        return logits

    @torch.no_grad()
    def act(
        self, obs: Tensor, mask: Tensor | None = None, deterministic: bool = False
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(action, its log-probability, the value) for a batch of observations."""
        value = self.value(obs)
        if self.discrete:
            logp_all = torch.log_softmax(self._logits(obs, mask), -1)
            if deterministic:
                action = logp_all.argmax(-1)
            else:
                action = torch.multinomial(logp_all.exp(), 1).squeeze(-1)
            return action, logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1), value
        assert self.log_std is not None
        mean = self.pi(obs.flatten(1))
        action = mean if deterministic else mean + self.log_std.exp() * torch.randn_like(mean)
        return action, self._gauss_logp(mean, action), value

    def _gauss_logp(self, mean: Tensor, action: Tensor) -> Tensor:
        assert self.log_std is not None
        z = (action - mean) * torch.exp(-self.log_std)
        return (-0.5 * z.pow(2) - self.log_std - 0.5 * LOG_2PI).sum(-1)

    def evaluate(
        self, obs: Tensor, actions: Tensor, mask: Tensor | None = None, with_entropy: bool = True
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        """(log-probability, entropy, value) of stored `actions`, with gradients (the entropy None when
        `with_entropy` is False: a loss without an entropy bonus does not pay for it)."""
        value = self.value(obs)
        if self.discrete:
            logits = self._logits(obs, mask)
            logp = torch.log_softmax(logits, -1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
            return logp, entropy_from_logits(logits) if with_entropy else None, value
        assert self.log_std is not None
        mean = self.pi(obs.flatten(1))
        entropy = (0.5 + 0.5 * LOG_2PI + self.log_std).sum().expand(obs.shape[0]) if with_entropy else None
        return self._gauss_logp(mean, actions), entropy, value
