"""`priority`: a trajectory back from its tool is admitted ahead of fresh ones (its slot is released).

Three orders among the returning trajectories (`by`):

    progress   the one with more turns done first: finish what is started and free its memory
               (shortest remaining program first, the batch view)
    attained   the one that has generated fewer tokens first: Autellix's least attained service
               at program level, against one long program holding up the rest
    outcome    answers whose tool calls all succeeded first, then by progress: a failed call
               predicts a longer repair (Libra's use of tool outcomes)

Returning turns get priority 1 + a score in [0, 1); fresh turns have 0. It needs a
priority-aware admission policy (`schedule.admission: priority`), which the build selects when
the admission is left at `fcfs` (`orders_returns` is True).
"""

from __future__ import annotations

from dataclasses import dataclass

from schedrl.registry import check_arg
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


@TOOL_WAITS.register("priority")
class ReturnsFirst:
    """release the slot, but admit a returning trajectory ahead of fresh ones"""

    lockstep = False
    parks = False
    orders_returns = True

    @dataclass(frozen=True)
    class Args:
        by: str = "progress"  # the order among returning trajectories: progress, attained or outcome

        def __post_init__(self) -> None:
            check_arg(self.by in ORDERS, "by", self.by, f"one of {', '.join(ORDERS)}")

    def __init__(self, args: Args = Args()) -> None:
        self.by = args.by

    def keep_s(self, turn: Turn) -> float:
        return 0.0

    def priority(self, back: Back) -> float:
        return returning_priority(back, self.by)

    def observe(self, back: Back) -> None:
        pass
