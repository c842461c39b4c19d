"""A trained dispatching policy solving job-shop instances: greedily, or as the best of N samples run
side by side (`JobShopBatch`: one numpy step and one batched forward per decision for all N)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from schedrl.envs.scheduling.instances import Instance
from schedrl.envs.scheduling.jobshop_batch import JobShopBatch


@dataclass
class Solution:
    makespan: float
    sequences: list[list[int]]  # jobs in order on each machine: the schedule, checkable by job-shop-lib
    seconds: float
    samples: int


def solve(
    policy,
    inst: Instance,
    samples: int = 1,
    seed: int = 0,
    time_limit_s: float | None = None,
    temperature: float = 1.0,
) -> Solution:
    """Greedy (`samples=1`) or the best of `samples` sampled schedules of `inst`, drawn at `temperature`;
    `time_limit_s` goes on sampling rounds until spent (a round of `samples` runs finishes)."""
    if not temperature > 0:
        raise ValueError(f"solve: temperature must be > 0, got {temperature}")
    start = time.perf_counter()
    best: tuple[float, list[list[int]]] | None = None
    torch.manual_seed(seed)
    done_samples = 0
    while best is None or (time_limit_s is not None and time.perf_counter() - start < time_limit_s):
        batch = JobShopBatch(inst, samples)
        while (rows := np.flatnonzero(batch.live)).size:
            obs, mask = batch.observe(rows)
            o, m = torch.from_numpy(obs), torch.from_numpy(mask)
            actions = policy.act(o, m, deterministic=samples == 1, temperature=temperature)[0]
            batch.step(rows, actions.numpy())
        row = int(batch.makespans.argmin())
        if best is None or batch.makespans[row] < best[0]:
            best = (float(batch.makespans[row]), batch.sequences(row))
        done_samples += samples
        if time_limit_s is None:
            break
    assert best is not None
    return Solution(best[0], best[1], time.perf_counter() - start, done_samples)
