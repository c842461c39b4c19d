"""Long-tail migration (JigsawRL): an engine that ran dry takes requests from the busiest one.

Which requests move: the last waiting first (nothing of theirs is computed yet), then the running ones
that generated the fewest tokens, the latest admitted among equals (the least to prefill again on the
new engine); one running request stays. A moved request is cut where it runs and resumes from its
prefix on the other engine, with its tokens, log-probs and versions: greedy output is that of an
uninterrupted run. JigsawRL moves the keys and values themselves and plans moves with a look-ahead;
this rule is greedy and the new engine recomputes the prefix, as the simulator's engine does.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedrl.engine.preemption import Running


def migrants(waiting: Sequence[str], running: Sequence[Running], n: int) -> list[str]:
    """Ids of up to `n` requests to hand to another engine, from `waiting` (in queue order) and
    `running`."""
    out = list(reversed(waiting))[: max(n, 0)]
    movable = min(n - len(out), len(running) - 1)
    if movable > 0:
        cheapest = sorted(running, key=lambda r: (r.generated, -r.admitted))
        out += [r.request.id for r in cheapest[:movable]]
    return out
