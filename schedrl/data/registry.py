"""Data-scheduler registry: ``make_scheduler("coba", ctx, candidates=64)`` builds one by name."""

from __future__ import annotations

import inspect
from typing import Any

from schedrl.data.base import DataContext, DataScheduler
from schedrl.data.budget_alloc import BudgetAllocScheduler
from schedrl.data.difficulty_profile import DifficultyProfileScheduler
from schedrl.data.domain_reweight import DomainReweightScheduler
from schedrl.data.easy_to_hard import EasyToHardScheduler
from schedrl.data.paced import PacedScheduler
from schedrl.data.ucb_domains import UCBDomainScheduler
from schedrl.data.uniform import UniformScheduler
from schedrl.data.zero_variance import ZeroVarianceScheduler

SCHEDULERS: dict[str, type] = {
    cls.name: cls
    for cls in (
        UniformScheduler,
        ZeroVarianceScheduler,
        UCBDomainScheduler,
        DomainReweightScheduler,
        DifficultyProfileScheduler,
        BudgetAllocScheduler,
        EasyToHardScheduler,
        PacedScheduler,
    )
}


def check_args(name: str, args: dict[str, Any]) -> None:
    """``ValueError`` for an unknown scheduler name or argument name (values are checked when built)."""
    if name not in SCHEDULERS:
        raise ValueError(
            f"unknown data scheduler {name!r}; valid schedulers: {', '.join(sorted(SCHEDULERS))}"
        )
    params = [p for p in inspect.signature(SCHEDULERS[name]).parameters if p != "ctx"]
    unknown = sorted(set(args) - set(params))
    if unknown:
        raise ValueError(
            f"data scheduler {name!r}: unknown argument {unknown[0]!r}; "
            f"valid arguments: {', '.join(params) or 'none'}"
        )


def make_scheduler(name: str, ctx: DataContext, **args: Any) -> DataScheduler:
    """Build the scheduler registered as ``name`` with its keyword arguments."""
    check_args(name, args)
    return SCHEDULERS[name](ctx, **args)
