"""`drain`: the engines finish what they hold on the old weights, then take the new ones.

No sample ever mixes two versions. While weights wait for the engines to drain, no new
group is admitted, so at k = 0 this is the synchronous loop, sample for sample.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from schedrl.orchestrate.weight_sync.base import WEIGHT_SYNC

if TYPE_CHECKING:
    from schedrl.orchestrate.fleet import EngineFleet


@WEIGHT_SYNC.register("drain")
class Drain:
    """New weights wait until the engines have drained; no group is admitted meanwhile."""

    off_policy = False

    def on_update(self, fleet: EngineFleet, weights: Any, version: int, resend: Callable[[], None]) -> None:
        fleet.stage(weights, version)  # the newest weights replace any still waiting
        if fleet.idle:
            fleet.flush()

    def admits(self, fleet: EngineFleet) -> bool:
        if fleet.idle:
            fleet.flush()
        return fleet.staged is None
