"""A learned output-length ranker over prompt features, trained online with a pairwise loss.

The score orders requests, it is not a token count: LPT/SPT need only the order. Features
are hashed bag-of-token counts of the prompt plus its length; a two-layer MLP maps them to a
score, trained on finished samples with the RankNet pairwise logistic loss
    L = mean_{(i,j): l_i > l_j} log(1 + exp(-(s_i - s_j)))
over all ordered pairs of a minibatch. Simplified relative to the papers: prompt features
only (not the policy's last hidden state, which would need a forward of the policy per
request before admission).

References: vllm-ltr (Fu et al., 2024, "Efficient LLM Scheduling by Learning to Rank");
PARS (Tao et al., 2025, "Prompt-Aware Scheduling for Low-Latency LLM Serving").
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import torch

from schedrl.rollout.predictors import LengthPredictor
from schedrl.types import Request, Sample


def prompt_features(prompts: Sequence[Sequence[int]], dim: int) -> torch.Tensor:
    """(N, dim + 2): hashed token counts / length, log(1 + length), length / 64."""
    out = torch.zeros(len(prompts), dim + 2)
    for r, ids in enumerate(prompts):
        n = max(len(ids), 1)
        out[r, :dim] = torch.bincount(torch.tensor(ids, dtype=torch.long) % dim, minlength=dim).float() / n
        out[r, dim], out[r, dim + 1] = math.log1p(len(ids)), len(ids) / 64
    return out


def pairwise_rank_loss(scores: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """RankNet loss over every pair with different lengths.  scores, lengths: (B,) -> ()."""
    longer = lengths[:, None] > lengths[None, :]  # (B, B): i is longer than j
    if not longer.any():
        return scores.sum() * 0.0
    diff = scores[:, None] - scores[None, :]  # s_i - s_j
    return torch.nn.functional.softplus(-diff[longer]).mean()


class RankerPredictor(LengthPredictor):
    """Scores prompts by expected output length; learns from every finished sample."""

    name = "ranker"

    def __init__(
        self,
        default: float = 16.0,
        window: int = 4096,
        dim: int = 64,
        hidden: int = 32,
        lr: float = 1e-2,
        batch: int = 128,
        update_every: int = 64,
        steps_per_update: int = 8,
        seed: int = 0,
    ) -> None:
        super().__init__(default, window)
        for name, value in (
            ("dim", dim),
            ("hidden", hidden),
            ("batch", batch),
            ("update_every", update_every),
        ):
            if value <= 0:
                raise ValueError(f"ranker predictor: {name} must be > 0, got {value!r}")
        if lr <= 0:
            raise ValueError(f"ranker predictor: lr must be > 0, got {lr!r}")
        self.dim, self.batch = dim, batch
        self.update_every, self.steps_per_update = update_every, steps_per_update
        self._gen = gen = torch.Generator().manual_seed(seed)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(dim + 2, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
        )
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / math.sqrt(p.shape[-1])))
        self.opt = torch.optim.Adam(self.net.parameters(), lr=lr)
        self._x: deque[torch.Tensor] = deque(maxlen=window)
        self._y: deque[int] = deque(maxlen=window)
        self._since_update = 0
        self._cache: dict[tuple[int, ...], float] = {}  # prompt -> score under the current weights
        self.losses: list[float] = []

    def scores(self, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        with torch.no_grad():
            return self.net(prompt_features(prompts, self.dim)).squeeze(-1)

    def share_key(self, request: Request) -> object:
        return request.prompt_ids

    def predict(self, request: Request) -> float:
        key = request.prompt_ids
        if key not in self._cache:
            self._cache[key] = float(self.scores([key])[0])
        return self._cache[key]

    def train_step(self, features: torch.Tensor, lengths: torch.Tensor) -> float:
        """One Adam step of the pairwise loss on (features (B, F), lengths (B,)); returns the loss."""
        loss = pairwise_rank_loss(self.net(features).squeeze(-1), lengths)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self._cache.clear()
        return float(loss.detach())

    def fit(self, prompts: Sequence[Sequence[int]], lengths: Sequence[int]) -> None:
        """Add (prompt, realised length) pairs and train on the buffer."""
        feats = prompt_features(prompts, self.dim)
        for x, y in zip(feats, lengths, strict=True):
            self._x.append(x)
            self._y.append(int(y))
        self._update()

    def _update(self) -> None:
        n = len(self._y)
        if n < 2:
            return
        xs, ys = torch.stack(list(self._x)), torch.tensor(list(self._y), dtype=torch.float)
        for _ in range(self.steps_per_update):
            idx = torch.randperm(n, generator=self._gen)[: self.batch]
            self.losses.append(self.train_step(xs[idx], ys[idx]))

    def on_finish(self, sample: Sample) -> None:
        super().on_finish(sample)
        if sample.finish_reason == "aborted":
            return
        self._x.append(prompt_features([sample.prompt_ids], self.dim)[0])
        self._y.append(sample.num_tokens)
        self._since_update += 1
        if self._since_update >= self.update_every:
            self._since_update = 0
            self._update()
