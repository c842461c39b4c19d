"""`cut_resume`: cut every request, push the new weights, resume each from its prefix.

A cut request keeps its tokens (and their versions and behaviour log-probs); it resumes
within its original token budget, its prompt plus prefix prefilled by the new weights.
The usual partner of partial rollouts (`pipeline.consumption: partial`).

References: APRIL (2025, "Active Partial Rollouts in Reinforcement Learning to Tame Long-tail
Generation"), partial rollouts recycled from their prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from schedrl.orchestrate.weight_sync.base import WEIGHT_SYNC

if TYPE_CHECKING:
    from schedrl.orchestrate.fleet import EngineFleet


@WEIGHT_SYNC.register("cut_resume")
class CutResume:
    """Abort everything, push the new weights, resend the cut requests from their prefixes."""

    off_policy = True

    def on_update(self, fleet: EngineFleet, weights: Any, version: int, resend: Callable[[], None]) -> None:
        fleet.cut()
        fleet.push(weights, version)
        resend()

    def admits(self, fleet: EngineFleet) -> bool:
        return True
