"""Task registry: ``make_task("addition", max_digits=3)`` builds a ``TaskSource`` by name."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from schedrl.envs.addition import AdditionTask
from schedrl.envs.base import TaskSource
from schedrl.envs.countdown import CountdownTask
from schedrl.envs.digits import ReverseDigitsTask, SortDigitsTask
from schedrl.envs.longtail import LongtailMix
from schedrl.envs.tiered import TieredMix
from schedrl.envs.user import FileTask
from schedrl.registry import Registry

TASKS: Registry[Callable[..., TaskSource]] = Registry("task", "valid tasks")
for _name, _factory in (
    ("addition", AdditionTask),
    ("sort", SortDigitsTask),
    ("reverse", ReverseDigitsTask),
    ("countdown", CountdownTask),
    ("longtail", LongtailMix),
    ("tiered", TieredMix),
    ("file", FileTask),
):
    TASKS.add(_name, _factory)


def make_task(name: str, **kwargs: Any) -> TaskSource:
    """Build the task registered as ``name``; ``ValueError`` for an unknown name or bad arguments."""
    factory = TASKS.get(name)
    params = inspect.signature(factory).parameters
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise ValueError(
            f"task {name!r}: unknown argument {unknown[0]!r}; valid arguments: {', '.join(params) or 'none'}"
        )
    missing = [p for p, spec in params.items() if spec.default is inspect.Parameter.empty and p not in kwargs]
    if missing:
        raise ValueError(f"task {name!r}: missing required argument {missing[0]!r}")
    return factory(**kwargs)
