"""Turn a step's scored samples back into one ``ScoredGroup`` per task, in batch order."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from schedrl.data.base import ScoredGroup
from schedrl.envs import Task
from schedrl.types import Sample, group_of, task_of


def scored_groups(
    tasks: Sequence[Task], samples: Sequence[Sample], rewards: torch.Tensor, advantages: torch.Tensor
) -> list[ScoredGroup]:
    """Group samples by ``group_id``; ``rewards`` and ``advantages`` are (N,), aligned with ``samples``."""
    by_id = {t.id: t for t in tasks}
    members: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        members.setdefault(group_of(s), []).append(i)
    r, a = rewards.tolist(), advantages.tolist()
    return [
        ScoredGroup(
            by_id[task_of(samples[idx[0]])],
            tuple(r[i] for i in idx),
            tuple(a[i] for i in idx),
            sum(samples[i].num_tokens for i in idx),
            tuple(samples[i].text for i in idx),
        )
        for idx in members.values()
    ]
