"""`inflight`: new weights reach the engines between two decode steps, mid-sequence.

Running requests keep their keys and values (computed by the old weights) and go on;
their next tokens carry the new version, so one sample can span several versions and
the staleness bound is checked per token.

References: PipelineRL (Piche et al., 2025, "PipelineRL: Faster On-policy Reinforcement
Learning for Long Sequence Generation"), in-flight weight updates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from schedrl.orchestrate.weight_sync.base import WEIGHT_SYNC

if TYPE_CHECKING:
    from schedrl.orchestrate.fleet import EngineFleet


@WEIGHT_SYNC.register("inflight")
class Inflight:
    """New weights go to the engines at once; running requests continue under them."""

    off_policy = True

    def on_update(self, fleet: EngineFleet, weights: Any, version: int, resend: Callable[[], None]) -> None:
        fleet.push(weights, version)

    def admits(self, fleet: EngineFleet) -> bool:
        return True
