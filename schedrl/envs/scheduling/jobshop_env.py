"""A Gymnasium dispatching MDP for the job shop: at each decision, which job's next operation runs.

The state is a partial schedule built by appending: the chosen job's next operation starts at the
later of its job's and its machine's ready times. Actions are restricted to Giffler and Thompson's
conflict set (the next operations, on the machine of the earliest possible completion c*, that can
start before c*), so every schedule built is active and an optimal one is reachable. The mask goes
out in `info["action_mask"]` (where `schedrl.classic` reads it); a decision with one allowed action is
taken by the environment itself. A job with no ready operation (finished, or a padding row) raises; one
with a ready operation outside the conflict set is still a legal dispatch (the schedule it builds may
not be active), so gymnasium's `check_env`, which steps with sampled actions, passes.

Reward: minus the increase of a lower bound of the makespan (each job's ready time plus its remaining
work, each machine's ready time plus its remaining load), divided by the instance's trivial bound LB0,
so an episode's return is -(C_max - LB0) / LB0 whatever the size. Observations are per job (its next
operation), padded to `max_jobs` rows of `FEATURES` columns (column 0 is 1 on a real job).

This is a thin environment over job-shop-lib's instances rather than its `SingleJobShopGraphEnv`: that
one's observations are graphs whose size changes with the instance, which a Gymnasium vector
environment cannot stack, and its dispatcher's observers cost more per step than the whole step here
(`bench/jssp_taillard.py` states the speeds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np

from schedrl.envs.scheduling.instances import Instance, generate

FEATURES = 12


class AllowedJobs(gym.spaces.Discrete):
    """`Discrete(max_jobs)` whose `sample()` draws among the jobs allowed now (as `sample(mask=...)`), so a
    random agent, and gymnasium's `check_env`, act legally; `contains` is the whole range, and a job
    outside the mask still raises in `step`."""

    def __init__(self, n: int, env) -> None:  # any env with `inst` and `_mask()` (the DAG one too)
        super().__init__(n)
        self.env = env

    def sample(self, mask=None, probability=None):  # type: ignore[override]
        if mask is None and probability is None and self.env.inst is not None and self.env._mask().any():
            mask = self.env._mask().astype(np.int8)
        return super().sample(mask=mask, probability=probability)


class JobShopEnv(gym.Env):
    """`instances(rng) -> Instance` is called at every reset (a fixed instance: `Fixed(inst)`)."""

    metadata = {"render_modes": []}

    def __init__(self, instances: Callable[[np.random.Generator], Instance], max_jobs: int) -> None:
        self.sample, self.max_jobs = instances, max_jobs
        self.observation_space = gym.spaces.Box(-1e6, 1e6, (max_jobs, FEATURES), np.float32)
        self.action_space = AllowedJobs(max_jobs, self)
        self.inst: Instance | None = None

    # ---- the MDP -----------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        inst = self.sample(self.np_random)
        if inst.num_jobs > self.max_jobs:
            raise ValueError(
                f"instance {inst.name} has {inst.num_jobs} jobs, more than max_jobs={self.max_jobs}"
            )
        self.inst = inst
        self.n, self.m = inst.num_jobs, inst.machines.shape[1]
        self.k = inst.num_machines
        self.mach, self.dur = inst.machines, inst.durations.astype(np.float64)
        self.next = np.zeros(self.n, dtype=np.int64)  # next operation of each job (m: done)
        self.job_ready = np.zeros(self.n)
        self.mach_ready = np.zeros(self.k)
        self.job_left = self.dur.sum(1)  # remaining work per job
        self.mach_left = np.bincount(self.mach.ravel(), weights=self.dur.ravel(), minlength=self.k)
        self.lb0 = inst.lower_bound()
        self.max_dur = float(self.dur.max())
        self.lb = self._bound()
        self.starts = np.full((self.n, self.m), np.nan)
        self.sequences: list[list[int]] = [[] for _ in range(self.k)]  # jobs in order, per machine
        self.decisions = 0
        self._cache = None
        reward = self._forced()
        return self._obs(), {"action_mask": self._mask(), "forced_reward": reward}

    def step(self, action):
        j = int(action)
        if not (0 <= j < self.n and self.next[j] < self.m):
            what = (
                "has no operation left" if 0 <= j < self.n else f"is not a job (this instance has {self.n})"
            )
            raise ValueError(
                f"JobShopEnv: action {j} {what}: no operation of it is ready; agents must apply "
                f"info['action_mask'] (allowed now: {np.flatnonzero(self._mask()).tolist()})"
            )
        reward = self._place(j) + self._forced()
        self.decisions += 1
        done = bool((self.next >= self.m).all())
        info = {"action_mask": self._mask() if not done else np.eye(self.max_jobs, dtype=bool)[0]}
        if done:
            info["makespan"] = self.makespan
        return self._obs(), reward, done, False, info

    @property
    def makespan(self) -> float:
        return float(self.job_ready.max())

    def _bound(self) -> float:
        return float(max((self.job_ready + self.job_left).max(), (self.mach_ready + self.mach_left).max()))

    def _place(self, j: int) -> float:
        i = self.next[j]
        k, d = self.mach[j, i], self.dur[j, i]
        start = max(self.job_ready[j], self.mach_ready[k])
        self.starts[j, i] = start
        self.job_ready[j] = self.mach_ready[k] = start + d
        self.job_left[j] -= d
        self.mach_left[k] -= d
        self.next[j] += 1
        self.sequences[k].append(j)
        self._cache = None
        lb = self._bound()
        reward = -(lb - self.lb) / self.lb0
        self.lb = lb
        return reward

    def _state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, np.ndarray]:
        """(jobs with a next operation, its earliest start, its machine, c*, the action mask), computed once
        per state."""
        if self._cache is not None:
            return self._cache
        jobs = np.flatnonzero(self.next < self.m)
        ops = self.next[jobs]
        machines = self.mach[jobs, ops]
        est = np.maximum(self.job_ready[jobs], self.mach_ready[machines])
        ect = est + self.dur[jobs, ops]
        mask = np.zeros(self.max_jobs, dtype=bool)
        cstar = 0.0
        if len(jobs):
            first = int(np.argmin(ect))
            cstar = float(ect[first])
            mask[jobs[(machines == machines[first]) & (est < cstar)]] = True
        self._cache = (jobs, est, machines, cstar, mask)
        return self._cache

    def _mask(self) -> np.ndarray:
        return self._state()[4]

    def _forced(self) -> float:
        """Take every decision that has one allowed action; their reward."""
        reward = 0.0
        while True:
            mask = self._mask()
            if mask.sum() != 1:
                return reward
            reward += self._place(int(np.flatnonzero(mask)[0]))

    # ---- what the policy sees ----------------------------------------------------------------
    def _obs(self) -> np.ndarray:
        obs = np.zeros((self.max_jobs, FEATURES), dtype=np.float32)
        n, m, scale, lb0 = self.n, self.m, self.max_dur, self.lb0
        jobs, est, machines, cstar, mask = self._state()
        obs[:n, 0] = 1.0  # a real job (padding rows stay 0)
        obs[:n, 1] = self.next >= m  # done
        if len(jobs):
            ops = self.next[jobs]
            d = self.dur[jobs, ops]
            obs[jobs, 2] = d / scale
            obs[jobs, 3] = (est - cstar) / scale
            obs[jobs, 4] = (self.mach_ready[machines] - cstar) / scale
            obs[jobs, 5] = self.mach_left[machines] / lb0
            nxt = np.minimum(ops + 1, m - 1)
            has_next = ops + 1 < m
            obs[jobs, 6] = np.where(has_next, self.dur[jobs, nxt] / scale, 0.0)
            obs[jobs, 7] = np.where(has_next, (self.mach_ready[self.mach[jobs, nxt]] - cstar) / scale, 0.0)
        obs[:n, 8] = self.job_left / lb0
        obs[:n, 9] = (m - self.next) / m
        obs[:n, 10] = mask[:n]
        obs[:n, 11] = self.lb / lb0 - 1.0  # the bound's growth so far, the same on every row
        return obs


class RandomInstances:
    """A sampler of random instances, one of `sizes` (jobs, machines) at random each reset (a class, not
    a closure, so that environments holding it pickle into checkpoints)."""

    def __init__(self, sizes: Sequence[Sequence[int]]) -> None:
        self.sizes = [(int(s[0]), int(s[1])) for s in sizes]

    def __call__(self, rng: np.random.Generator) -> Instance:
        n, m = self.sizes[int(rng.integers(len(self.sizes)))]
        return generate(n, m, seed=int(rng.integers(2**31)))


class Fixed:
    """The same instance at every reset."""

    def __init__(self, inst: Instance) -> None:
        self.inst = inst

    def __call__(self, rng: np.random.Generator) -> Instance:
        return self.inst


def make_jobshop(sizes: list | None = None, max_jobs: int = 20, instance: str | None = None) -> JobShopEnv:
    """The registered entry point (`schedrl/JobShop-v0`): random instances of `sizes` ([[jobs, machines],
    ...]) or one named benchmark or file (`instance`)."""
    if instance is not None:
        from schedrl.envs.scheduling.instances import load_instance

        inst = load_instance(instance)
        return JobShopEnv(Fixed(inst), max(max_jobs, inst.num_jobs))
    return JobShopEnv(RandomInstances(sizes or [[10, 10]]), max_jobs)
