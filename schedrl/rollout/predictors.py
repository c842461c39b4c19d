"""Output-length predictors that length-aware admission orders requests by.

A predictor answers `predict(request)` with a score that grows with the expected
number of output tokens (the sibling and history predictors return tokens; the learned
ranker returns an ordinal score), and learns online from the engine through the
`Listener` hooks. `probes(waiting)` names requests to run first to learn lengths
(Seer's probe samples); most predictors have none. Configs name them through `PREDICTORS`
(`predictor` and `predictor_args` of the length-aware admission policies, checked by `PredictorArgs`).

References: Seer (Qin et al., 2025, "Seer: Online Context Learning for Fast Synchronous
LLM Reinforcement Learning") for sibling prediction and probes.
"""

from __future__ import annotations

import bisect
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from schedrl.registry import Registry, check_arg
from schedrl.rollout.observe import Listener
from schedrl.types import Request, Sample


class LengthPredictor(Listener):
    """Base class: a prior from the mean observed length; no probes."""

    name = "base"

    @dataclass(frozen=True)
    class Args:
        default: float = 16.0  # the prior, in tokens, until a sample has finished
        window: int = 4096  # finished samples the prior (the mean realised length) covers

        def __post_init__(self) -> None:
            check_arg(self.default >= 0, "default", self.default, ">= 0")
            check_arg(self.window > 0, "window", self.window, "> 0")

    def __init__(self, args: Args = Args()) -> None:
        self.default = args.default
        self._recent: deque[int] = deque(maxlen=args.window)  # realised lengths of finished samples

    def prior(self) -> float:
        return sum(self._recent) / len(self._recent) if self._recent else self.default

    def predict(self, request: Request) -> float:
        return self.prior()

    def share_key(self, request: Request) -> object:
        """Requests with equal keys get equal predictions (so a policy predicts once per key)."""
        return request.id

    def probes(self, waiting: Sequence[Request]) -> list[int]:
        return []

    def on_finish(self, sample: Sample) -> None:
        if sample.finish_reason != "aborted":
            self._recent.append(sample.num_tokens)


PREDICTORS: Registry[type[LengthPredictor]] = Registry("length predictor")


@dataclass(frozen=True, kw_only=True)
class PredictorArgs:
    """The arguments of a policy that orders by a length predictor: which one, and its own arguments
    (checked by its `Args` here, so a config with a bad predictor argument fails when it is checked)."""

    predictor: str = "sibling"  # the length predictor: a name in PREDICTORS, or pkg.module:Class
    predictor_args: dict[str, Any] = field(default_factory=dict)  # its arguments (its Args)

    def __post_init__(self) -> None:
        try:
            PREDICTORS.get(self.predictor)
        except ValueError as err:
            raise ValueError(f"argument 'predictor': {err}") from None
        try:
            PREDICTORS.check(self.predictor, self.predictor_args)
        except ValueError as err:
            raise ValueError(f"argument 'predictor_args': {err}") from None

    def make_predictor(self) -> LengthPredictor:
        """A new predictor, as these arguments name it."""
        return PREDICTORS.build(self.predictor, self.predictor_args)


class SiblingPredictor(LengthPredictor):
    """Seer: a group's samples share a prompt, so one sample's length places the rest.

    The first request of each group with no admitted member is a probe and runs first. A
    group whose members all finished is predicted at its longest finished length. While a
    member still runs, its length so far L is a lower bound, and the group is predicted at
    max(longest finished, E[length | length > L]) with the expectation over recent realised
    lengths (L + 1 when none is longer, the prior when there are none): a probe that keeps running climbs above groups that
    ended short. A group with no information gets the prior. Requests without a `group_id`
    are their own group. Simplified relative to Seer: no per-group length distribution.
    """

    name = "sibling"

    @dataclass(frozen=True)
    class Args(LengthPredictor.Args):
        max_groups: int = 65536  # groups remembered; the oldest started is forgotten past it

        def __post_init__(self) -> None:
            super().__post_init__()
            check_arg(self.max_groups > 0, "max_groups", self.max_groups, "> 0")

    def __init__(self, args: Args = Args()) -> None:
        super().__init__(args)
        self.max_groups = args.max_groups
        self._started: dict[str, None] = {}  # groups with an admitted member, oldest first
        self._finished: dict[str, int] = {}  # group -> longest finished output
        self._running: dict[str, dict[str, int]] = defaultdict(dict)  # group -> {request id: tokens so far}
        self._sorted: list[int] = []  # recent lengths, sorted
        self._tail_mean: dict[int, float] = {}  # L -> mean of recent lengths > L (cleared on new lengths)

    @staticmethod
    def _group(request: Request) -> str:
        return request.group_id or request.id

    def share_key(self, request: Request) -> object:
        return self._group(request)

    def mean_above(self, lower: int) -> float:
        if lower not in self._tail_mean:
            above = self._sorted[bisect.bisect_right(self._sorted, lower) :]
            self._tail_mean[lower] = sum(above) / len(above) if above else max(lower + 1.0, self.prior())
        return self._tail_mean[lower]

    def predict(self, request: Request) -> float:
        g = self._group(request)
        finished, running = self._finished.get(g, 0), self._running.get(g)
        if running:
            return max(float(finished), self.mean_above(max(running.values())))
        return float(finished) if finished else self.prior()

    def probes(self, waiting: Sequence[Request]) -> list[int]:
        seen, out = set(), []
        for i, req in enumerate(waiting):
            g = self._group(req)
            if g not in self._started and g not in seen:
                seen.add(g)
                out.append(i)
        return out

    def on_admit(self, request: Request) -> None:
        g = self._group(request)
        if g not in self._started and len(self._started) >= self.max_groups:  # bound memory over a long run
            self.forget([next(iter(self._started))])
        self._started[g] = None
        self._running[g][request.id] = len(request.prefix_ids)

    def on_token(self, request: Request, generated: int, logprob: float) -> None:
        self._running[self._group(request)][request.id] = generated

    def on_drop(self, request: Request) -> None:
        g = self._group(request)
        self._running[g].pop(request.id, None)
        if not self._running[g]:
            del self._running[g]

    def on_finish(self, sample: Sample) -> None:
        if sample.finish_reason != "aborted":
            if len(self._recent) == self._recent.maxlen:  # the base class is about to drop its oldest
                del self._sorted[bisect.bisect_left(self._sorted, self._recent[0])]
            bisect.insort(self._sorted, sample.num_tokens)
            self._tail_mean.clear()
        super().on_finish(sample)
        g = sample.group_id or sample.request_id
        running = self._running.get(g)
        if running is not None:
            running.pop(sample.request_id, None)
            if not running:
                del self._running[g]
        if sample.finish_reason == "aborted":
            return
        self._finished[g] = max(self._finished.get(g, 0), sample.num_tokens)

    def forget(self, group_ids: Sequence[str]) -> None:
        """Drop groups that will not come back (e.g. at the end of a step) to bound memory."""
        for g in group_ids:
            self._started.pop(g, None)
            self._finished.pop(g, None)
            self._running.pop(g, None)


class HistoryPredictor(LengthPredictor):
    """Per task: the mean realised length of its samples in earlier epochs (the prior when unseen)."""

    name = "history"

    @dataclass(frozen=True)
    class Args(LengthPredictor.Args):
        per_task: int = 32  # latest realised lengths kept per task (its prediction is their mean)

        def __post_init__(self) -> None:
            super().__post_init__()
            check_arg(self.per_task > 0, "per_task", self.per_task, "> 0")

    def __init__(self, args: Args = Args()) -> None:
        super().__init__(args)
        self.per_task = args.per_task
        self._lengths: dict[str, deque[int]] = {}

    def share_key(self, request: Request) -> object:
        return request.task_id or request.id

    def predict(self, request: Request) -> float:
        seen = self._lengths.get(request.task_id or "")
        return sum(seen) / len(seen) if seen else self.prior()

    def on_finish(self, sample: Sample) -> None:
        super().on_finish(sample)
        if sample.finish_reason != "aborted" and sample.task_id is not None:
            self._lengths.setdefault(sample.task_id, deque(maxlen=self.per_task)).append(sample.num_tokens)


# registered with `add`, not the decorator, so the names keep their class types
PREDICTORS.add("sibling", SiblingPredictor)
PREDICTORS.add("history", HistoryPredictor)
