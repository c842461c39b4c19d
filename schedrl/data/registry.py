"""Data-scheduler registry: ``SCHEDULERS.build("coba", {"candidates": 64}, ctx)`` builds one by name.

Each scheduler declares its arguments as a frozen dataclass ``Args`` (``uniform`` takes none);
``SCHEDULERS.check(name, args)`` checks names and values without building anything, and a
``pkg.module:Class`` name builds a user's scheduler without registering it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from schedrl.data.base import DataContext, DataScheduler
from schedrl.data.coba import BudgetAllocScheduler
from schedrl.data.difficulty_profile import DifficultyProfileScheduler
from schedrl.data.domain_reweight import DomainReweightScheduler
from schedrl.data.dump_ucb import UCBDomainScheduler
from schedrl.data.e2h import EasyToHardScheduler
from schedrl.data.paced import PacedScheduler
from schedrl.data.self_play import SelfPlayScheduler
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
    SelfPlayScheduler,
):
    SCHEDULERS.add(_cls.name, _cls)


def check_args(name: str, args: Mapping[str, Any] | None) -> Any:
    """The scheduler's checked ``Args`` (None when it takes none); ``ValueError`` naming the scheduler,
    the argument and the value for an unknown name, an unknown argument or a bad value."""
    return SCHEDULERS.check(name, args)


def make_scheduler(name: str, ctx: DataContext, **args: Any) -> DataScheduler:
    """The scheduler registered as ``name`` (or at ``pkg.module:Class``), built with its arguments."""
    return SCHEDULERS.build(name, args, ctx)
