"""A trained dispatching policy solving job-shop instances: greedily, or as the best of N samples run
side by side (one batched forward per decision for all N)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from schedrl.envs.scheduling.instances import Instance
from schedrl.envs.scheduling.jobshop_env import Fixed, JobShopEnv


@dataclass
class Solution:
    makespan: float
    sequences: list[list[int]]  # jobs in order on each machine: the schedule, checkable by job-shop-lib
    seconds: float
    samples: int


def solve(
    policy, inst: Instance, samples: int = 1, seed: int = 0, time_limit_s: float | None = None
) -> Solution:
    """Greedy (`samples=1`) or the best of `samples` sampled schedules of `inst`; `time_limit_s` stops
    sampling rounds once spent (a round of `samples` runs finishes)."""
    start = time.perf_counter()
    best: tuple[float, list[list[int]]] | None = None
    torch.manual_seed(seed)
    done_samples = 0
    while best is None or (time_limit_s is not None and time.perf_counter() - start < time_limit_s):
        envs = [JobShopEnv(Fixed(inst), inst.num_jobs) for _ in range(samples)]
        resets = [e.reset(seed=seed + k) for k, e in enumerate(envs)]
        obs = [o for o, _ in resets]
        masks = [info["action_mask"] for _, info in resets]
        live = [not bool((e.next >= e.m).all()) for e in envs]
        while any(live):
            idx = [k for k, alive in enumerate(live) if alive]
            o = torch.from_numpy(np.stack([obs[k] for k in idx]))
            m = torch.from_numpy(np.stack([masks[k] for k in idx]))
            actions = policy.act(o, m, deterministic=samples == 1)[0].tolist()
            for k, a in zip(idx, actions, strict=True):
                obs[k], _, done, _, info = envs[k].step(a)
                masks[k] = info["action_mask"]
                live[k] = not done
        for e in envs:
            if best is None or e.makespan < best[0]:
                best = (e.makespan, [list(s) for s in e.sequences])
        done_samples += samples
        if time_limit_s is None:
            break
        seed += samples
    assert best is not None
    return Solution(best[0], best[1], time.perf_counter() - start, done_samples)
