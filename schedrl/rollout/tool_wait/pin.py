"""`pin`: keep a waiting trajectory's keys and values, with a time to live (Continuum, for RL rollouts).

While the tool runs, the trajectory's slot stays parked in the engine; when the answer comes back
in time the next turn prefills only the appended tokens (the answer), not the history. Holding a
slot has a price, since another trajectory could decode in it, so the time to live weighs the two:

    predicted wait  the `quantile` of the last `window` observed waits (`prior_wait_s` before any),
                    plus the longest recent engine step (`Turn.step_s`): an answer that is back is
                    handed on once the step in progress ends, and on long histories a step (a burst
                    of prefills) can outlast the tool itself. Once handed on, the continuation holds
                    its parked keys and values until it is admitted (the engine never expires them
                    then), so this is all the time to live has to cover.
    re-prefill      history_tokens * `prefill_s_per_token`: what releasing would cost on return
    keep_s          the predicted wait, if the re-prefill it saves is worth at least `min_saving`
                    of the time the slot is held (re-prefill >= min_saving * predicted wait);
                    otherwise 0 (release). Kept within [`min_keep_s`, `max_keep_s`].

With `min_saving` > 0 a short history behind a slow tool is released and a long history behind
a fast tool is pinned; at 0 (the default) every wait but the last turn's is pinned and the
engine's eviction decides under pressure. The engine evicts a pinned slot when a new admission needs it (the one expiring first),
so pinning never blocks fresh work. `priority` (a `by` order of the `priority` policy, or
None) also admits returning trajectories first.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from schedrl.registry import check_arg
from schedrl.rollout.tool_wait.base import TOOL_WAITS, Back, Turn
from schedrl.rollout.tool_wait.priority import ORDERS, returning_priority


@TOOL_WAITS.register("pin")
class Pin:
    """keep the slot's keys and values during the wait, for a time to live from the predicted wait"""

    lockstep = False
    parks = True

    @staticmethod
    def engine_needs(args: object) -> dict[str, str]:
        """What the engine must do for this policy (`engine.registry`: park, park_slots, preempt), and why."""
        return {"park": "keeps a finished turn's keys and values for the next turn"}

    @dataclass(frozen=True)
    class Args:
        quantile: float = 0.9  # of the observed waits: the predicted wait
        window: int = 256  # latest waits observed
        prior_wait_s: float = 1.0  # the predicted wait before any is observed
        prefill_s_per_token: float = 1e-4  # what re-prefilling a history costs, per token
        min_saving: float = 0.0  # pin only if re-prefill >= min_saving x predicted wait
        max_keep_s: float = 30.0  # the longest time to live
        priority: str | None = None  # also admit returns first, in this order of `priority`'s `by`
        min_keep_s: float = 0.1  # the shortest time to live (the episode loop's own latency)

        def __post_init__(self) -> None:
            check_arg(0.0 < self.quantile <= 1.0, "quantile", self.quantile, "in (0, 1]")
            for name in ("window", "prior_wait_s", "max_keep_s"):
                check_arg(getattr(self, name) > 0, name, getattr(self, name), "> 0")
            for name in ("prefill_s_per_token", "min_saving"):
                check_arg(getattr(self, name) >= 0, name, getattr(self, name), ">= 0")
            check_arg(
                0 < self.min_keep_s <= self.max_keep_s, "min_keep_s", self.min_keep_s, "in (0, max_keep_s]"
            )
            ok = self.priority is None or self.priority in ORDERS
            check_arg(ok, "priority", self.priority, f"None or one of {', '.join(ORDERS)}")

    def __init__(self, args: Args = Args()) -> None:
        self.quantile, self.prior_wait_s = args.quantile, args.prior_wait_s
        self.min_keep_s, self.max_keep_s = args.min_keep_s, args.max_keep_s
        self.prefill_s_per_token, self.min_saving = args.prefill_s_per_token, args.min_saving
        self.by = args.priority
        self.orders_returns = args.priority is not None
        self.waits: deque[float] = deque(maxlen=args.window)

    def predicted_wait_s(self) -> float:
        if not self.waits:
            return self.prior_wait_s
        ordered = sorted(self.waits)
        return ordered[min(len(ordered) - 1, int(self.quantile * len(ordered)))]

    def keep_s(self, turn: Turn) -> float:
        if turn.turn + 1 >= turn.max_turns:  # the last turn: nothing comes after it
            return 0.0
        wait = self.predicted_wait_s() + turn.step_s
        saving = turn.history_tokens * self.prefill_s_per_token
        if saving < self.min_saving * wait:
            return 0.0
        return min(max(wait, self.min_keep_s), self.max_keep_s)

    def priority(self, back: Back) -> float:
        return returning_priority(back, self.by) if self.by is not None else 0.0

    def observe(self, back: Back) -> None:
        self.waits.append(back.wait_s)
