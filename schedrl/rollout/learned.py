"""A learned admission policy: the PPO policy of `schedrl/Admission-v0` choosing inside the real engine.

At each admission round the policy sees what the environment showed it in training
(`admission_features`): the first `max_waiting` waiting requests in arrival order with their
predicted output lengths and prompt lengths, and the running batch's size and predicted
remainders. It admits its greedy choice, adds it to the running batch it sees, and chooses again
while places and prefill budget remain, as the simulated engine does between two steps.

Predictions come from a length predictor (the sibling predictor, as LPT uses, by default); the
predicted remainder of a running request is its prediction minus what it has generated, at least 1.

`LearnedAdmission` takes a predictor object; `schedule.admission: learned` builds `Learned`, whose `Args`
name the checkpoint and the predictor (checking them loads nothing; the constructor loads the checkpoint).

Each choice is one forward of the network's logits, traced with `torch.jit.trace` (about 0.15 ms for
2 layers of width 64 over 20 requests on one CPU thread, against 0.35 ms eager and 1 ms through
`act`), on the engine's critical path: `seconds` sums the time spent choosing.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch

from schedrl.entity_attention import EntityAttentionPolicy, load_entity_policy
from schedrl.registry import check_arg
from schedrl.rollout.admission_features import FEATURES, admission_features
from schedrl.rollout.observe import RunningState
from schedrl.rollout.predictors import LengthPredictor, PredictorArgs, SiblingPredictor
from schedrl.types import Request


class LearnedAdmission:
    """Admit by a trained attention policy (`checkpoint`: a policy file or a classic run directory)."""

    def __init__(
        self,
        checkpoint: str | Path,
        predictor: LengthPredictor | None = None,
        slots: int | None = None,
        max_waiting: int = 64,
    ) -> None:
        self.policy, self.info = load_entity_policy(checkpoint)
        if self.policy.features != FEATURES:
            raise ValueError(
                f"{checkpoint}: the policy reads {self.policy.features} features per request, the admission "
                f"environment writes {FEATURES}; it was not trained on schedrl/Admission-v0"
            )
        if max_waiting <= 0:
            raise ValueError(f"learned admission: max_waiting must be > 0, got {max_waiting!r}")
        self.predictor = predictor if predictor is not None else SiblingPredictor()
        self.slots, self.max_waiting = slots, max_waiting
        self.state = RunningState([self.predictor])
        self.seconds = 0.0  # spent choosing, over all rounds
        self._scores = _traced_logits(self.policy, max_waiting)

    def bind(self, engine) -> None:
        self.state.bind(engine)
        if self.slots is None:
            self.slots = int(engine.config.max_concurrency)

    def select(
        self, waiting: Sequence[Request], *, free_slots: int, token_budget: int, num_running: int
    ) -> list[int]:
        start = time.perf_counter()
        chosen = self._select(waiting, free_slots, token_budget, num_running)
        self.seconds += time.perf_counter() - start
        return chosen

    def _select(
        self, waiting: Sequence[Request], free_slots: int, token_budget: int, num_running: int
    ) -> list[int]:
        self.state.sync()
        slots = self.slots or max(1, num_running + free_slots)
        offered = list(range(min(len(waiting), self.max_waiting)))
        pred = {i: self.predictor.predict(waiting[i]) for i in offered}
        left = [
            max(1.0, self.predictor.predict(r.request) - r.generated) for r in self.state.running.values()
        ]
        chosen: list[int] = []
        while offered and len(chosen) < free_slots:
            obs = admission_features(
                [pred[i] for i in offered],
                [waiting[i].num_prefill_tokens for i in offered],
                left,
                slots,
                len(waiting) - len(chosen),
                _bucket(len(offered)),  # few shapes, so the traced graph stays specialised
            )
            with torch.inference_mode():
                i = offered[int(self._scores(torch.from_numpy(obs)[None]).argmax())]
            if waiting[i].num_prefill_tokens > token_budget:
                break
            token_budget -= waiting[i].num_prefill_tokens
            chosen.append(i)
            offered.remove(i)
            left.append(max(1.0, pred[i]))
            self.state.admit(waiting[i])
        return chosen


class Learned(LearnedAdmission):
    """a PPO policy trained on schedrl/Admission-v0, loaded from its checkpoint"""

    @dataclass(frozen=True, kw_only=True)
    class Args(PredictorArgs):
        checkpoint: str  # a policy file or a classic run directory (required; loaded when built)
        max_waiting: int = 64  # waiting requests the policy sees, the first in arrival order

        def __post_init__(self) -> None:
            check_arg(
                Path(self.checkpoint).exists(),
                "checkpoint",
                self.checkpoint,
                "an existing policy file or classic run directory",
            )
            check_arg(self.max_waiting > 0, "max_waiting", self.max_waiting, "> 0")
            super().__post_init__()

    def __init__(self, args: Args) -> None:
        super().__init__(args.checkpoint, args.make_predictor(), max_waiting=args.max_waiting)


class _Logits(torch.nn.Module):
    def __init__(self, policy: EntityAttentionPolicy) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy._heads(obs, None)[0]


def _bucket(n: int) -> int:
    """Rows of the observation for `n` offered requests: the next power of two (padding is masked)."""
    return 1 << max(0, n - 1).bit_length()


def _traced_logits(policy: EntityAttentionPolicy, max_waiting: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The policy's logits as a traced graph (the same numbers, without the Python of each module),
    run a few times per row bucket: TorchScript's executor specialises a graph on its first calls of
    each shape, and those calls are slow."""
    example = torch.zeros(1, 4, FEATURES)
    example[0, :, 0] = 1.0
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")  # the tracer's notes on the mask check, constant for real rows
        traced = cast(Callable, torch.jit.trace(_Logits(policy).eval(), example, check_trace=False))
        for n in {_bucket(k) for k in range(1, max_waiting + 1)}:
            x = torch.zeros(1, n, FEATURES)
            x[0, :, 0] = 1.0
            for _ in range(3):
                traced(x)
    return traced
