"""The clock episodes run on: the wall clock, or a virtual one that makes a simulation deterministic.

On the virtual clock the engine really runs (the tokens, caches and schedules are real) but time is
charged by a cost model of each step (`StepStats` -> seconds), and an environment answers at once
with the latency it would have taken (`info["latency_s"]`); its answer arrives when the virtual
time passes that latency. Nothing sleeps, and two runs with the same seeds take the same virtual
time to the nanosecond.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future

from schedrl.engine import StepStats


class WallClock:
    virtual = False

    def now(self) -> float:
        return time.perf_counter()

    def charge(self, stats: StepStats) -> None:
        """Called after every engine step: the wall clock has already moved."""

    def arrival(self, submitted: float, future: Future) -> float:
        """When a finished environment call's answer arrives: now, on the wall clock."""
        return submitted

    def jump(self, t: float) -> None:
        """Idle until `t`: the wall clock waits on the environments instead."""


class VirtualClock:
    """Time advanced by `step_cost(stats)` per engine step and by jumps to the next environment answer."""

    virtual = True

    def __init__(self, step_cost: Callable[[StepStats], float]) -> None:
        self.step_cost, self.t = step_cost, 0.0

    def __call__(self) -> float:  # the engine's clock
        return self.t

    def now(self) -> float:
        return self.t

    def charge(self, stats: StepStats) -> None:
        self.t += self.step_cost(stats)

    def arrival(self, submitted: float, future: Future) -> float:
        result = future.result() if future.exception() is None else None
        info = getattr(result, "info", None) or {}
        return submitted + float(info.get("latency_s", 0.0))

    def jump(self, t: float) -> None:
        self.t = max(self.t, t)


def linear_step_cost(
    base_s: float, per_row_s: float, per_prefill_token_s: float, per_context_token_s: float = 0.0
) -> Callable[[StepStats], float]:
    """A step's seconds as a linear function of its work (fit it to a real engine's steps)."""

    def cost(s: StepStats) -> float:
        if not (s.decode_rows or s.prefill_tokens):
            return 0.0
        return (
            base_s
            + per_row_s * s.decode_rows
            + per_prefill_token_s * s.prefill_tokens
            + per_context_token_s * s.context_tokens
        )

    return cost
