"""Preemption: a running request suspended so that a waiting one runs in its place, then resumed.

An admission policy that also defines `victims(running, waiting, free_slots)` is preemptive: before
each admission the engine asks it which running requests to suspend. A suspended request leaves the
batch with what it generated, goes back to the front of the waiting queue, and resumes from its
prefix when the policy admits it again (the built-in engine recomputes its keys and values; vLLM
finds the full blocks of them in its prefix cache). Greedy output is that of an uninterrupted run.

The preemptive policies (`priority` with `preempt: true`, QLLM's; `las`, Autellix's, in
`rollout/attained.py`) rank requests by one key, lower runs first, and preempt only across a strict
difference of it (`swap_victims`), so a suspended request never displaces the one that displaced it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from schedrl.types import Request


@dataclass(frozen=True)
class Running:
    """A running request as a preemption policy sees it."""

    request: Request
    generated: int  # tokens it has generated, its resumed prefix included
    admitted: int  # the engine's admission counter when it entered (larger: later)


@runtime_checkable
class Preemptive(Protocol):
    """An admission policy that may suspend running requests. Promises: `victims` returns distinct ids
    of `running` requests; the engine suspends them before it admits, and they wait in the queue."""

    def victims(self, running: Sequence[Running], waiting: Sequence[Request], free_slots: int) -> list[str]:
        """Ids of running requests to suspend now, so that waiting requests take their places."""
        ...


def swap_victims(
    running: Sequence[Running],
    waiting: Sequence[Request],
    free_slots: int,
    key: Callable[[Request], float],
) -> list[str]:
    """Pair the best waiting requests (lowest `key`) beyond the free slots with the worst running ones
    (highest `key`, the latest admitted first among equals); each pair whose waiting key is strictly
    lower is a preemption."""
    contenders = sorted(waiting, key=key)[free_slots:]
    worst = sorted(running, key=lambda r: (key(r.request), r.admitted), reverse=True)
    out = []
    for w, r in zip(contenders, worst, strict=False):
        if key(w) >= key(r.request):
            break
        out.append(r.request.id)
    return out


def program_of(request: Request) -> str:
    """The unit of attained service: the request's program (an episode), else the request itself."""
    return request.program or request.id
