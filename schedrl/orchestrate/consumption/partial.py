"""`partial`: each update takes the oldest complete groups until it holds a step's worth of samples.

Admission over-provisions (`overprovision` x a step's samples in flight per update), so the long tail of a step no longer holds it up: unfinished groups carry over
to a later update (cut and resumed from their prefix with `weight_sync: cut_resume`).
Their older tokens are checked against the staleness bound like any other.

References: APRIL (2025, "Active Partial Rollouts in Reinforcement Learning to Tame Long-tail
Generation"): over-provision, stop at the target count, recycle the unfinished.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schedrl.orchestrate.buffer import Group
from schedrl.orchestrate.consumption.base import CONSUMPTION, Defaults, size
from schedrl.registry import check_arg


@CONSUMPTION.register("partial")
class Partial(Defaults):
    """The oldest complete groups, a step's worth of samples; the rest carry over."""

    off_policy = True

    @dataclass(frozen=True)
    class Args:
        overprovision: float = 1.0  # samples in flight per update, x a step's samples

        def __post_init__(self) -> None:
            check_arg(self.overprovision >= 1, "overprovision", self.overprovision, ">= 1")

    def __init__(self, budget: int, args: Args = Args()) -> None:
        self.budget = budget
        self.per_update = round(budget * args.overprovision)  # samples admitted per update

    def position(self, queue: Sequence[Group], group: Group) -> tuple[int, int]:
        return sum(size(g) for g in queue if g.admitted), self.per_update

    def take(self, queue: Sequence[Group]) -> list[Group] | None:
        groups, total = [], 0
        for g in (g for g in queue if g.admitted and g.complete):
            if total >= self.budget:
                break
            groups.append(g)
            total += size(g)
        return groups if total >= self.budget else None
