"""Batched token sampling with per-request temperature, top-k, top-p and seed.

Sampling uses the Gumbel-max trick: argmax(logits/T + G) with G ~ Gumbel(0, 1)
is an exact draw from softmax(logits/T). The noise of token t of a seeded
request comes from a generator seeded with (seed, t), so a request draws the
same tokens whatever else is in the batch, and a resumed request continues
exactly as an uninterrupted one would.

The recorded log-probability is log softmax(logits / T)[token] (log softmax
of the raw logits for greedy), i.e. before top-k / top-p truncation; this is
the quantity a learner recomputes with the same temperature.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from schedrl.types import SamplingParams

_MASK64 = (1 << 63) - 1


def token_seed(seed: int, index: int) -> int:
    """A generator seed for token `index` of a request seeded with `seed`."""
    return (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9 + 1) & _MASK64


def _truncate(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
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
    token_index: Sequence[int],
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row.  logits: (R, V); token_index[r] is how many tokens row r already has.

    Returns (tokens (R,), logprobs (R,)).
    """
    logits = logits.float()
    rows, vocab = logits.shape
    temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=logits.device)
    scaled = logits / temps[:, None]
    logprobs_all = scaled.log_softmax(dim=-1)
    greedy = [p.greedy for p in params]
    tokens = scaled.argmax(dim=-1)
    sampled_rows = [r for r in range(rows) if not greedy[r]]
    if sampled_rows:
        idx = torch.tensor(sampled_rows, device=logits.device)
        sub = scaled[idx]
        if any(params[r].top_k > 0 or params[r].top_p < 1.0 for r in sampled_rows):
            top_k = torch.tensor([params[r].top_k for r in sampled_rows], device=logits.device)
            top_p = torch.tensor([params[r].top_p for r in sampled_rows], device=logits.device)
            sub = _truncate(sub, top_k, top_p)
        noise = torch.empty(len(sampled_rows), vocab)
        row_gen = torch.Generator()
        for j, r in enumerate(sampled_rows):
            seed = params[r].seed
            if seed is None:
                noise[j] = torch.rand(vocab, generator=generator)
            else:
                row_gen.manual_seed(token_seed(seed, token_index[r]))
                noise[j] = torch.rand(vocab, generator=row_gen)
        noise = noise.clamp_(1e-10, 1.0 - 1e-7).to(logits.device)
        gumbel = -(-noise.log()).log()  # G = -log(-log U)
        tokens[idx] = (sub + gumbel).argmax(dim=-1)
    return tokens, logprobs_all.gather(-1, tokens[:, None]).squeeze(-1)
