"""Length-aware admission order: FCFS, longest-predicted-first, shortest-predicted-first.

In a synchronous RL step the last request to finish ends the step. Longest-processing-time
first (LPT) starts the long requests while short ones fill the remaining slots around them,
which is Graham's 4/3-approximation of the minimum makespan; shortest-first (SPT) minimises
mean latency instead. Both only reorder the waiting queue: the engine still enforces its
caps on slots and batched tokens.

Starvation guard (all orders): a request that has waited through `max_wait_steps`
admission rounds goes to the front, oldest first, so a steady stream of better-ranked
requests cannot hold it back forever.

`LengthOrdered` takes a predictor object (a simulator's or a benchmark's own); the named policies
(`lpt`, `spt`, `fcfs_guarded`: `LongestFirst`, `ShortestFirst`, `GuardedFCFS`) build theirs from
their `Args`.

References: Graham (1969), "Bounds on multiprocessing timing anomalies" (LPT);
Seer (Qin et al., 2025) for longest-first with sibling-length prediction in RL rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from schedrl.engine.admission import take_in_order
from schedrl.registry import check_arg
from schedrl.rollout.observe import RunningState
from schedrl.rollout.predictors import LengthPredictor, PredictorArgs, SiblingPredictor
from schedrl.types import Request

ORDERS = ("fcfs", "lpt", "spt")


class LengthOrdered:
    """Admit in the chosen order of predicted output length (probes first, starving requests before all).

    `max_wait_steps` counts admission rounds (engine steps with a free slot and a waiting queue).
    """

    def __init__(
        self, order: str = "lpt", predictor: LengthPredictor | None = None, max_wait_steps: int = 1024
    ) -> None:
        if order not in ORDERS:
            raise ValueError(f"length-ordered admission: unknown order {order!r}; valid: {', '.join(ORDERS)}")
        if max_wait_steps <= 0:
            raise ValueError(f"length-ordered admission: max_wait_steps must be > 0, got {max_wait_steps!r}")
        self.order = order
        self.predictor = predictor if predictor is not None else SiblingPredictor()
        self.max_wait_steps = max_wait_steps
        self.state = RunningState([self.predictor])
        self._rounds: dict[str, int] = {}  # request id -> admission rounds it has waited through
        # request id -> prediction when admitted (for Kendall's tau); the oldest are dropped past 65536
        self.predicted: dict[str, float] = {}

    def bind(self, engine) -> None:
        self.state.bind(engine)

    def rank(self, waiting: Sequence[Request]) -> list[int]:
        """Indices of `waiting` in admission order."""
        rounds = {r.id: self._rounds.get(r.id, 0) + 1 for r in waiting}
        self._rounds = rounds  # requests that left the queue are forgotten
        starving = [i for i, r in enumerate(waiting) if rounds[r.id] > self.max_wait_steps]
        probes = [] if self.order == "fcfs" else self.predictor.probes(waiting)
        probes = [i for i in probes if rounds[waiting[i].id] <= self.max_wait_steps]
        first = set(starving) | set(probes)
        rest = [i for i in range(len(waiting)) if i not in first]
        if self.order != "fcfs":
            sign = -1.0 if self.order == "lpt" else 1.0
            by_key: dict[object, float] = {}
            key = self.predictor.share_key
            pred = {}
            for i in rest:
                k = key(waiting[i])
                if k not in by_key:
                    by_key[k] = sign * self.predictor.predict(waiting[i])
                pred[i] = by_key[k]
            rest.sort(key=lambda i: (pred[i], i))  # ties keep arrival order
        return starving + probes + rest

    def select(
        self, waiting: Sequence[Request], *, free_slots: int, token_budget: int, num_running: int
    ) -> list[int]:
        self.state.sync()
        chosen = take_in_order(self.rank(waiting), waiting, free_slots, token_budget)
        for i in chosen:
            req = waiting[i]
            self.predicted[req.id] = self.predictor.predict(req)
            if len(self.predicted) > 65536:
                del self.predicted[next(iter(self.predicted))]
            self._rounds.pop(req.id, None)
            self.state.admit(req)
        return chosen


class PredictedOrder(LengthOrdered):
    """`LengthOrdered` in the order `ORDER`, with the predictor its `Args` name (a named policy)."""

    ORDER: ClassVar[str] = "lpt"

    @dataclass(frozen=True, kw_only=True)
    class Args(PredictorArgs):
        max_wait_steps: int = 1024  # admission rounds a request waits before it goes first (the guard)

        def __post_init__(self) -> None:
            check_arg(self.max_wait_steps > 0, "max_wait_steps", self.max_wait_steps, "> 0")
            super().__post_init__()

    def __init__(self, args: Args = Args()) -> None:
        super().__init__(self.ORDER, args.make_predictor(), args.max_wait_steps)


class LongestFirst(PredictedOrder):
    """longest predicted output first (LPT: the step's makespan), with a starvation guard"""

    ORDER = "lpt"


class ShortestFirst(PredictedOrder):
    """shortest predicted output first (SPT: the mean latency), with a starvation guard"""

    ORDER = "spt"


class GuardedFCFS(PredictedOrder):
    """first come, first served through the length-ordered machinery (a baseline for lpt and spt)"""

    ORDER = "fcfs"
