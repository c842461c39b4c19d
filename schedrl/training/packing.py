"""Padding-free forward passes: several sequences share one row of the model's input.

A right-padded batch (B, L) spends compute on its padding: on 1-digit addition about 30% of
the tokens a learner forward sees. Packing places whole sequences back to back in rows of
`width` tokens (first-fit decreasing), with position ids restarting at 0 for each sequence and
no attention mask; transformers then attends within each sequence only (it reads the
sequence boundaries from the position ids). Outputs are scattered back to (B, L, ...), so the
losses never see the packing. verl calls this `use_remove_padding`, TRL `padding_free`.

Shared prefixes (`pack_shared`, GRPO prefix reuse): the G samples of a group start with the
same prompt, and a forward over identical tokens at identical positions gives identical keys,
values and logits. So the prompt goes into a row once, followed by the completions of its
rows, each numbered from the prompt's end and attending to the prompt and to itself only (a
4D attention mask). Each row's prompt logits are read from the one copy, and in the backward
its gradient collects every row's share, as G separate copies would. On 1-digit addition
(prompts of ~5 tokens, completions of ~2) this forwards ~2.3x fewer tokens than `pack`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

PACK_WIDTH = 64  # tokens per packed row, unless the longest sequence is longer


@dataclass(frozen=True)
class Packing:
    """Where each real token of a (B, L) batch sits in the packed (R, W) rows."""

    input_ids: Tensor  # (R, W) sequences back to back, padding at the end of a row
    position_ids: Tensor  # (R, W) restarting at 0 for every sequence (and for a row's padding)
    src: Tensor  # (N,) flat index in (R * W) of each real token (repeated for a shared prefix) ...
    dst: Tensor  # (N,) ... and its flat index in (B * L)
    batch_shape: tuple[int, int]  # (B, L)
    # shared prefixes: the unit of each position (a padding position is a unit of its own) and its
    # segment in the unit (0: the prefix, k: the k-th completion), (R, W) each; None for `pack`
    unit_ids: Tensor | None = None
    segment_ids: Tensor | None = None

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]

    @property
    def attention_mask(self) -> Tensor | None:
        """(R, 1, W, W) bool, True where a query may attend (shared prefixes only), built where the ids are:
        a key in the same unit, not after the query, and in the prefix or in the query's own segment."""
        if self.unit_ids is None:
            return None
        unit, seg = self.unit_ids, self.segment_ids
        if seg is None:
            raise ValueError("a shared-prefix packing carries both unit_ids and segment_ids")
        cols = torch.arange(unit.shape[1], device=unit.device)
        allowed = (
            (unit[:, :, None] == unit[:, None, :])
            & (cols[:, None] >= cols[None, :])
            & ((seg[:, None, :] == 0) | (seg[:, :, None] == seg[:, None, :]))
        )
        return allowed[:, None]

    @property
    def saves_tokens(self) -> bool:
        """Whether the packed rows hold fewer tokens than the padded batch."""
        return self.input_ids.numel() < self.batch_shape[0] * self.batch_shape[1]

    def to(self, device: torch.device) -> Packing:
        return Packing(
            self.input_ids.to(device),
            self.position_ids.to(device),
            self.src.to(device),
            self.dst.to(device),
            self.batch_shape,
            self.unit_ids.to(device) if self.unit_ids is not None else None,
            self.segment_ids.to(device) if self.segment_ids is not None else None,
        )

    def model_inputs(self, dtype: torch.dtype) -> dict[str, Tensor]:
        """Keyword arguments of the model's forward; a 4D mask goes in additive (0 or the dtype's minimum),
        which HF's eager and SDPA attention both take as given."""
        kw = {"input_ids": self.input_ids, "position_ids": self.position_ids}
        m = self.attention_mask
        if m is not None:
            kw["attention_mask"] = torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(
                ~m, torch.finfo(dtype).min
            )
        return kw

    def unpack(self, x: Tensor) -> Tensor:
        """(R, W, ...) -> (B, L, ...), zeros at the padding; differentiable."""
        b, length = self.batch_shape
        tail = x.shape[2:]
        out = x.new_zeros(b * length, *tail)
        out[self.dst] = x.reshape(-1, *tail)[self.src]
        return out.view(b, length, *tail)


def pack(input_ids: Tensor, attention_mask: Tensor, pad_id: int = 0, width: int = PACK_WIDTH) -> Packing:
    """Pack the right-padded rows of `input_ids` (B, L) into rows of max(width, longest) tokens
    (fewer when all fit in one row).

    `pad_id` fills the end of each row; those positions form a sequence of their own, so any
    token id works. CPU tensors in and out; `Packing.to` moves the result.
    """
    lens = _lengths(attention_mask, "pack")
    return _build_plain(input_ids, lens, _plan(lens, width), pad_id)


def pack_shared(
    input_ids: Tensor, attention_mask: Tensor, prefix_lens: Tensor, pad_id: int = 0, width: int = PACK_WIDTH
) -> Packing:
    """As `pack`, but rows whose first `prefix_lens[i]` tokens are equal forward them once.

    A unit is one prefix followed by the completions (the rest) of some of its rows, at most
    max(width, 2 x the longest row) tokens, so that a unit holds a prompt and at least two of its
    completions; a group too long for one unit repeats its prefix in the next.
    Units are packed first-fit decreasing. Position ids number each completion from its prefix's
    end; the mask lets a prefix token see the earlier tokens of its prefix, and a completion token
    its prefix and the earlier tokens of its own completion. A row's padding sees only itself.
    Any `prefix_lens` is exact (a shorter one shares less); each is clamped to [1, row length].
    """
    lens = _lengths(attention_mask, "pack_shared")
    rows_ids = input_ids.tolist()
    units, plan = _plan_shared(rows_ids, lens, prefix_lens.tolist(), width)
    return _build_shared(input_ids.shape, input_ids.dtype, rows_ids, lens, units, plan, pad_id)


def pack_fewest(
    input_ids: Tensor,
    attention_mask: Tensor,
    prefix_lens: Tensor | None = None,
    pad_id: int = 0,
    width: int = PACK_WIDTH,
) -> Packing:
    """`pack`, or `pack_shared` when `prefix_lens` is given and its rows hold fewer tokens (distinct
    prompts share nothing, and its wider rows can leave more padding). Only the chosen one is built."""
    lens = _lengths(attention_mask, "pack_fewest")
    plain = _plan(lens, width)
    if prefix_lens is not None:
        rows_ids = input_ids.tolist()
        units, shared = _plan_shared(rows_ids, lens, prefix_lens.tolist(), width)
        if shared.tokens < plain.tokens:
            return _build_shared(input_ids.shape, input_ids.dtype, rows_ids, lens, units, shared, pad_id)
    return _build_plain(input_ids, lens, plain, pad_id)


class _Plan(NamedTuple):
    """Items placed in rows of `width` tokens: each item's row and offset, and the tokens used per row."""

    width: int
    row: list[int]
    offset: list[int]
    used: list[int]

    @property
    def tokens(self) -> int:
        return len(self.used) * self.width


def _plan(sizes: list[int], width: int) -> _Plan:
    """First-fit decreasing into rows of `width`, widened to the longest item, or narrowed to all items
    together when they fit one row."""
    width = max(min(width, sum(sizes)), *sizes)
    row, offset, used = [0] * len(sizes), [0] * len(sizes), []
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        r = next((r for r, u in enumerate(used) if u + sizes[i] <= width), len(used))
        if r == len(used):
            used.append(0)
        row[i], offset[i] = r, used[r]
        used[r] += sizes[i]
    return _Plan(width, row, offset, used)


def _plan_shared(
    rows_ids: list[list[int]], lens: list[int], prefix_lens: list[int], width: int
) -> tuple[list[tuple[tuple[int, ...], list[int]]], _Plan]:
    """The units of `pack_shared` (prefix, rows whose completions follow it) and their placement."""
    width = max(width, 2 * max(lens))
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prefix_lens):
        groups.setdefault(tuple(rows_ids[i][: min(max(int(p), 1), lens[i])]), []).append(i)
    units: list[tuple[tuple[int, ...], list[int]]] = []
    sizes: list[int] = []
    for prefix, members in groups.items():
        units.append((prefix, []))
        sizes.append(len(prefix))
        for i in members:
            rest = lens[i] - len(prefix)
            if units[-1][1] and sizes[-1] + rest > width:
                units.append((prefix, []))
                sizes.append(len(prefix))
            units[-1][1].append(i)
            sizes[-1] += rest
    return units, _plan(sizes, width)


def _build_plain(input_ids: Tensor, lens: list[int], plan: _Plan, pad_id: int) -> Packing:
    b, length = input_ids.shape
    width = plan.width
    src, dst, t = [], [], []
    for i, n in enumerate(lens):
        at = plan.row[i] * width + plan.offset[i]
        src += range(at, at + n)
        dst += range(i * length, i * length + n)
        t += range(n)
    src, dst, t = torch.tensor(src, dtype=torch.long), torch.tensor(dst, dtype=torch.long), torch.tensor(t)
    cols, tail = torch.arange(width), torch.tensor(plan.used)[:, None]
    pos = torch.where(cols >= tail, cols - tail, 0).flatten()  # a row's padding is a sequence of its own
    pos[src] = t
    ids = torch.full((plan.tokens,), pad_id, dtype=input_ids.dtype)
    ids[src] = input_ids.flatten()[dst]
    return Packing(ids.view(-1, width), pos.view(-1, width), src, dst, (b, length))


def _build_shared(shape, dtype, rows_ids, lens, units, plan: _Plan, pad_id: int) -> Packing:
    (b, length), width, n = shape, plan.width, plan.tokens
    ids, pos, seg = [pad_id] * n, [0] * n, [0] * n
    unit = list(range(-1, -1 - n, -1))  # padding: a unit of its own per position
    src, dst = [], []
    for u, (prefix, members) in enumerate(units):
        start, p = plan.row[u] * width + plan.offset[u], len(prefix)
        ids[start : start + p], pos[start : start + p], unit[start : start + p] = prefix, range(p), [u] * p
        at = start + p
        for k, i in enumerate(members, start=1):
            end = at + lens[i] - p
            ids[at:end], pos[at:end] = rows_ids[i][p : lens[i]], range(p, lens[i])
            unit[at:end], seg[at:end] = [u] * (end - at), [k] * (end - at)
            src += [*range(start, start + p), *range(at, end)]
            dst += range(i * length, i * length + lens[i])
            at = end
    rows2d = lambda x, dt=torch.long: torch.tensor(x, dtype=dt).view(-1, width)  # noqa: E731
    return Packing(
        rows2d(ids, dtype),
        rows2d(pos),
        torch.tensor(src),
        torch.tensor(dst),
        (b, length),
        rows2d(unit),
        rows2d(seg),
    )


def _lengths(attention_mask: Tensor, caller: str) -> list[int]:
    """Tokens per row of a right-padded mask (B, L)."""
    length = attention_mask.shape[1]
    lengths = attention_mask.sum(-1)
    bad = (attention_mask.bool() != (torch.arange(length)[None, :] < lengths[:, None])).any(-1).nonzero()
    if len(bad):
        r = int(bad[0])
        raise ValueError(
            f"{caller}: attention_mask must be right-padded (each row: ones, then zeros); "
            f"row {r} is {attention_mask[r].tolist()}"
        )
    return lengths.tolist()
