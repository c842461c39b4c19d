"""Speculative prefix reuse (SPEC-RL): last epoch's rollout of a task drafts this epoch's.

For each request with a draft (the last sample of the same task and sample index), one
forward of the current policy over prompt + draft gives p_cur at every draft position.
Draft token x_t, sampled from the draft policy q, is accepted with probability
min(1, p_cur(x_t) / q(x_t)), q(x_t) read from the draft's stored behaviour log-probs. At
the first rejection the next token is drawn from the residual norm(max(0, p_cur - q)).
This is speculative sampling (Leviathan et al., 2023; Chen et al., 2023): every output
token, accepted or drawn from the residual, is an exact draw from p_cur given its prefix,
so the reused rollout has the current policy's distribution. The accepted prefix (plus the
residual token) goes back to the engine as a resumed `Request`, or is already complete
when it ends in a stop token or fills `max_new_tokens`.

What the rule needs, and the restrictions that follow:
* p_cur is the distribution the engine would sample from: softmax(logits / T) after the
  request's own top-k / top-p truncation (the same `truncate_logits`); greedy is a point mass
  on the argmax, so greedy verification accepts exactly the tokens greedy decoding emits.
* q(x_t) from the stored log-probs is exact only for drafts sampled without truncation
  (the engine stores log softmax(logits / T) before top-k / top-p); a greedy draft is a
  point mass (q(x_t) = 1). A draft sampled with top-k or top-p needs `draft_model`.
* The residual needs all of q at the rejected position, which stored log-probs do not
  hold: for sampled drafts pass `draft_model`, the policy that generated them (one more
  forward, over the rejected rows only); for greedy drafts q is the point mass.
* The draft's stop rules (stop tokens, stop strings, ignore_eos) must equal the request's,
  so a token the draft continued past is not a stop for the request either.
* `draft_model` must be the exact weights that sampled the drafts: a draft whose tokens span
  an in-flight weight swap (several versions) has no single q and should not be reused.
Kept tokens carry the current policy's behaviour log-probs and version, as if it had sampled
them (it has, in distribution). The forward packs the drafts of one prompt into one row (the
prompt once, each draft masked to the prompt and itself), so a group's prompt is computed once.
SPEC-RL's lenience factor (accepting with min(1, l * p/q), l > 1) trades exactness for
speed and is left out.

References: SPEC-RL (Liu et al., 2025, "SPEC-RL: Accelerating On-Policy Reinforcement
Learning via Speculative Rollouts").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

# the engine's own truncation: p_cur must match it exactly
from schedrl.engine.sampling import truncate_logits
from schedrl.types import Request, Sample, SamplingParams, Timings


@dataclass
class SpecStats:
    drafts: int = 0  # requests that had a draft
    draft_tokens: int = 0  # draft tokens offered for verification
    accepted: int = 0  # draft tokens accepted
    rejected: int = 0  # drafts cut at a rejected token (one rejection each)
    completed: int = 0  # requests finished by verification alone, without the engine

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.draft_tokens if self.draft_tokens else 0.0

    def add(self, other: SpecStats) -> None:
        for f in ("drafts", "draft_tokens", "accepted", "rejected", "completed"):
            setattr(self, f, getattr(self, f) + getattr(other, f))


class DraftStore:
    """The last finished sample of each (task, sample index): next epoch's drafts."""

    def __init__(self) -> None:
        self._drafts: dict[tuple[str, int], Sample] = {}

    def put(self, samples: Sequence[Sample]) -> None:
        for s in samples:
            if s.task_id is not None and s.finish_reason in ("stop", "length") and s.num_tokens:
                self._drafts[(s.task_id, s.sample_index)] = s

    def get(self, request: Request) -> Sample | None:
        if request.task_id is None or request.prefix_ids:
            return None
        return self._drafts.get((request.task_id, request.sample_index))

    def drop_before(self, version: int) -> None:
        """Forget drafts with a token older than `version` (they will not be used): bounds memory."""
        self._drafts = {k: s for k, s in self._drafts.items() if min(s.versions, default=version) >= version}

    def __len__(self) -> int:
        return len(self._drafts)


def _stop_rules(p: SamplingParams) -> tuple:
    return p.stop_token_ids, p.stop_strings, p.ignore_eos


def _truncated(p: SamplingParams) -> bool:
    return not p.greedy and (p.top_k > 0 or p.top_p < 1.0)


def _draft_logits(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    drafts: Sequence[Sequence[int]],
    max_tokens: int = 16384,
    max_row: int = 256,
) -> list[torch.Tensor]:
    """Logits (n_i, V) at the positions that predict draft i's tokens 0..n_i-1, as float.

    Drafts with the same prompt (the samples of one group) share one packed row: the prompt once, then
    each draft, with positions restarting after the prompt and a mask that lets a draft see the prompt
    and its own earlier tokens only. So the prompt is computed once per row of up to `max_row` tokens,
    and rows of similar length are batched, at most `max_tokens` padded tokens per forward.
    """
    packs: dict[tuple[int, ...], list[int]] = {}
    for i, prompt in enumerate(prompts):
        packs.setdefault(tuple(prompt), []).append(i)
    rows = []  # (prompt, members, total length); a row holds at most max_row tokens unless one draft is longer
    for prompt, members in packs.items():
        row, size = [], len(prompt)
        for i in members:
            if row and size + len(drafts[i]) > max_row:
                rows.append((prompt, row, size))
                row, size = [], len(prompt)
            row.append(i)
            size += len(drafts[i])
        rows.append((prompt, row, size))
    rows.sort(key=lambda r: r[2])
    out: list[torch.Tensor] = [torch.empty(0)] * len(prompts)
    dev = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    k = 0
    while k < len(rows):
        n, real = 1, rows[k][2]
        while k + n < len(rows):  # grow the batch while padding stays under a quarter of its tokens
            padded, real_next = rows[k + n][2] * (n + 1), real + rows[k + n][2]
            if padded > max_tokens or padded > 1.25 * real_next:
                break
            n, real = n + 1, real_next
        batch, k = rows[k : k + n], k + n
        width = batch[-1][2]
        ids = torch.zeros(n, width, dtype=torch.long)
        pos = torch.zeros(n, width, dtype=torch.long)
        seg = torch.full((n, width), -2, dtype=torch.long)  # -1: prompt, j: draft j of the row, -2: padding
        for r, (prompt, members, _) in enumerate(batch):
            at = len(prompt)
            ids[r, :at], pos[r, :at], seg[r, :at] = torch.tensor(prompt), torch.arange(at), -1
            for j, i in enumerate(members):
                m = len(drafts[i])
                ids[r, at : at + m] = torch.tensor(list(drafts[i]))
                pos[r, at : at + m] = torch.arange(len(prompt), len(prompt) + m)
                seg[r, at : at + m] = j
                at += m
        q, kv = seg[:, :, None], seg[:, None, :]
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        allowed = causal & ((kv == -1) | (kv == q)) & (q != -2)
        allowed |= torch.eye(width, dtype=torch.bool)  # padding attends to itself: no empty softmax rows
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
        with torch.inference_mode():
            logits = (
                model(input_ids=ids.to(dev), position_ids=pos.to(dev), attention_mask=mask[:, None].to(dev))
                .logits.float()
                .cpu()
            )
        for r, (prompt, members, _) in enumerate(batch):
            at = len(prompt)
            for i in members:
                m = len(drafts[i])
                # token 0 is predicted at the prompt's last position, token t > 0 at draft token t - 1
                out[i] = torch.cat([logits[r, len(prompt) - 1 : len(prompt)], logits[r, at : at + m - 1]])
                at += m
    return out


def _sampling_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """(T, V) -> (T, V): the distribution the engine samples from under `p`."""
    if p.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    scaled = logits / p.temperature
    if _truncated(p):
        n = scaled.shape[0]
        scaled = truncate_logits(scaled, torch.full((n,), p.top_k), torch.full((n,), float(p.top_p)))
    return scaled.softmax(-1)


def _behaviour_logprobs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """What the engine records per token: log softmax(logits / T), before truncation."""
    return (logits / (p.temperature if p.temperature > 0 else 1.0)).log_softmax(-1)


def _is_stop(tokens: list[int], p: SamplingParams, eos_ids: frozenset[int], tokenizer: Any) -> bool:
    tok = tokens[-1]
    if (tok in eos_ids and not p.ignore_eos) or tok in p.stop_token_ids:
        return True
    if p.stop_strings:
        width = max(len(s) for s in p.stop_strings) + 8
        tail = tokenizer.decode(tokens[-width:], skip_special_tokens=True)
        return any(s in tail for s in p.stop_strings)
    return False


def verify_drafts(
    model: torch.nn.Module,
    requests: Sequence[Request],
    drafts: Sequence[Sample | None],
    *,
    eos_ids: frozenset[int],
    tokenizer: Any = None,
    draft_model: torch.nn.Module | None = None,
    version: int = 0,
    seed: int = 0,
) -> tuple[list[Sample | Request], SpecStats]:
    """Verify each request's draft against `model`; returns, per request, a finished `Sample` or the
    `Request` to run (resumed from the accepted prefix, or unchanged without a draft), and counts."""
    if len(requests) != len(drafts):
        raise ValueError(f"verify_drafts: {len(requests)} requests but {len(drafts)} drafts")
    gen = torch.Generator().manual_seed(seed)
    stats = SpecStats()
    out: list[Sample | Request] = list(requests)
    present = {b: d for b, d in enumerate(drafts) if d is not None}
    rows = list(present)
    for b in rows:
        req, d = requests[b], present[b]
        if d.prompt_ids != req.prompt_ids:
            raise ValueError(f"verify_drafts: the draft of request {req.id!r} has a different prompt")
        if _stop_rules(d.params) != _stop_rules(req.params):
            raise ValueError(f"verify_drafts: the draft of request {req.id!r} has other stop rules")
        if _truncated(d.params) and draft_model is None:
            raise ValueError(
                f"verify_drafts: the draft of request {req.id!r} was sampled with top-k/top-p "
                "(stored log-probs are before truncation); pass draft_model"
            )
        if req.prefix_ids:
            raise ValueError(f"verify_drafts: request {req.id!r} already has a prefix")
        if req.params.stop_strings and tokenizer is None:
            raise ValueError(f"verify_drafts: request {req.id!r} has stop strings; pass tokenizer")
    if not rows:
        return out, stats
    draft_toks = {b: list(present[b].token_ids[: requests[b].params.max_new_tokens]) for b in rows}
    prompts = [requests[b].prompt_ids for b in rows]
    logits = _draft_logits(model, prompts, [draft_toks[b] for b in rows])  # the one forward of the policy
    q_full = {}
    if draft_model is not None and any(_truncated(present[b].params) for b in rows):
        q_logits = _draft_logits(draft_model, prompts, [draft_toks[b] for b in rows])
        q_full = {b: q_logits[k] for k, b in enumerate(rows)}
    rejected: dict[int, int] = {}  # row -> position of the first rejected draft token
    for k, b in enumerate(rows):
        req, d, toks = requests[b], present[b], draft_toks[b]
        n = len(toks)
        p = _sampling_probs(logits[k], req.params)  # (n, V)
        x = torch.tensor(toks)
        p_x = p.gather(-1, x[:, None]).squeeze(-1)
        if d.params.greedy:
            q_x = torch.ones(n)
        elif b in q_full:
            q_x = _sampling_probs(q_full[b], d.params).gather(-1, x[:, None]).squeeze(-1)
        else:
            q_x = torch.tensor(d.logprobs[:n]).exp()
        u = torch.rand(n, generator=gen)
        # accept x_t with probability min(1, p(x_t) / q(x_t))
        bad = (u * q_x >= p_x).nonzero()
        stats.drafts += 1
        stats.draft_tokens += n
        if len(bad):
            rejected[b] = int(bad[0])
            stats.accepted += rejected[b]
            stats.rejected += 1
        else:
            stats.accepted += n
    residual_q = _residual_q(
        draft_model, requests, present, draft_toks, rejected, q_full, logits[0].shape[-1]
    )
    for k, b in enumerate(rows):
        req, toks = requests[b], draft_toks[b]
        keep = toks if b not in rejected else toks[: rejected[b]]
        if b in rejected:
            t = rejected[b]
            p = _sampling_probs(logits[k][t : t + 1], req.params)[0]
            r = (p - residual_q[b]).clamp_min(0)  # norm(max(0, p - q))
            r = r if r.sum() > 0 else p  # p == q: a rejection had probability 0
            keep = keep + [int(torch.multinomial(r / r.sum(), 1, generator=gen))]
        lp = _behaviour_logprobs(logits[k][: len(keep)], req.params)
        lps = lp.gather(-1, torch.tensor(keep)[:, None]).squeeze(-1).tolist()
        if _is_stop(keep, req.params, eos_ids, tokenizer):
            reason = "stop"
        elif len(keep) >= req.params.max_new_tokens:
            reason = "length"
        else:
            out[b] = replace(
                req,
                prefix_ids=tuple(keep),
                prefix_logprobs=tuple(lps),
                prefix_versions=(version,) * len(keep),
            )
            continue
        stats.completed += 1
        text = tokenizer.decode(keep, skip_special_tokens=True) if tokenizer is not None else ""
        out[b] = Sample(
            req.id,
            req.prompt_ids,
            tuple(keep),
            tuple(lps),
            (version,) * len(keep),
            reason,
            req.params,
            text,
            Timings(),
            req.task_id,
            req.group_id,
            req.sample_index,
        )
    return out, stats


def _residual_q(
    draft_model: torch.nn.Module | None,
    requests: Sequence[Request],
    drafts: dict[int, Sample],
    draft_toks: dict[int, list[int]],
    rejected: dict[int, int],
    q_full: dict[int, torch.Tensor],
    vocab: int,
) -> dict[int, torch.Tensor]:
    """q over the vocabulary at each rejected position: a point mass for greedy drafts, else the draft policy's."""
    out, need = {}, []
    for b, t in rejected.items():
        d = drafts[b]
        if d.params.greedy:
            out[b] = torch.nn.functional.one_hot(torch.tensor(draft_toks[b][t]), vocab).float()
        elif b in q_full:
            out[b] = _sampling_probs(q_full[b][t : t + 1], d.params)[0]
        else:
            need.append(b)
    if need:
        if draft_model is None:
            raise ValueError(
                "verify_drafts: a sampled draft was rejected and its residual needs the full draft "
                "distribution; pass draft_model (the policy that generated the drafts)"
            )
        q_logits = _draft_logits(
            draft_model,
            [requests[b].prompt_ids for b in need],
            [draft_toks[b][: rejected[b] + 1] for b in need],
        )
        for k, b in enumerate(need):
            out[b] = _sampling_probs(q_logits[k][rejected[b] : rejected[b] + 1], drafts[b].params)[0]
    return out
