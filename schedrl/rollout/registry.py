"""The rollout scheduler's names: admission policies (`schedule.admission`) and length predictors.

    fcfs         first come, first served (the engine's default; no args)
    priority     highest `Request.priority` first (args: preempt, QLLM's priority preemption)
    las          Autellix's program-level least attained service, preemptive (args: quantum, preempt)
    static       static batches, as `transformers.generate` (no args)
    lpt          longest-predicted-first (args: predictor, predictor_args, max_wait_steps)
    spt          shortest-predicted-first (same args)
    fcfs_guarded first come, first served through the same machinery (same args; for comparisons)
    past_future  memory-aware FCFS (args: kv_budget_tokens, quantile, window)
    learned      a PPO policy trained on schedrl/Admission-v0 (args: checkpoint, predictor, predictor_args,
                 max_waiting)

Each policy's `Args` (the class's nested dataclass) lists and checks its arguments; a predictor named
inside them is checked by its own `Args` in turn. Names resolve here, above the engine: the engine takes
a policy object and knows no names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import schedrl.rollout.ranker  # noqa: F401  (registers the "ranker" predictor where it is defined)
from schedrl.engine.admission import FCFS, AdmissionPolicy, Priority, StaticBatch
from schedrl.registry import Registry
from schedrl.rollout.attained import LeastAttained
from schedrl.rollout.learned import Learned
from schedrl.rollout.memory import PastFutureAdmission
from schedrl.rollout.ordering import GuardedFCFS, LongestFirst, ShortestFirst
from schedrl.rollout.predictors import PREDICTORS, LengthPredictor

ADMISSION: Registry[Callable[..., AdmissionPolicy]] = Registry("admission policy")
for _name, _cls in (
    ("fcfs", FCFS),
    ("priority", Priority),
    ("las", LeastAttained),
    ("static", StaticBatch),
    ("lpt", LongestFirst),
    ("spt", ShortestFirst),
    ("fcfs_guarded", GuardedFCFS),
    ("past_future", PastFutureAdmission),
    ("learned", Learned),
):
    ADMISSION.add(_name, _cls)


def make_predictor(name: str, **args: Any) -> LengthPredictor:
    """The length predictor registered as `name` (or `pkg.module:Class`), built from its arguments."""
    return PREDICTORS.build(name, args)


def make_admission(name: str, **args: Any) -> AdmissionPolicy:
    """The admission policy registered as `name` (or `pkg.module:Class`), built from its arguments."""
    return ADMISSION.build(name, args)
