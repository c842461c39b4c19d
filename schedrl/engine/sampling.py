"""Batched token sampling with per-request temperature, top-k, top-p and seed.

Sampling uses the Gumbel-max trick: argmax(logits/T + G) with G ~ Gumbel(0, 1)
is an exact draw from softmax(logits/T). The noise of token t of a request is a
counter-based hash of (seed, t, vocabulary id), computed for the whole batch in
a few tensor ops, so a request draws the same tokens whatever else is in the
batch, and a resumed request continues exactly as an uninterrupted one would.

The recorded log-probability is log softmax(logits / T)[token] (log softmax
of the raw logits for greedy), i.e. before top-k / top-p truncation; this is
the quantity a learner recomputes with the same temperature.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from schedrl.types import SamplingParams

_M32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # < 2**27, so every product below stays under 2**63: no int64 overflow


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xorshift-multiply), elementwise on int64 tensors holding values < 2**32."""
    x = x ^ (x >> 16)
    x = (x * _MIX) & _M32
    x = x ^ (x >> 16)
    x = (x * _MIX) & _M32
    return x ^ (x >> 16)


def uniform_noise(seeds: torch.Tensor, index: torch.Tensor, vocab: int) -> torch.Tensor:
    """U(0, 1) noise of shape (R, V), a pure function of (seed, token index, vocabulary id).

    Counter-based, like Philox: no generator state, so the noise of token t of a request
    does not depend on what else is in the batch or on how the request was cut and resumed.
    """
    h = _mix32(seeds & _M32) ^ _mix32((seeds >> 32) & _M32 ^ 0x5BD1E995)  # (R,)
    h = _mix32(h ^ _mix32(index & _M32))
    v = torch.arange(vocab, dtype=torch.long, device=seeds.device) * 0x9E3779B1 & _M32  # (V,)
    bits = _mix32(h[:, None] ^ v[None, :]) >> 8  # 24 random bits, (R, V)
    return (bits.to(torch.float32) + 0.5) * 2.0**-24


def truncate_logits(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set logits outside each row's top-k and top-p nucleus to -inf.  scaled: (R, V)."""
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(scaled.shape[-1], device=scaled.device).expand_as(sorted_logits)
    drop = (top_k[:, None] > 0) & (ranks >= top_k[:, None])
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # mass of strictly more likely tokens
    drop |= mass_before >= top_p[:, None]  # the most likely token is always kept
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(scaled).scatter_(-1, order, sorted_logits)


def sample_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    seeds: Sequence[int],
    token_index: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row.  logits: (R, V); row r samples its token number token_index[r] with seeds[r].

    Returns (tokens (R,), logprobs (R,)).
    """
    logits = logits.float()
    rows, vocab = logits.shape
    dev = logits.device
    temps = [p.temperature if p.temperature > 0 else 1.0 for p in params]
    if temps.count(temps[0]) == rows:  # the usual case: one temperature for the batch
        scaled = logits / temps[0]
    else:
        scaled = logits / torch.tensor(temps, device=dev)[:, None]
    logprobs_all = scaled.log_softmax(dim=-1)
    sampled_rows = [r for r, p in enumerate(params) if not p.greedy]
    every_row = len(sampled_rows) == rows
    # every row sampled: `drawn` below fills them all, so the argmax is skipped
    tokens = torch.empty(rows, dtype=torch.long, device=dev) if every_row else scaled.argmax(dim=-1)
    if sampled_rows:
        idx = None if every_row else torch.tensor(sampled_rows, device=dev)
        sub = scaled if idx is None else scaled[idx]
        if any(params[r].top_k > 0 or params[r].top_p < 1.0 for r in sampled_rows):
            top_k = torch.tensor([params[r].top_k for r in sampled_rows], device=dev)
            top_p = torch.tensor([params[r].top_p for r in sampled_rows], device=dev)
            sub = truncate_logits(sub, top_k, top_p)
        row_seeds = torch.tensor([seeds[r] for r in sampled_rows], dtype=torch.long, device=dev)
        index = torch.tensor([token_index[r] for r in sampled_rows], dtype=torch.long, device=dev)
        noise = uniform_noise(row_seeds, index, vocab)
        gumbel = -(-noise.log()).log()  # G = -log(-log U)
        drawn = (sub + gumbel).argmax(dim=-1)
        if idx is None:
            tokens = drawn
        else:
            tokens[idx] = drawn
    return tokens, logprobs_all.gather(-1, tokens[:, None]).squeeze(-1)
