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
        return TokenBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.targets.to(device),
            self.mask.to(device),
            self.behaviour_logp.to(device),
            self.versions.to(device) if self.versions is not None else None,
        )


def prompt_groups(batch: TokenBatch) -> torch.Tensor:
    """Group label (B,) per row: rows with the same prompt tokens (those before the completion) share one.

    Labels count from 0 in order of first appearance; two tasks with identical prompts share a group.
    """
    labels: dict[tuple[int, ...], int] = {}
    out = [
        labels.setdefault(tuple(row[:n]), len(labels))
        for row, n in zip(batch.input_ids.tolist(), prompt_lengths(batch).tolist(), strict=True)
    ]
    return torch.tensor(out, dtype=torch.long)


def prompt_lengths(batch: TokenBatch) -> torch.Tensor:
    """(B,) tokens before each row's first completion token (1 for a row whose mask is all zero)."""
    return batch.mask.bool().to(torch.int8).argmax(dim=-1) + 1  # first completion target = len(prompt) - 1


def target_rows(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    values: Sequence[Sequence[float | int]],
    fill: float | int = 0.0,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """(B, L-1): one value per completion token, at the target positions `collate` puts it (e.g. a
    per-token advantage for the learner); `fill` elsewhere."""
    length = max(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))
    out = []
    for i, (p, c, v) in enumerate(zip(prompts, completions, values, strict=True)):
        if len(v) != len(c):
            raise ValueError(f"target_rows: row {i} has {len(v)} values for {len(c)} tokens")
        out.append([fill] * (len(p) - 1) + list(v) + [fill] * (length - len(p) - len(c)))
    return torch.tensor(out, dtype=dtype)


def collate(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    behaviour_logp: Sequence[Sequence[float]] | None = None,
    versions: Sequence[Sequence[int]] | None = None,
    train_mask: Sequence[Sequence[bool] | None] | None = None,
) -> TokenBatch:
    """Build a `TokenBatch`; every completion must hold at least one token.

    `versions` (the policy version of each completion token, `Sample.versions`) is kept only when given.
    `train_mask` (per completion token: trained, or context only; None for a row trains every token)
    zeroes the loss mask of the context tokens (tool and environment tokens, stale tokens).
    """
    rows = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
    for i, c in enumerate(completions):
        if not c:
            raise ValueError(f"collate: completion {i} is empty")
        for name, per_token in (
            ("behaviour_logp", behaviour_logp),
            ("versions", versions),
            ("train_mask", train_mask),
        ):
            row = per_token[i] if per_token is not None else None
            if row is not None and len(row) != len(c):
                raise ValueError(f"collate: {name} {i} has {len(row)} entries for {len(c)} tokens")
    length = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad_id] * (length - len(r)) for r in rows], dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows])
    attn = (torch.arange(length)[None, :] < lengths[:, None]).long()
    # target position j predicts token j + 1: completion tokens sit at targets len(p)-1 ... len(row)-2
    first = torch.tensor([len(p) - 1 for p in prompts])
    targets = torch.arange(length - 1)[None, :]
    mask = ((targets >= first[:, None]) & (targets < lengths[:, None] - 1)).float()

    def per_target(
        values: Sequence[Sequence[float | int]], fill: float | int, dtype: torch.dtype
    ) -> torch.Tensor:
        return target_rows(prompts, completions, values, fill, dtype)

    blp = (
        per_target(behaviour_logp, 0.0, torch.float32)
        if behaviour_logp is not None
        else torch.zeros(mask.shape)
    )
    ver = per_target(versions, -1, torch.long) if versions is not None else None
    if train_mask is not None:
        rows_mask = [
            list(m) if m is not None else [True] * len(c)
            for m, c in zip(train_mask, completions, strict=True)
        ]
        mask = mask * per_target(rows_mask, 0, torch.float32)
    return TokenBatch(ids, attn, ids[:, 1:].clone(), mask, blp, ver)
