"""`tail`: RollPacker's tail batching, a synchronous schedule that defers long-tail prompts.

Most steps are short rounds: eta x P0 prompts are launched with eta x R0 responses each, and the
round ends as soon as P0 prompts have R0 finished responses; everything still running is aborted.
The prompts that did not make it (the ones whose responses run long) join a long-prompt queue, and
once it holds P0 of them a long round runs exactly those, R0 responses each, without speculation,
to the last token. Every round is one on-policy update of P0 x R0 samples (k = 0, drain).

Simplified here: an aborted prompt keeps the response lengths drawn for it when it was first
launched (its first R0 of them), where the real system samples it again under newer weights; the
kept responses of a short round are each prompt's first R0 to finish. The asynchronous pipeline has
no tail policy: it needs aborting a group's extra responses, which its groups do not yet model.

References: RollPacker (Gao et al., NSDI 2026, "Mitigating Long-Tail Rollouts for Fast, Synchronous
RL Post-Training"), tail batching.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


class TailBatching:
    """The consumption policy of the simulator's `schedule.consumption: tail` (eta = `overprovision`)."""

    off_policy = False

    def __init__(self, prompts: int, group_size: int, eta: float) -> None:
        if eta < 1.0:
            raise ValueError(f"tail batching: schedule.overprovision (eta) must be >= 1, got {eta!r}")
        self.prompts, self.need, self.eta = prompts, group_size, eta
        self.long_waves: set[int] = set()  # waves that are long rounds
        self.deferred: list[Any] = []  # aborted prompts (their length rows), oldest first
        self.ready_order: dict[str, int] = {}  # group id -> when it reached `need` finished responses

    def next_round(self) -> tuple[bool, int, int]:
        """(long, prompts, responses per prompt) of the round issued next."""
        if len(self.deferred) >= self.prompts:
            return True, self.prompts, self.need
        return False, math.ceil(self.eta * self.prompts), math.ceil(self.eta * self.need)

    def ready(self, group: Any) -> bool:
        """Whether `group` has its R0 responses (a long round's groups hold exactly R0)."""
        done = len(group.done) >= self.need
        if done and group.id not in self.ready_order:
            self.ready_order[group.id] = len(self.ready_order)
        return done

    def position(self, queue: Sequence[Any], group: Any) -> tuple[int, int]:
        return group.wave - min(g.wave for g in queue), 1  # rounds ahead, one round per update

    def take(self, queue: Sequence[Any]) -> list[Any] | None:
        """The round's first P0 prompts to have R0 responses (a long round: all of them, whole)."""
        if not any(g.admitted for g in queue):
            return None
        oldest = min(g.wave for g in queue)
        wave = [g for g in queue if g.wave == oldest]
        if not all(g.admitted for g in wave):
            return None
        if oldest in self.long_waves:
            return wave if all(g.complete for g in wave) else None
        ready = sorted((g for g in wave if self.ready(g)), key=lambda g: self.ready_order[g.id])
        return ready[: self.prompts] if len(ready) >= self.prompts else None
