"""`priority`: a trajectory back from its tool is admitted ahead of fresh ones (its slot is released).

Three orders among the returning trajectories (`by`):

    progress   the one with more turns done first: finish what is started and free its memory
               (shortest remaining program first, the batch view)
    attained   the one that has generated fewer tokens first: Autellix's least attained service
               at program level, against one long program holding up the rest
    outcome    answers whose tool calls all succeeded first, then by progress: a failed call
               predicts a longer repair (Libra's use of tool outcomes)

Returning turns get priority 1 + a score in [0, 1); fresh turns have 0. It needs a
priority-aware admission policy (`engine.admission: priority`), which the build selects when
the admission is left at `fcfs`.
"""

from __future__ import annotations

from schedrl.rollout.tool_wait.base import TOOL_WAITS, Back, Turn

ORDERS = ("progress", "attained", "outcome")


def returning_priority(back: Back, by: str) -> float:
    progress = back.turn / max(back.max_turns, 1)
    if by == "progress":
        return 1.0 + 0.999 * progress
    if by == "attained":
        return 1.0 + 0.999 / (1.0 + back.model_tokens)
    ok = all(s == "ok" for s in back.statuses)
    return 1.0 + 0.5 * ok + 0.499 * progress


def check_order(by: str) -> str:
    if by not in ORDERS:
        raise ValueError(f"tool-wait priority 'by' must be one of {', '.join(ORDERS)}, got {by!r}")
    return by


@TOOL_WAITS.register("priority")
class ReturnsFirst:
    """release the slot, but admit a returning trajectory ahead of fresh ones"""

    lockstep = False
    parks = False

    def __init__(self, by: str = "progress") -> None:
        self.by = check_order(by)

    def keep_s(self, turn: Turn) -> float:
        return 0.0

    def priority(self, back: Back) -> float:
        return returning_priority(back, self.by)

    def observe(self, back: Back) -> None:
        pass
