"""Data-scheduler registry: ``make_scheduler("coba", ctx, candidates=64)`` builds one by name."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from schedrl.data.base import DataContext, DataScheduler
from schedrl.data.coba import BudgetAllocScheduler
from schedrl.data.difficulty_profile import DifficultyProfileScheduler
from schedrl.data.domain_reweight import DomainReweightScheduler
from schedrl.data.dump_ucb import UCBDomainScheduler
from schedrl.data.e2h import EasyToHardScheduler
from schedrl.data.paced import PacedScheduler
from schedrl.data.uniform import UniformScheduler
from schedrl.data.zero_variance import ZeroVarianceScheduler
from schedrl.registry import Registry

# Each scheduler lives in the file named after its key (`coba` in coba.py).
SCHEDULERS: Registry[Callable[..., DataScheduler]] = Registry("data scheduler", "valid schedulers")
for _cls in (
    UniformScheduler,
    ZeroVarianceScheduler,
    UCBDomainScheduler,
    DomainReweightScheduler,
    DifficultyProfileScheduler,
    BudgetAllocScheduler,
    EasyToHardScheduler,
    PacedScheduler,
):
    SCHEDULERS.add(_cls.name, _cls)


def check_args(name: str, args: dict[str, Any]) -> None:
    """``ValueError`` for an unknown scheduler name or argument name (values are checked when built)."""
    params = [p for p in inspect.signature(SCHEDULERS.get(name)).parameters if p != "ctx"]
    unknown = sorted(set(args) - set(params))
    if unknown:
        raise ValueError(
            f"data scheduler {name!r}: unknown argument {unknown[0]!r}; "
            f"valid arguments: {', '.join(params) or 'none'}"
        )


def make_scheduler(name: str, ctx: DataContext, **args: Any) -> DataScheduler:
    """Build the scheduler registered as ``name`` with its keyword arguments."""
    check_args(name, args)
    return SCHEDULERS.get(name)(ctx, **args)
