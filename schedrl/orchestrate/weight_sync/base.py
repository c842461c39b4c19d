"""The weight-sync protocol: when new weights reach the engines, and what happens to what they hold.

`pipeline.weight_sync` names one policy of `WEIGHT_SYNC`. The pipeline calls `on_update`
when the learner hands back the weights of a new version, and asks `admits` before it
sends new groups to the engines.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from schedrl.registry import Registry

if TYPE_CHECKING:
    from schedrl.orchestrate.fleet import EngineFleet


class WeightSync(Protocol):
    """When new weights reach the engines. Promises: every version reaches the engines (a newer staged
    one may replace an older one that never ran); `off_policy` is True if one sample's tokens can come
    from more than one version; `admits` is False only while weights wait for the engines to drain."""

    off_policy: bool  # whether tokens of one sample can come from more than one version

    def on_update(self, fleet: EngineFleet, weights: Any, version: int, resend: Callable[[], None]) -> None:
        """New weights (policy `version`) are ready; `resend()` sends every cut request again."""
        ...

    def admits(self, fleet: EngineFleet) -> bool:
        """Whether new groups may go to the engines now."""
        ...


WEIGHT_SYNC: Registry[type[WeightSync]] = Registry("weight-sync policy")
