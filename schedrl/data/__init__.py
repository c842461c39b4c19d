"""Data schedulers: which tasks each step trains on, and how many samples each task gets."""

from schedrl.data.base import Batch, DataContext, DataScheduler, ScoredGroup, TaskPool
from schedrl.data.groups import scored_groups
from schedrl.data.registry import SCHEDULERS, check_args, make_scheduler

__all__ = [
    "SCHEDULERS",
    "Batch",
    "DataContext",
    "DataScheduler",
    "ScoredGroup",
    "TaskPool",
    "check_args",
    "make_scheduler",
    "scored_groups",
]
