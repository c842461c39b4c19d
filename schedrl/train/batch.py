"""Turn samples into padded training tensors.

Row i is prompt_i + completion_i, right-padded to the longest row. Targets are the
inputs shifted by one; `mask` marks the target positions that are completion tokens,
so prompt tokens and padding never enter a loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class TokenBatch:
    input_ids: torch.Tensor  # (B, L) prompt + completion, right-padded
    attention_mask: torch.Tensor  # (B, L) 1 on real tokens
    targets: torch.Tensor  # (B, L-1) input_ids shifted left
    mask: torch.Tensor  # (B, L-1) float, 1 where the target is a completion token
    behaviour_logp: torch.Tensor  # (B, L-1) engine log-probs on completion targets, 0 elsewhere

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: torch.Tensor) -> TokenBatch:
        """Rows `idx`, trimmed to the longest selected row."""
        length = int(self.attention_mask[idx].sum(-1).max())
        return TokenBatch(
            self.input_ids[idx, :length],
            self.attention_mask[idx, :length],
            self.targets[idx, : length - 1],
            self.mask[idx, : length - 1],
            self.behaviour_logp[idx, : length - 1],
        )

    def to(self, device: torch.device) -> TokenBatch:
        return TokenBatch(*(t.to(device) for t in vars(self).values()))


def collate(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    behaviour_logp: Sequence[Sequence[float]] | None = None,
) -> TokenBatch:
    """Build a `TokenBatch`; every completion must hold at least one token."""
    rows = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
    length = max(len(r) for r in rows)
    n = len(rows)
    ids = torch.full((n, length), pad_id, dtype=torch.long)
    attn = torch.zeros((n, length), dtype=torch.long)
    mask = torch.zeros((n, length - 1))
    blp = torch.zeros((n, length - 1))
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        if not c:
            raise ValueError(f"collate: completion {i} is empty")
        ids[i, : len(rows[i])] = torch.tensor(rows[i])
        attn[i, : len(rows[i])] = 1
        # target position j predicts token j + 1: completion tokens sit at targets len(p)-1 ...
        mask[i, len(p) - 1 : len(p) - 1 + len(c)] = 1
        if behaviour_logp is not None:
            blp[i, len(p) - 1 : len(p) - 1 + len(c)] = torch.tensor(behaviour_logp[i], dtype=torch.float32)
    return TokenBatch(ids, attn, ids[:, 1:].clone(), mask, blp)
