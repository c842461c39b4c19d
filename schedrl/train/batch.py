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
    versions: torch.Tensor | None = None  # (B, L-1) long, policy version per completion target, -1 elsewhere

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
            self.versions[idx, : length - 1] if self.versions is not None else None,
        )

    def to(self, device: torch.device) -> TokenBatch:
        return TokenBatch(*(t.to(device) if t is not None else None for t in vars(self).values()))


def prompt_groups(batch: TokenBatch) -> torch.Tensor:
    """Group label (B,) per row: rows with the same prompt tokens (those before the completion) share one.

    Labels count from 0 in order of first appearance; two tasks with identical prompts share a group.
    """
    first = batch.mask.bool().to(torch.int8).argmax(dim=-1)  # first completion target = len(prompt) - 1
    labels: dict[tuple[int, ...], int] = {}
    out = [
        labels.setdefault(tuple(row[: int(f) + 1].tolist()), len(labels))
        for row, f in zip(batch.input_ids, first, strict=True)
    ]
    return torch.tensor(out, dtype=torch.long)


def collate(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    behaviour_logp: Sequence[Sequence[float]] | None = None,
    versions: Sequence[Sequence[int]] | None = None,
) -> TokenBatch:
    """Build a `TokenBatch`; every completion must hold at least one token.

    `versions` (the policy version of each completion token, `Sample.versions`) is kept only when given.
    """
    rows = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
    length = max(len(r) for r in rows)
    n = len(rows)
    ids = torch.full((n, length), pad_id, dtype=torch.long)
    attn = torch.zeros((n, length), dtype=torch.long)
    mask = torch.zeros((n, length - 1))
    blp = torch.zeros((n, length - 1))
    ver = torch.full((n, length - 1), -1, dtype=torch.long) if versions is not None else None
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        if not c:
            raise ValueError(f"collate: completion {i} is empty")
        ids[i, : len(rows[i])] = torch.tensor(rows[i])
        attn[i, : len(rows[i])] = 1
        # target position j predicts token j + 1: completion tokens sit at targets len(p)-1 ...
        mask[i, len(p) - 1 : len(p) - 1 + len(c)] = 1
        if behaviour_logp is not None:
            blp[i, len(p) - 1 : len(p) - 1 + len(c)] = torch.tensor(behaviour_logp[i], dtype=torch.float32)
        if ver is not None:
            if len(versions[i]) != len(c):
                raise ValueError(f"collate: versions {i} has {len(versions[i])} entries for {len(c)} tokens")
            ver[i, len(p) - 1 : len(p) - 1 + len(c)] = torch.tensor(versions[i], dtype=torch.long)
    return TokenBatch(ids, attn, ids[:, 1:].clone(), mask, blp, ver)
