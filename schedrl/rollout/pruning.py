"""Online rollout pruning (ARRoL): cut partial rollouts so each group keeps a mix of outcomes.

A group whose samples all succeed (or all fail) has zero GRPO advantage and teaches nothing.
The step over-provisions each group, and a light head predicts, from a partial rollout,
whether it will succeed. Once every running member of a group has `check_tokens` tokens
(members that already finished count with their real reward), the group keeps `keep`
members chosen to hold `round(success_frac * keep)` successes and fill the rest with
failures (the most confident of each class first; a short class is filled from the other),
and the running members not kept are aborted and marked `finish_reason="pruned"`.
`training_samples(..., mode)` then drops pruned samples from the loss ("drop") or keeps
them, scored on their partial text ("keep").

Simplified relative to ARRoL: the head is a logistic regression over a handful of
features of the partial rollout (log-prob statistics, length so far, prompt length), not
a head on the policy's hidden states; it trains online on samples that finished unpruned.

References: ARRoL (2025, "Accelerating RL for LLM reasoning with online rollout pruning").
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from schedrl.types import Request, Sample

PRUNE_MODES = ("drop", "keep")


def partial_features(prompt_len: int, logprobs: Sequence[float]) -> torch.Tensor:
    """(6,) features of a partial rollout: mean/min log-prob, share of tokens below log(1/2), lengths."""
    lp = torch.tensor(list(logprobs) or [0.0])
    return torch.tensor(
        [
            1.0,
            float(lp.mean()),
            float(lp.min()),
            float((lp < math.log(0.5)).float().mean()),
            math.log1p(len(logprobs)),
            math.log1p(prompt_len),
        ]
    )


class SuccessHead:
    """Logistic regression P(success | partial rollout features), trained online by SGD."""

    def __init__(self, lr: float = 0.1, window: int = 4096, steps_per_fit: int = 50) -> None:
        self.w = torch.zeros(6)
        self.lr, self.steps_per_fit = lr, steps_per_fit
        self._x: deque[torch.Tensor] = deque(maxlen=window)
        self._y: deque[float] = deque(maxlen=window)

    def prob(self, features: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(features @ self.w)

    def fit(self, features: Sequence[torch.Tensor], success: Sequence[bool]) -> float:
        """Add examples and run full-batch gradient steps on the window; returns the final log-loss."""
        self._x.extend(features)
        self._y.extend(float(s) for s in success)
        x, y = torch.stack(list(self._x)), torch.tensor(list(self._y))
        for _ in range(self.steps_per_fit):
            p = torch.sigmoid(x @ self.w)
            self.w -= self.lr * x.T @ (p - y) / len(y)  # gradient of the mean log-loss
        p = torch.sigmoid(x @ self.w).clamp(1e-6, 1 - 1e-6)
        return float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())


def choose_kept(
    finished: Sequence[float | None], predicted: Sequence[float | None], keep: int, success_frac: float
) -> list[int]:
    """Indices of a group's members to keep.

    finished[i]: the reward of a member that already finished (None if running);
    predicted[i]: the success probability of a running member. Success means reward > 0.5
    (finished) or probability >= 0.5 (running). Finished members are kept before running ones
    of the same class (their outcome is certain), then the most confident first.
    """
    if len(finished) != len(predicted):
        raise ValueError(f"choose_kept: {len(finished)} finished entries but {len(predicted)} predictions")
    succ, fail = [], []
    for i, (r, p) in enumerate(zip(finished, predicted, strict=True)):
        if r is not None:
            (succ if r > 0.5 else fail).append((0, -abs(r - 0.5), i))
        elif p is not None:
            (succ if p >= 0.5 else fail).append((1, -abs(p - 0.5), i))
        else:
            raise ValueError(f"choose_kept: member {i} is neither finished nor predicted")
    succ.sort()
    fail.sort()
    want_s = min(len(succ), round(success_frac * keep))
    want_f = min(len(fail), keep - want_s)
    want_s = min(len(succ), keep - want_f)  # a short failure class is filled with successes
    return sorted(i for *_, i in succ[:want_s] + fail[:want_f])


@dataclass
class PruneConfig:
    keep: int = 8  # samples kept per group (the group is over-provisioned beyond this)
    success_frac: float = 0.5  # target share of successes among the kept samples
    check_tokens: int = 4  # output tokens each running member must have before the group is judged
    mode: str = "drop"  # pruned samples: "drop" from the loss, or "keep" them scored on their partial text

    def __post_init__(self) -> None:
        if self.keep <= 0:
            raise ValueError(f"pruning: keep must be > 0, got {self.keep!r}")
        if not 0 <= self.success_frac <= 1:
            raise ValueError(f"pruning: success_frac must be in [0, 1], got {self.success_frac!r}")
        if self.check_tokens <= 0:
            raise ValueError(f"pruning: check_tokens must be > 0, got {self.check_tokens!r}")
        if self.mode not in PRUNE_MODES:
            raise ValueError(f"pruning: unknown mode {self.mode!r}; valid: {', '.join(PRUNE_MODES)}")


def pruned_rollout(
    engine,
    requests: Sequence[Request],
    head: SuccessHead,
    reward: Callable[[Sample], float],
    cfg: PruneConfig,
) -> list[Sample]:
    """Run `requests` on `engine`, pruning each group once judged; returns every sample with its reward.

    The engine's `on_token` callback is chained to follow each request's log-probs."""
    lps: dict[str, list[float]] = defaultdict(list)
    prev = engine.on_token

    def on_token(rid, tok, lp, version):
        lps[rid].append(lp)
        if prev is not None:
            prev(rid, tok, lp, version)

    engine.on_token = on_token
    by_id = {r.id: r for r in requests}
    groups: dict[str, list[str]] = defaultdict(list)
    for r in requests:
        groups[r.group_id or r.id].append(r.id)
    done: dict[str, Sample] = {}
    judged: set[str] = set()
    feats: dict[str, torch.Tensor] = {}  # features at the check point, for training the head
    try:
        for r in requests:
            engine.add(r)
        while engine.has_unfinished():
            for s in engine.step():
                done[s.request_id] = s.with_reward(reward(s))
            for g, ids in groups.items():
                if g in judged:
                    continue
                running = [i for i in ids if i not in done]
                if running and any(len(lps[i]) < cfg.check_tokens for i in running):
                    continue
                judged.add(g)
                for i in running:
                    feats[i] = partial_features(len(by_id[i].prompt_ids), lps[i])
                probs = {i: float(head.prob(feats[i])) for i in running}
                kept = set(
                    choose_kept(
                        [done[i].reward if i in done else None for i in ids],
                        [probs.get(i) for i in ids],
                        cfg.keep,
                        cfg.success_frac,
                    )
                )
                for k, i in enumerate(ids):
                    if k not in kept and i not in done:
                        cut = engine.abort(i)
                        done[i] = replace(cut, finish_reason="pruned").with_reward(reward(cut))
    finally:
        engine.on_token = prev
    trained = [i for i in feats if done[i].finish_reason in ("stop", "length")]
    if trained:
        head.fit([feats[i] for i in trained], [(done[i].reward or 0.0) > 0.5 for i in trained])
    return [done[r.id] for r in requests]


def training_samples(samples: Sequence[Sample], mode: str) -> list[Sample]:
    """The samples the loss sees: pruned ones dropped ("drop") or kept ("keep")."""
    if mode not in PRUNE_MODES:
        raise ValueError(f"pruning: unknown mode {mode!r}; valid: {', '.join(PRUNE_MODES)}")
    return [s for s in samples if mode == "keep" or s.finish_reason != "pruned"]
