"""`release`: free the slot during the wait and prefill the history again (what every peer does)."""

from __future__ import annotations

from schedrl.rollout.tool_wait.base import TOOL_WAITS, Back, Turn


@TOOL_WAITS.register("release")
class Release:
    """free the slot during a wait; the next turn prefills its whole history"""

    lockstep = False
    parks = False
    orders_returns = False

    def keep_s(self, turn: Turn) -> float:
        return 0.0

    def priority(self, back: Back) -> float:
        return 0.0

    def observe(self, back: Back) -> None:
        pass
