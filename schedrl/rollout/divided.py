"""Divided rollout (Seer): split groups into chunks and balance the chunks across workers.

Sending a whole group to one engine puts all G long samples of a long task on the same
worker, which then ends the step alone. Splitting each group into chunks of
`chunk_size` samples and placing chunks longest-predicted-load first on the least-loaded
worker (LPT list scheduling) spreads the long tail. Load = predicted length x samples.

References: Seer (Qin et al., 2025), divided rollout; Graham (1969) for LPT list scheduling.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from schedrl.types import Request


def chunk_groups(requests: Sequence[Request], chunk_size: int) -> list[list[Request]]:
    """Each group's requests, in order, cut into chunks of at most `chunk_size`."""
    if chunk_size <= 0:
        raise ValueError(f"divided rollout: chunk_size must be > 0, got {chunk_size!r}")
    groups: dict[str, list[Request]] = {}
    for r in requests:
        groups.setdefault(r.group_id or r.id, []).append(r)
    return [g[k : k + chunk_size] for g in groups.values() for k in range(0, len(g), chunk_size)]


def divide(
    requests: Sequence[Request], workers: int, predict: Callable[[Request], float], chunk_size: int = 1
) -> list[list[Request]]:
    """Requests per worker: chunks placed largest predicted load first on the least-loaded worker."""
    if workers <= 0:
        raise ValueError(f"divided rollout: workers must be > 0, got {workers!r}")
    chunks = chunk_groups(requests, chunk_size)
    loads = [sum(predict(r) for r in c) for c in chunks]
    order = sorted(range(len(chunks)), key=lambda k: (-loads[k], k))
    heap = [(0.0, w) for w in range(workers)]
    out: list[list[Request]] = [[] for _ in range(workers)]
    for k in order:
        load, w = heapq.heappop(heap)
        out[w].extend(chunks[k])
        heapq.heappush(heap, (load + loads[k], w))
    return out


def whole_groups(requests: Sequence[Request], workers: int) -> list[list[Request]]:
    """The baseline: whole groups dealt round-robin in arrival order."""
    if workers <= 0:
        raise ValueError(f"divided rollout: workers must be > 0, got {workers!r}")
    out: list[list[Request]] = [[] for _ in range(workers)]
    for k, chunk in enumerate(chunk_groups(requests, len(requests) or 1)):
        out[k % workers].extend(chunk)
    return out
