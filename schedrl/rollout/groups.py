"""A step's rollout requests: G samples per task, each with its own derived seed."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from schedrl.envs import Task
from schedrl.envs.chat import prompt_ids as encode_prompt
from schedrl.seeding import derive_seed
from schedrl.types import Request, Sample, SamplingParams


def group_requests(
    tasks: Sequence[Task],
    tokenizer,
    params: SamplingParams,
    group_size: int | Sequence[int],
    *,
    seed: int,
    step: int,
    tag: str = "train",
) -> list[Request]:
    """`group_size` requests per task (one count for all, or one per task, as data schedulers give);
    the seed of sample g of task i at `step` depends on nothing else."""
    sizes = [group_size] * len(tasks) if isinstance(group_size, int) else list(group_size)
    if len(sizes) != len(tasks) or any(not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(f"group_size must be an int >= 1 or one per task ({len(tasks)}), got {group_size!r}")
    requests = []
    for i, (task, size) in enumerate(zip(tasks, sizes, strict=True)):
        prompt_ids = tuple(encode_prompt(tokenizer, task))
        for g in range(size):
            sample_params = SamplingParams(**{**vars(params), "seed": derive_seed(seed, tag, step, i, g)})
            requests.append(
                Request(
                    f"{tag}/{step}/{i}/{g}",
                    prompt_ids,
                    sample_params,
                    task_id=task.id,
                    group_id=f"{tag}/{step}/{i}",
                    sample_index=g,
                )
            )
    return requests


def group_index(samples: Sequence[Sample]) -> torch.Tensor:
    """(N,) group number of each sample: samples of one group (one task at one step) share one."""
    ids: dict[str | None, int] = {}
    return torch.tensor([ids.setdefault(s.group_id, len(ids)) for s in samples], dtype=torch.long)
