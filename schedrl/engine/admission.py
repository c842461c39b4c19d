"""Admission policies: which waiting requests enter the running batch, and when.

A policy only chooses and orders; the engine enforces the caps on concurrency
and on batched tokens, so a policy cannot overfill the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from schedrl.engine.preemption import Running, swap_victims
from schedrl.types import Request


@runtime_checkable
class AdmissionPolicy(Protocol):
    """Which waiting requests enter the running batch. Promises: `select` returns distinct indices into
    `waiting`, at most `free_slots` of them, whose prompts fit `token_budget`; it never drops a request
    (one not selected now waits for a later step)."""

    def select(
        self, waiting: Sequence[Request], *, free_slots: int, token_budget: int, num_running: int
    ) -> list[int]:
        """Indices into `waiting` to admit now, in admission order.

        `free_slots` is how many more requests may run; `token_budget` is how many
        prefill tokens fit in this step beside the running requests' decode tokens.
        """
        ...


# A policy may also define `bind(engine)`: the engine calls it once, and the policy may chain
# onto the engine's `on_token` / `on_finish` callbacks to follow the running batch.


def take_in_order(
    order: Sequence[int], waiting: Sequence[Request], free_slots: int, budget: int
) -> list[int]:
    """Admit in `order` until a slot or the token budget runs out; never skip ahead."""
    chosen: list[int] = []
    for i in order:
        cost = waiting[i].num_prefill_tokens
        if len(chosen) == free_slots or cost > budget:
            break
        chosen.append(i)
        budget -= cost
    return chosen


class FCFS:
    """First come, first served: the default of every peer engine."""

    def select(
        self, waiting: Sequence[Request], *, free_slots: int, token_budget: int, num_running: int
    ) -> list[int]:
        return take_in_order(range(len(waiting)), waiting, free_slots, token_budget)


class Priority:
    """Highest `Request.priority` first; ties keep arrival order. With `preempt`, QLLM's priority
    preemption: a waiting request of strictly higher priority takes the place of the running request
    of lowest priority when no place is free."""

    @dataclass(frozen=True)
    class Args:
        preempt: bool = False  # suspend a lower-priority running request for a higher-priority waiting one

    def __init__(self, args: Args = Args()) -> None:
        self.preempt = args.preempt

    @staticmethod
    def engine_needs(args: Args) -> dict[str, str]:
        return {"preempt": "suspends lower-priority running requests"} if args.preempt else {}

    def select(
        self, waiting: Sequence[Request], *, free_slots: int, token_budget: int, num_running: int
    ) -> list[int]:
        order = sorted(range(len(waiting)), key=lambda i: -waiting[i].priority)
        return take_in_order(order, waiting, free_slots, token_budget)

    def victims(self, running: Sequence[Running], waiting: Sequence[Request], free_slots: int) -> list[str]:
        if not self.preempt:
            return []
        return swap_victims(running, waiting, free_slots, lambda r: -r.priority)


class StaticBatch:
    """Static batching: admit a new batch only once the previous one has fully finished.

    This is what `transformers.generate` does; it is here as a baseline.
    """

    def select(
        self, waiting: Sequence[Request], *, free_slots: int, token_budget: int, num_running: int
    ) -> list[int]:
        if num_running:
            return []
        return take_in_order(range(len(waiting)), waiting, free_slots, token_budget)
