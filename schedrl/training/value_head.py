"""A scalar value head on the policy's last hidden state, for losses that need a critic (PPO, SAO).

V(s_t) = w^T h_t + b, with h_t the final (normed) hidden state at position t of the policy itself:
the critic shares the policy's trunk, as in CleanRL's Atari PPO, so it costs one linear layer.
"""

from __future__ import annotations

import torch
from torch import nn


class ValueHead(nn.Module):
    """(B, L, H) hidden states -> (B, L) float32 values; zero-initialised, so V = 0 before training."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden.float()).squeeze(-1)
