"""The rollout scheduler's names: admission policies (`engine.admission`) and length predictors.

    fcfs         first come, first served (the engine's default; no args)
    priority     highest `Request.priority` first (no args)
    static       static batches, as `transformers.generate` (no args)
    lpt          longest-predicted-first (args: predictor, predictor_args, max_wait_steps)
    spt          shortest-predicted-first (same args)
    fcfs_guarded first come, first served through the same machinery (same args; for comparisons)
    past_future  memory-aware FCFS (args: kv_budget_tokens, quantile, window)
    learned      a PPO policy trained on schedrl/Admission-v0 (args: checkpoint, predictor, predictor_args,
                 max_waiting)

Names resolve here, above the engine: the engine takes a policy object and knows no names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schedrl.engine.admission import FCFS, AdmissionPolicy, Priority, StaticBatch
from schedrl.registry import Registry
from schedrl.rollout.memory import PastFutureAdmission
from schedrl.rollout.ordering import LengthOrdered
from schedrl.rollout.predictors import HistoryPredictor, LengthPredictor, SiblingPredictor
from schedrl.rollout.ranker import RankerPredictor

PREDICTORS: Registry[type[LengthPredictor]] = Registry("length predictor")
PREDICTORS.add("sibling", SiblingPredictor)
PREDICTORS.add("history", HistoryPredictor)
PREDICTORS.add("ranker", RankerPredictor)

ADMISSION: Registry[Callable[..., AdmissionPolicy]] = Registry("admission policy")


def make_predictor(name: str, **kwargs: Any) -> LengthPredictor:
    """The length predictor registered as `name`, built with its keyword arguments."""
    return PREDICTORS.get(name)(**kwargs)


def make_admission(name: str, **args: Any) -> AdmissionPolicy:
    """The admission policy registered as `name`, built with its `engine.admission_args`."""
    return ADMISSION.get(name)(**args)


def _no_args(name: str, cls: type) -> Callable[..., AdmissionPolicy]:
    def build(**args: Any) -> AdmissionPolicy:
        if args:
            raise ValueError(f"admission policy {name!r} takes no arguments, got {', '.join(sorted(args))}")
        return cls()

    return build


def _refuse_unknown(name: str, unknown: dict, valid: str) -> None:
    if unknown:
        raise ValueError(
            f"admission policy {name!r}: unknown argument(s) {', '.join(sorted(unknown))}; valid: {valid}"
        )


def _length_ordered(name: str, order: str) -> Callable[..., AdmissionPolicy]:
    def build(
        predictor: str = "sibling",
        predictor_args: dict | None = None,
        max_wait_steps: int = 1024,
        **unknown: Any,
    ) -> AdmissionPolicy:
        _refuse_unknown(name, unknown, "predictor, predictor_args, max_wait_steps")
        return LengthOrdered(order, make_predictor(predictor, **(predictor_args or {})), max_wait_steps)

    return build


def _past_future(**args: Any) -> AdmissionPolicy:
    if "kv_budget_tokens" not in args:
        raise ValueError("admission policy 'past_future' needs kv_budget_tokens (admission_args)")
    return PastFutureAdmission(**args)


def _learned(
    checkpoint: str | None = None,
    predictor: str = "sibling",
    predictor_args: dict | None = None,
    max_waiting: int = 64,
    **unknown: Any,
) -> AdmissionPolicy:
    from schedrl.rollout.learned import LearnedAdmission  # torch policy loading, only when asked for

    _refuse_unknown("learned", unknown, "checkpoint, predictor, predictor_args, max_waiting")
    if checkpoint is None:
        raise ValueError(
            "admission policy 'learned' needs checkpoint (a policy file or a classic run directory)"
        )
    return LearnedAdmission(
        checkpoint, make_predictor(predictor, **(predictor_args or {})), max_waiting=max_waiting
    )


for _name, _cls in (("fcfs", FCFS), ("priority", Priority), ("static", StaticBatch)):
    ADMISSION.add(_name, _no_args(_name, _cls), (_cls.__doc__ or "").strip().split("\n")[0])
for _name, _order in (("lpt", "lpt"), ("spt", "spt"), ("fcfs_guarded", "fcfs")):
    ADMISSION.add(
        _name, _length_ordered(_name, _order), f"{_order} by predicted length, with a starvation guard"
    )
ADMISSION.add("past_future", _past_future, "memory-aware FCFS: admit while the predicted KV peak fits")
ADMISSION.add("learned", _learned, "a PPO policy trained on schedrl/Admission-v0 (checkpoint)")
