"""`wave`: each update trains on exactly one data-scheduler batch, in order, and waits for all of it.

The batch the data scheduler drew for update s is the batch update s trains on, as in the
synchronous loop; with k = 0 and `weight_sync: drain` the pipeline is that loop.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedrl.orchestrate.buffer import Group
from schedrl.orchestrate.consumption.base import CONSUMPTION, Defaults


@CONSUMPTION.register("wave")
class Wave(Defaults):
    """One whole data-scheduler batch per update, oldest first."""

    off_policy = False

    def __init__(self, budget: int) -> None:
        self.budget = budget

    def position(self, queue: Sequence[Group], group: Group) -> tuple[int, int]:
        return group.wave - min(g.wave for g in queue), 1  # waves ahead, one wave per update

    def take(self, queue: Sequence[Group]) -> list[Group] | None:
        if not any(g.admitted for g in queue):
            return None
        oldest = min(g.wave for g in queue)
        wave = [g for g in queue if g.wave == oldest]
        return wave if all(g.admitted and g.complete for g in wave) else None
