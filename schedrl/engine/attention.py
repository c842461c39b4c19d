"""Packed attention over a slot KV cache, plugged into HF models through `AttentionInterface`.

One engine step runs one forward over a packed sequence (1, N) holding every
running request's new tokens: one token per decoding request, the whole prompt
(plus any resumed prefix) of a newly admitted one, the appended tokens of a request
that extends a parked one (a tool's answer after a pinned turn). Each request owns a
slot in a preallocated cache of shape (slots, kv_heads, max_len, head_dim) per layer.
This function writes the step's keys and values into the slots, then attends in
four groups: single-token rows against their slots' cached keys in one batched
call padded to the longest of them, single-token rows with long histories one by one over
exactly their keys (a view of the slot, no padding), multi-token (prefill) rows from position 0 with a causal mask over this
step's keys, and extension rows (several tokens after a cached history) against
their slots' cache with a causal mask offset by the history. No HF `Cache` object is
involved, so any HF decoder whose attention goes through `ALL_ATTENTION_FUNCTIONS`
(Llama, Qwen2, Mistral, ...) runs unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ATTN_NAME = "schedrl_packed"
LAYOUT_KWARG = "schedrl_layout"


@dataclass
class StepLayout:
    """Where each packed token of one step lives, and which keys each query may see."""

    cache: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: K, V of shape (S, Hkv, T, D)
    slot_idx: torch.Tensor  # (N,) slot of each packed token
    pos_idx: torch.Tensor  # (N,) position of each packed token in its sequence
    dec_tok: torch.Tensor | None = None  # (Bd,) packed index of each single-token row
    dec_slot: torch.Tensor | None = None  # (Bd,) its slot
    # (Bd or S, 1, 1, Ld) additive mask: 0 where a row may look, -inf not
    dec_mask: torch.Tensor | None = None
    dec_full: bool = False  # attend over the first S' slots (a view) instead of gathering Bd of them
    pre_tok: torch.Tensor | None = None  # (Bp, Lq) packed indices of multi-token rows, padded
    pre_src: torch.Tensor | None = None  # real query positions in the flattened (Bp * Lq) block ...
    pre_dst: torch.Tensor | None = None  # ... and the packed index each one writes back to
    pre_mask: torch.Tensor | None = None  # (Bp, 1, Lq, Lq) additive causal mask
    copy_dst: torch.Tensor | None = None  # slots of rows left out of this forward: twins of another row ...
    copy_src: torch.Tensor | None = None  # ... the slots whose first `copy_len` cached positions they copy
    copy_len: int = 0
    ext_tok: torch.Tensor | None = None  # (Be, Lq) packed indices of extension rows, padded
    ext_slot: torch.Tensor | None = None  # (Be,) their slots
    ext_src: torch.Tensor | None = None  # real query positions in the flattened (Be * Lq) block ...
    ext_dst: torch.Tensor | None = None  # ... and the packed index each one writes back to
    ext_mask: torch.Tensor | None = (
        None  # (Be, 1, Lq, Lk) additive mask: a query sees keys up to its position
    )
    # decode rows with long histories, each attending alone over exactly its keys: (packed index, slot,
    # keys). A view of the slot's cache, no copy and no padding: one long row no longer makes every row
    # of the batch attend over its length
    long_rows: list[tuple[int, int, int]] = field(default_factory=list)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float | None
) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v for q (B, H, Lq, D), k and v (B, Hkv, Lk, D), mask broadcast to (B, H, Lq, Lk).

    Two batched matmuls instead of `scaled_dot_product_attention`: an engine step's blocks are
    short (one query row, or a prompt of a few tokens), where the fused CPU kernel's set-up costs
    more than the work: 165 vs 249 us for 128 decode rows over 13 keys, 0.39 vs 1.9 ms for 128
    prompts of 5 tokens (2 cores). The result equals SDPA's up to float rounding (tested)."""
    if k.shape[1] != q.shape[1]:  # grouped-query attention: each key/value head serves several query heads
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scores = q @ k.transpose(-1, -2)
    scores.mul_(q.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None:
        scores.add_(mask)
    return scores.softmax(-1) @ v


def packed_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, **kwargs):
    """query: (1, H, N, D); key, value: (1, Hkv, N, D). Returns ((1, N, H, D), None). A forward
    outside the engine's steps (no layout: the weight-push probe) is plain causal attention."""
    layout: StepLayout | None = kwargs.get(LAYOUT_KWARG)
    if layout is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=0.0)
    kc, vc = layout.cache[module.layer_idx]
    kc[layout.slot_idx, :, layout.pos_idx] = key[0].transpose(0, 1).to(kc.dtype)
    vc[layout.slot_idx, :, layout.pos_idx] = value[0].transpose(0, 1).to(vc.dtype)
    q = query[0].transpose(0, 1)  # (N, H, D)
    out = torch.empty_like(q)
    if layout.dec_tok is not None and layout.dec_mask is not None:
        length = layout.dec_mask.shape[-1]
        if layout.dec_full:  # the first S' slots attend (a view); rows of idle slots are computed and dropped
            n_slots = layout.dec_mask.shape[0]
            qs = q.new_zeros(n_slots, q.shape[1], 1, q.shape[2])
            qs[layout.dec_slot, :, 0] = q[layout.dec_tok]
            o = _attend(qs, kc[:n_slots, :, :length], vc[:n_slots, :, :length], layout.dec_mask, scaling)
            out[layout.dec_tok] = o[layout.dec_slot, :, 0]
        else:
            qs = q[layout.dec_tok].unsqueeze(2)  # (Bd, H, 1, D)
            ks, vs = kc[layout.dec_slot, :, :length], vc[layout.dec_slot, :, :length]
            o = _attend(qs, ks, vs, layout.dec_mask, scaling)
            out[layout.dec_tok] = o[:, :, 0]
    for tok, slot, length in layout.long_rows:
        ks, vs = kc[slot : slot + 1, :, :length], vc[slot : slot + 1, :, :length]  # (1, Hkv, L, D) views
        out[tok] = _attend(q[tok : tok + 1, :, None], ks, vs, None, scaling)[0, :, 0]
    if layout.pre_tok is not None and layout.pre_mask is not None:
        # Multi-token rows are whole prompts starting at position 0: their keys are this step's keys.
        qp = q[layout.pre_tok].transpose(1, 2)  # (Bp, H, Lq, D)
        kp, vp = key[0][:, layout.pre_tok].transpose(0, 1), value[0][:, layout.pre_tok].transpose(0, 1)
        o = _attend(qp, kp, vp, layout.pre_mask, scaling)
        out[layout.pre_dst] = o.transpose(1, 2).reshape(-1, *o.shape[1:2], o.shape[3])[layout.pre_src]
    if layout.ext_tok is not None and layout.ext_mask is not None:
        # Tokens after a cached history: their keys were just written into the slot beside the history's.
        length = layout.ext_mask.shape[-1]
        qe = q[layout.ext_tok].transpose(1, 2)  # (Be, H, Lq, D)
        ke, ve = kc[layout.ext_slot, :, :length], vc[layout.ext_slot, :, :length]
        o = _attend(qe, ke, ve, layout.ext_mask, scaling)
        out[layout.ext_dst] = o.transpose(1, 2).reshape(-1, *o.shape[1:2], o.shape[3])[layout.ext_src]
    return out.unsqueeze(0), None


AttentionInterface.register(ATTN_NAME, packed_attention)
