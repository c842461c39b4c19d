"""B copies of one job-shop instance dispatched side by side: `JobShopEnv`'s MDP with every array given a
leading batch axis, so that N sampled schedules cost one numpy call per decision instead of N Python
environments. It is for solving (no rewards); its observations and masks equal `JobShopEnv`'s, row for
row (`tests/test_jobshop.py` checks them on random dispatches), so a policy trained on the Gymnasium
environment runs here unchanged.
"""

from __future__ import annotations

import numpy as np

from schedrl.envs.scheduling.instances import Instance
from schedrl.envs.scheduling.jobshop_env import FEATURES


class JobShopBatch:
    def __init__(self, inst: Instance, copies: int) -> None:
        self.n, self.m = inst.num_jobs, inst.machines.shape[1]
        self.k = inst.num_machines
        self.mach, self.dur = inst.machines, inst.durations.astype(np.float64)
        self.rows = np.arange(copies)
        self.next = np.zeros((copies, self.n), dtype=np.int64)
        self.job_ready = np.zeros((copies, self.n))
        self.mach_ready = np.zeros((copies, self.k))
        self.job_left = np.tile(self.dur.sum(1), (copies, 1))
        load = np.bincount(self.mach.ravel(), weights=self.dur.ravel(), minlength=self.k)
        self.mach_left = np.tile(load, (copies, 1))
        self.lb0 = inst.lower_bound()
        self.max_dur = float(self.dur.max())
        self.lb = np.full(copies, self._bound_of(self.rows))
        self.order = np.zeros((copies, self.n * self.m), dtype=np.int64)  # jobs in dispatch order
        self._state()
        self._forced()

    # ---- the MDP, batched --------------------------------------------------------------------
    @property
    def live(self) -> np.ndarray:
        return (self.next < self.m).any(1)

    @property
    def makespans(self) -> np.ndarray:
        return self.job_ready.max(1)

    def step(self, rows: np.ndarray, jobs: np.ndarray) -> None:
        """Dispatch `jobs[i]`'s next operation in copy `rows[i]`, then every forced decision."""
        if not bool(self.mask[rows, jobs].all()):
            bad = int(np.flatnonzero(~self.mask[rows, jobs])[0])
            raise ValueError(
                f"JobShopBatch: copy {int(rows[bad])} dispatches job {int(jobs[bad])}, outside its "
                f"conflict set {np.flatnonzero(self.mask[rows[bad]]).tolist()}"
            )
        self._place(rows, jobs)
        self._state()
        self._forced()

    def _bound_of(self, rows: np.ndarray) -> np.ndarray:
        return np.maximum(
            (self.job_ready[rows] + self.job_left[rows]).max(1),
            (self.mach_ready[rows] + self.mach_left[rows]).max(1),
        )

    def _place(self, rows: np.ndarray, jobs: np.ndarray) -> None:
        ops = self.next[rows, jobs]
        k, d = self.mach[jobs, ops], self.dur[jobs, ops]
        end = np.maximum(self.job_ready[rows, jobs], self.mach_ready[rows, k]) + d
        self.job_ready[rows, jobs] = end
        self.mach_ready[rows, k] = end
        self.job_left[rows, jobs] -= d
        self.mach_left[rows, k] -= d
        self.next[rows, jobs] += 1
        self.order[rows, self.next[rows].sum(1) - 1] = jobs
        self.lb[rows] = self._bound_of(rows)

    def _state(self) -> None:
        """Per copy and job: the next operation's machine and earliest start, c*, and the conflict set."""
        active = self.next < self.m
        ops = np.minimum(self.next, self.m - 1)
        cols = np.arange(self.n)
        machines = self.mach[cols, ops]  # (B, n)
        est = np.maximum(self.job_ready, np.take_along_axis(self.mach_ready, machines, 1))
        ect = np.where(active, est + self.dur[cols, ops], np.inf)
        first = ect.argmin(1)
        cstar = ect[self.rows, first]
        on_first = machines == machines[self.rows, first][:, None]
        self.active, self.ops, self.machines, self.est, self.cstar = active, ops, machines, est, cstar
        self.mask = active & on_first & (est < cstar[:, None])

    def _forced(self) -> None:
        """Take every decision that has one allowed action, in every copy."""
        while True:
            rows = np.flatnonzero(self.mask.sum(1) == 1)
            if not len(rows):
                return
            self._place(rows, self.mask[rows].argmax(1))
            self._state()

    # ---- what the policy sees ----------------------------------------------------------------
    def observe(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(observations `(len(rows), n, FEATURES)`, masks `(len(rows), n)`) of the copies `rows`."""
        n, m, scale, lb0 = self.n, self.m, self.max_dur, self.lb0
        active, ops, machines = self.active[rows], self.ops[rows], self.machines[rows]
        cstar = self.cstar[rows][:, None]
        mach_ready = self.mach_ready[rows]
        cols = np.arange(n)
        nxt = np.minimum(ops + 1, m - 1)
        has_next = active & (ops + 1 < m)
        obs = np.zeros((len(rows), n, FEATURES), dtype=np.float32)
        obs[..., 0] = 1.0
        obs[..., 1] = ~active
        obs[..., 2] = np.where(active, self.dur[cols, ops] / scale, 0.0)
        obs[..., 3] = np.where(active, (self.est[rows] - cstar) / scale, 0.0)
        obs[..., 4] = np.where(active, (np.take_along_axis(mach_ready, machines, 1) - cstar) / scale, 0.0)
        obs[..., 5] = np.where(active, np.take_along_axis(self.mach_left[rows], machines, 1) / lb0, 0.0)
        obs[..., 6] = np.where(has_next, self.dur[cols, nxt] / scale, 0.0)
        nxt_ready = np.take_along_axis(mach_ready, self.mach[cols, nxt], 1)
        obs[..., 7] = np.where(has_next, (nxt_ready - cstar) / scale, 0.0)
        obs[..., 8] = self.job_left[rows] / lb0
        obs[..., 9] = (m - self.next[rows]) / m
        mask = self.mask[rows]
        obs[..., 10] = mask
        obs[..., 11] = (self.lb[rows] / lb0 - 1.0)[:, None]
        return obs, mask

    def sequences(self, row: int) -> list[list[int]]:
        """Copy `row`'s schedule: the jobs in order on each machine (what job-shop-lib checks)."""
        seqs: list[list[int]] = [[] for _ in range(self.k)]
        op = np.zeros(self.n, dtype=np.int64)
        for j in self.order[row, : int(self.next[row].sum())]:
            seqs[int(self.mach[j, op[j]])].append(int(j))
            op[j] += 1
        return seqs
