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
from dataclasses import dataclass

import torch

from schedrl.registry import check_arg
from schedrl.rollout.predictors import PREDICTORS, LengthPredictor
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

    @dataclass(frozen=True)
    class Args(LengthPredictor.Args):
        dim: int = 64  # hashed token-count features of a prompt (two more: its length)
        hidden: int = 32  # width of the MLP's hidden layer
        lr: float = 1e-2  # Adam's learning rate
        batch: int = 128  # samples per Adam step (the loss covers every pair among them)
        update_every: int = 64  # finished samples between two training rounds
        steps_per_update: int = 8  # Adam steps per training round
        seed: int = 0  # the weights' initialisation and the minibatch draws

        def __post_init__(self) -> None:
            super().__post_init__()
            for name in ("dim", "hidden", "batch", "update_every"):
                check_arg(getattr(self, name) > 0, name, getattr(self, name), "> 0")
            check_arg(self.lr > 0, "lr", self.lr, "> 0")
            check_arg(self.steps_per_update >= 0, "steps_per_update", self.steps_per_update, ">= 0")

    def __init__(self, args: Args = Args()) -> None:
        super().__init__(args)
        self.dim, self.batch = args.dim, args.batch
        self.update_every, self.steps_per_update = args.update_every, args.steps_per_update
        self._gen = gen = torch.Generator().manual_seed(args.seed)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(args.dim + 2, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 1)
        )
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / math.sqrt(p.shape[-1])))
        self.opt = torch.optim.Adam(self.net.parameters(), lr=args.lr)
        self._x: deque[torch.Tensor] = deque(maxlen=args.window)
        self._y: deque[int] = deque(maxlen=args.window)
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


PREDICTORS.add("ranker", RankerPredictor)
