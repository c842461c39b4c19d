"""`tail`: RollPacker's tail batching. Rounds of two kinds, each one update.

A short round draws eta x a step's samples from the data scheduler and samples each task eta x
its group size; it ends as soon as a step's worth of groups each have their group size of
finished samples (the first to finish of each group are kept). Every request still running is
aborted and the groups that did not make it -- the prompts whose responses run long -- are
deferred. Once the deferred prompts hold a step's samples, a long round runs exactly those, their
group size each, with no spares, to the last token. Each round is planned when the one before it
is taken, so a long round starts as soon as it is due.

With `max_staleness: 0` and `weight_sync: drain` every update is on-policy, as in RollPacker. A
deferred prompt is sampled again from scratch under the weights of its long round; the aborted
tokens are not trained. Its argument `eta` is RollPacker's eta.

References: RollPacker (Gao et al., NSDI 2026, "Mitigating Long-Tail Rollouts for Fast, Synchronous
RL Post-Training"), tail batching.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from schedrl.envs import Task
from schedrl.orchestrate.buffer import Group
from schedrl.orchestrate.consumption.base import CONSUMPTION, Defaults, Draw
from schedrl.registry import check_arg


@CONSUMPTION.register("tail")
class TailBatching(Defaults):
    """Short rounds that keep the first groups to finish; long rounds of the prompts they deferred."""

    off_policy = False

    @dataclass(frozen=True)
    class Args:
        eta: float = 1.25  # a short round samples eta x a step's tasks, eta x their group size each

        def __post_init__(self) -> None:
            check_arg(self.eta >= 1, "eta", self.eta, ">= 1")

    def __init__(self, budget: int, args: Args = Args()) -> None:
        self.budget, self.eta = budget, args.eta
        self.deferred: list[tuple[Task, int]] = []  # (task, samples it needs), oldest first
        self.open_wave: int | None = None  # planned, not yet taken: the next round waits for it
        self.long = False  # whether the open round is a long one
        self.target = budget  # the samples the open short round keeps
        self.seen_ready: dict[str, int] = {}  # group id -> when a take first saw it ready
        self.dropping: list[Group] = []  # the last short round's groups that did not make it
        self.last = {"tail_long_round": 0.0, "tail_deferred_prompts": 0.0}

    def plan(self, draw: Draw, wave: int) -> list[tuple[Task, int, int]] | None:
        if self.open_wave is not None:
            return None  # the round's kind depends on what the one running now defers
        self.open_wave = wave
        if sum(n for _, n in self.deferred) >= self.budget:
            out, total = [], 0
            while total < self.budget:
                task, n = self.deferred.pop(0)
                out.append((task, n, n))
                total += n
            self.long = True
            return out
        drawn = draw(math.ceil(self.eta * self.budget))
        # a step's share of what was drawn (a data scheduler may draw less than asked)
        self.target = min(self.budget, math.ceil(sum(n for _, n in drawn) / self.eta))
        return [(task, math.ceil(self.eta * n), n) for task, n in drawn]

    def max_requests(self, samples: int) -> int:
        return math.ceil(self.eta * samples)

    def position(self, queue: Sequence[Group], group: Group) -> tuple[int, int]:
        return group.wave - min(g.wave for g in queue), 1  # rounds ahead, one round per update

    def take(self, queue: Sequence[Group]) -> list[Group] | None:
        """A long round: all of it, complete. A short round: its groups in the order a take first saw
        them complete, until they hold a step's samples (or the step's share of a smaller draw); the
        rest are dropped and deferred. Groups dropped as too stale (a shrinking `auto` k) leave the round
        short: it keeps what is left of it, and ends with nothing to take if nothing is."""
        if self.open_wave is not None and not any(g.wave == self.open_wave for g in queue):
            self._close(self.open_wave, self.long)
            return None
        if not any(g.admitted for g in queue):
            return None
        oldest = min(g.wave for g in queue)
        wave = [g for g in queue if g.wave == oldest]
        if not all(g.admitted for g in wave):
            return None
        if self.long and oldest == self.open_wave:
            if not all(g.complete for g in wave):
                return None
            self._close(oldest, True)
            return wave
        for g in wave:
            if g.complete and g.id not in self.seen_ready:
                self.seen_ready[g.id] = len(self.seen_ready)
        ready = sorted((g for g in wave if g.id in self.seen_ready), key=lambda g: self.seen_ready[g.id])
        target = min(self.target, sum(g.needed for g in wave))
        taken, total = [], 0
        for g in ready:
            if total >= target:
                break
            taken.append(g)
            total += g.needed
        if total < target:
            return None
        self.dropping = [g for g in wave if not any(g is t for t in taken)]
        self.deferred += [(g.task, g.needed) for g in self.dropping]
        self._close(oldest, False)
        return taken

    def _close(self, wave: int, long: bool) -> None:
        if self.open_wave == wave:
            self.open_wave, self.long = None, False
        self.seen_ready.clear()
        self.last = {"tail_long_round": float(long), "tail_deferred_prompts": float(len(self.deferred))}

    def drop(self, queue: Sequence[Group]) -> list[Group]:
        out, self.dropping = self.dropping, []
        return out

    def metrics(self) -> dict[str, float]:
        return dict(self.last)

    def state_dict(self) -> dict[str, Any]:
        return {
            "deferred": [[asdict(task), n] for task, n in self.deferred],
            "long": self.long,
            "open_wave": self.open_wave,
            "target": self.target,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.deferred = [(Task(**task), int(n)) for task, n in state.get("deferred", [])]
        self.long = bool(state.get("long", False))
        self.open_wave = state.get("open_wave")
        self.target = int(state.get("target", self.budget))
