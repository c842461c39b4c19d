"""The pipeline's book-keeping decisions, written once for the real pipeline and the simulator.

Both keep their unconsumed groups in a dict in issue order, each group with `admitted`, `complete`,
`needed` and its finished samples in `done` (by sample index, in finishing order) and `dropped`
(indices dropped as too stale). What differs between the two is what a sample is (a `Sample` with its
per-token versions, a simulated job with the first and last version it ran under) and what is done
with the decision (requests sent or aborted, counters kept), which stays with the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from schedrl.orchestrate.staleness import StalenessBound, expected_update, may_admit


def admit_groups(
    groups: dict[str, Any],
    consumption: Any,
    started: int,
    updates: int,
    engine_version: int,
    k: int,
    issue: Callable[[], bool],
) -> list[Any]:
    """Admit buffered groups in issue order while the staleness rule lets them (`may_admit`: the update
    expected to consume a group, after `started` and the groups ahead of it as the consumption policy
    counts them, is at most `engine_version + k`) and that update is within the run's `updates`. When
    every buffered group is admitted, `issue()` draws the next batch into `groups` (False: not yet).
    Returns the groups admitted now, in order; each is marked `admitted`."""
    out: list[Any] = []
    queue, i = list(groups.values()), 0  # i: the first group not admitted
    while True:
        while i < len(queue) and queue[i].admitted:
            i += 1
        if i == len(queue):
            if not issue():
                return out
            queue = list(groups.values())
            continue
        g = queue[i]
        ahead, per_update = consumption.position(queue, g)
        if expected_update(started, ahead, per_update) >= updates or not may_admit(
            started, ahead, per_update, engine_version, k
        ):
            return out
        g.admitted = True
        out.append(g)


def purge_stale(
    groups: dict[str, Any],
    check: Iterable[Any],
    bound: StalenessBound,
    update: int,
    stale: str,
    versions: Callable[[Any], Sequence[int]],
    trained: Callable[[Any], Sequence[bool] | None] = lambda sample: None,
) -> tuple[list[Any], list[Any]]:
    """Drop every finished sample of the `check` groups that `update` may not train on
    (`StalenessBound.trainable` of its `versions`, with `trained` marking the model's tokens); a group
    left with fewer than two samples to train (no group baseline) is spent and leaves `groups`.
    Returns (the dropped samples, a spent group's remaining ones after its stale ones; the spent
    groups)."""
    dropped: list[Any] = []
    spent: list[Any] = []
    for g in check:
        for i, sample in list(g.done.items()):
            if bound.trainable(update, versions(sample), stale, trained(sample)) is None:
                del g.done[i]
                g.dropped.append(i)
                dropped.append(sample)
        if g.needed - len(g.dropped) < 2:
            dropped += list(g.done.values())
            del groups[g.id]
            spent.append(g)
    return dropped, spent


def take_groups(groups: dict[str, Any], consumption: Any) -> tuple[list[Any], list[Any]] | None:
    """The next update's groups as the consumption policy takes them, and the groups it abandons after
    the take (tail batching's deferred prompts); both leave `groups`. None while no batch is ready. A
    taken group that finished more samples than it needs trains on the first `needed` to finish."""
    taken = consumption.take(list(groups.values()))
    if taken is None:
        return None
    for g in taken:
        del groups[g.id]
    dropped = consumption.drop(list(groups.values()))
    for g in dropped:
        del groups[g.id]
    return taken, dropped
