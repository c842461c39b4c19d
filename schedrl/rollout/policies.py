"""Admission policies of the rollout scheduler, by name: what `engine.admission` may name beyond
the engine's own `fcfs`, `priority` and `static`.

    lpt          longest-predicted-first (args: predictor, predictor_args, max_wait_steps)
    spt          shortest-predicted-first (same args)
    fcfs_guarded first come, first served through the same machinery (same args; for comparisons)
    past_future  memory-aware FCFS (args: kv_budget_tokens, quantile, window)
"""

from __future__ import annotations

from typing import Any

from schedrl.rollout.memory import PastFutureAdmission
from schedrl.rollout.ordering import LengthOrdered
from schedrl.rollout.predictors import make_predictor

_ORDERED = {"lpt": "lpt", "spt": "spt", "fcfs_guarded": "fcfs"}
ROLLOUT_ADMISSION = (*_ORDERED, "past_future")


def make_rollout_admission(name: str, **args: Any):
    if name == "past_future":
        if "kv_budget_tokens" not in args:
            raise ValueError("admission policy 'past_future' needs kv_budget_tokens (admission_args)")
        return PastFutureAdmission(**args)
    if name not in _ORDERED:
        raise ValueError(f"unknown rollout admission policy {name!r}; valid: {', '.join(ROLLOUT_ADMISSION)}")
    unknown = set(args) - {"predictor", "predictor_args", "max_wait_steps"}
    if unknown:
        raise ValueError(
            f"admission policy {name!r}: unknown argument(s) {', '.join(sorted(unknown))}; "
            "valid: predictor, predictor_args, max_wait_steps"
        )
    predictor = make_predictor(args.get("predictor", "sibling"), **args.get("predictor_args", {}))
    return LengthOrdered(_ORDERED[name], predictor, args.get("max_wait_steps", 1024))
