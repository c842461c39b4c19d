"""The consumption protocol: which complete groups form the next update's batch.

`pipeline.consumption` names one policy of `CONSUMPTION`. The pipeline keeps its
unconsumed groups in issue order (the queue); a policy says where a new group stands in
the order of consumption (for the admission rule `staleness.may_admit`) and which groups
the next update takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from schedrl.orchestrate.buffer import Group
from schedrl.registry import Registry


class Consumption(Protocol):
    off_policy: bool  # whether an update may train on groups admitted for an earlier one

    def __init__(self, budget: int, overprovision: float = 1.0) -> None:
        """`budget`: samples per update; `overprovision`: samples in flight per update, x `budget`."""
        ...

    def position(self, queue: Sequence[Group], group: Group) -> tuple[int, int]:
        """(ahead, per_update): the work queued ahead of `group` and how much of it one update
        consumes, in one unit, so that `started + ahead // per_update` is the update that takes it."""
        ...

    def take(self, queue: Sequence[Group]) -> list[Group] | None:
        """The groups of the next update, or None while they are not ready."""
        ...


CONSUMPTION: Registry[type[Consumption]] = Registry("consumption policy")


def size(group: Group) -> int:
    """Samples a group still holds or will hold (its stale drops left out)."""
    return len(group.requests) - len(group.dropped)
