"""`pin`: keep a waiting trajectory's keys and values, with a time to live (Continuum, for RL rollouts).

While the tool runs, the trajectory's slot stays parked in the engine; when the answer comes back
in time the next turn prefills only the appended tokens (the answer), not the history. Holding a
slot has a price, since another trajectory could decode in it, so the time to live weighs the two:

    predicted wait  the `quantile` of the last `window` observed waits (`prior_wait_s` before any)
    re-prefill      history_tokens * `prefill_s_per_token`: what releasing would cost on return
    keep_s          the predicted wait, if the re-prefill it saves is worth at least `min_saving`
                    of the time the slot is held (re-prefill >= min_saving * predicted wait);
                    otherwise 0 (release). Kept within [`min_keep_s`, `max_keep_s`]: the observed
                    waits include the episode loop's own latency (an engine step or two), and a time
                    to live shorter than that would expire every slot before its answer is handed on.

With `min_saving` > 0 a short history behind a slow tool is released and a long history behind
a fast tool is pinned; at 0 (the default) every wait but the last turn's is pinned and the
engine's eviction decides under pressure. The engine evicts a pinned slot when a new admission needs it (the one expiring first),
so pinning never blocks fresh work. `priority` (a `by` order of the `priority` policy, or
None) also admits returning trajectories first.
"""

from __future__ import annotations

from collections import deque

from schedrl.rollout.tool_wait.base import TOOL_WAITS, Back, Turn
from schedrl.rollout.tool_wait.priority import check_order, returning_priority


@TOOL_WAITS.register("pin")
class Pin:
    """keep the slot's keys and values during the wait, for a time to live from the predicted wait"""

    lockstep = False
    parks = True

    def __init__(
        self,
        quantile: float = 0.9,
        window: int = 256,
        prior_wait_s: float = 1.0,
        prefill_s_per_token: float = 1e-4,
        min_saving: float = 0.0,
        max_keep_s: float = 30.0,
        priority: str | None = None,
        min_keep_s: float = 0.1,
    ) -> None:
        if not 0.0 < quantile <= 1.0:
            raise ValueError(f"pin: quantile must be in (0, 1], got {quantile!r}")
        for name, v in (("prior_wait_s", prior_wait_s), ("max_keep_s", max_keep_s), ("window", window)):
            if v <= 0:
                raise ValueError(f"pin: {name} must be > 0, got {v!r}")
        if not 0 < min_keep_s <= max_keep_s:
            raise ValueError(f"pin: min_keep_s must be in (0, max_keep_s], got {min_keep_s!r}")
        self.min_keep_s = min_keep_s
        if prefill_s_per_token < 0 or min_saving < 0:
            raise ValueError("pin: prefill_s_per_token and min_saving must be >= 0")
        self.quantile, self.prior_wait_s, self.max_keep_s = quantile, prior_wait_s, max_keep_s
        self.prefill_s_per_token, self.min_saving = prefill_s_per_token, min_saving
        self.by = check_order(priority) if priority is not None else None
        self.waits: deque[float] = deque(maxlen=window)

    def predicted_wait_s(self) -> float:
        if not self.waits:
            return self.prior_wait_s
        ordered = sorted(self.waits)
        return ordered[min(len(ordered) - 1, int(self.quantile * len(ordered)))]

    def keep_s(self, turn: Turn) -> float:
        if turn.turn + 1 >= turn.max_turns:  # the last turn: nothing comes after it
            return 0.0
        wait = self.predicted_wait_s()
        saving = turn.history_tokens * self.prefill_s_per_token
        if saving < self.min_saving * wait:
            return 0.0
        return min(max(wait, self.min_keep_s), self.max_keep_s)

    def priority(self, back: Back) -> float:
        return returning_priority(back, self.by) if self.by is not None else 0.0

    def observe(self, back: Back) -> None:
        self.waits.append(back.wait_s)
