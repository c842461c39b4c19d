"""Padding-free forward passes: several sequences share one row of the model's input.

A right-padded batch (B, L) spends compute on its padding: on 1-digit addition about 30% of
the tokens a learner forward sees. Packing places whole sequences back to back in rows of
`width` tokens (first-fit decreasing), with position ids restarting at 0 for each sequence and
no attention mask; transformers then attends within each sequence only (it reads the
sequence boundaries from the position ids). Outputs are scattered back to (B, L, ...), so the
losses never see the packing. verl calls this `use_remove_padding`, TRL `padding_free`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

PACK_WIDTH = 64  # tokens per packed row, unless the longest sequence is longer


@dataclass(frozen=True)
class Packing:
    """Where each real token of a (B, L) batch sits in the packed (R, W) rows."""

    input_ids: Tensor  # (R, W) sequences back to back, padding at the end of a row
    position_ids: Tensor  # (R, W) restarting at 0 for every sequence (and for a row's padding)
    src: Tensor  # (N,) flat index in (R * W) of each real token ...
    dst: Tensor  # (N,) ... and its flat index in (B * L)
    batch_shape: tuple[int, int]  # (B, L)

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device) -> Packing:
        return Packing(self.input_ids.to(device), self.position_ids.to(device), self.src.to(device),
                       self.dst.to(device), self.batch_shape)  # fmt: skip

    def unpack(self, x: Tensor) -> Tensor:
        """(R, W, ...) -> (B, L, ...), zeros at the padding; differentiable."""
        b, length = self.batch_shape
        tail = x.shape[2:]
        out = x.new_zeros(b * length, *tail)
        out[self.dst] = x.reshape(-1, *tail)[self.src]
        return out.view(b, length, *tail)


def pack(input_ids: Tensor, attention_mask: Tensor, pad_id: int = 0, width: int = PACK_WIDTH) -> Packing:
    """Pack the right-padded rows of `input_ids` (B, L) into rows of max(width, longest) tokens.

    `pad_id` fills the end of each row; those positions form a sequence of their own, so any
    token id works. CPU tensors in and out; `Packing.to` moves the result.
    """
    b, length = input_ids.shape
    lengths = attention_mask.sum(-1)
    bad = (attention_mask.bool() != (torch.arange(length)[None, :] < lengths[:, None])).any(-1).nonzero()
    if len(bad):
        r = int(bad[0])
        raise ValueError(f"pack: attention_mask must be right-padded (each row: ones, then zeros); "
                         f"row {r} is {attention_mask[r].tolist()}")  # fmt: skip
    lens = lengths.tolist()
    width = max([width, *lens])
    row, offset, used = [0] * b, [0] * b, []  # each sequence's row and offset; tokens used per row
    for i in sorted(range(b), key=lambda i: -lens[i]):  # first-fit decreasing
        r = next((r for r, u in enumerate(used) if u + lens[i] <= width), len(used))
        if r == len(used):
            used.append(0)
        row[i], offset[i] = r, used[r]
        used[r] += lens[i]
    src, dst, t = [], [], []
    for i, n in enumerate(lens):
        at = row[i] * width + offset[i]
        src += range(at, at + n)
        dst += range(i * length, i * length + n)
        t += range(n)
    src, dst, t = torch.tensor(src, dtype=torch.long), torch.tensor(dst, dtype=torch.long), torch.tensor(t)
    cols, tail = torch.arange(width), torch.tensor(used)[:, None]
    pos = torch.where(cols >= tail, cols - tail, 0).flatten()  # a row's padding is a sequence of its own
    pos[src] = t
    ids = torch.full((len(used) * width,), pad_id, dtype=input_ids.dtype)
    ids[src] = input_ids.flatten()[dst]
    return Packing(ids.view(-1, width), pos.view(-1, width), src, dst, (b, length))
