"""A Gymnasium MDP for heterogeneous DAG scheduling: which ready task goes to which processor.

Each decision picks one (ready task, processor) pair; the task is placed on that processor at its
earliest start there that fits in an idle gap after its data has arrived (HEFT's insertion rule),
so a policy that picks HEFT's pair in HEFT's order builds HEFT's schedule. The observation is one
row per pair, `max_ready x num_procs` rows of `FEATURES` columns (column 0 is 1 on a real pair;
padding rows are 0); the action is a row, and `info["action_mask"]` allows the real ones.

Reward: minus the growth of the partial schedule's makespan, divided by the instance's lower bound
(its critical path at each task's cheapest cost), so an episode's return is -makespan / LB.
Instances are drawn at every reset by the HEFT paper's random generator (`dag.random_dag`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np

from schedrl.envs.scheduling.dag import (
    DAGInstance,
    DAGSchedule,
    data_ready,
    earliest_slot,
    random_dag,
    upward_rank,
)
from schedrl.envs.scheduling.jobshop_env import AllowedJobs

FEATURES = 12


def lower_bound(inst: DAGInstance) -> float:
    """The longest path through the DAG with every task at its cheapest cost and no communication."""
    w = inst.cost.min(1)
    longest = w.copy()
    for j in range(inst.num_tasks):
        preds = inst.preds(j)
        if len(preds):
            longest[j] = w[j] + longest[preds].max()
    return float(longest.max())


class RandomDAGs:
    """Random instances of `sizes` tasks (one at random per reset) on `num_procs` processors."""

    def __init__(self, sizes: Sequence[int], num_procs: int = 3, ccr: float = 1.0, beta: float = 1.0) -> None:
        self.sizes, self.num_procs, self.ccr, self.beta = [int(s) for s in sizes], num_procs, ccr, beta

    def __call__(self, rng: np.random.Generator) -> DAGInstance:
        n = self.sizes[int(rng.integers(len(self.sizes)))]
        return random_dag(rng, n, self.num_procs, ccr=self.ccr, beta=self.beta)


class FixedDAG:
    def __init__(self, inst: DAGInstance) -> None:
        self.inst = inst

    def __call__(self, rng: np.random.Generator) -> DAGInstance:
        return self.inst


class DAGSchedEnv(gym.Env):
    """`instances(rng) -> DAGInstance` at every reset; at most `max_ready` ready tasks are offered (the
    highest upward ranks first), each on every one of the instance's processors."""

    metadata = {"render_modes": []}

    def __init__(
        self, instances: Callable[[np.random.Generator], DAGInstance], num_procs: int, max_ready: int = 16
    ) -> None:
        self.sample, self.P, self.max_ready = instances, num_procs, max_ready
        self.rows = max_ready * num_procs
        self.observation_space = gym.spaces.Box(-1e6, 1e6, (self.rows, FEATURES), np.float32)
        self.action_space = AllowedJobs(self.rows, self)  # samples among the offered pairs
        self.inst: DAGInstance | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        inst = self.sample(self.np_random)
        if inst.num_procs != self.P:
            raise ValueError(
                f"instance {inst.name} has {inst.num_procs} processors, the environment {self.P}"
            )
        self.inst = inst
        n = inst.num_tasks
        self.rank = upward_rank(inst)
        self.lb = lower_bound(inst)
        self.scale = float(inst.cost.mean())
        self.proc, self.start, self.finish = np.full(n, -1), np.zeros(n), np.zeros(n)
        self.done = np.zeros(n, dtype=bool)
        self.busy: list[list[tuple[float, float]]] = [[] for _ in range(self.P)]
        self.npred = inst.arcs.sum(0)
        self.placed_preds = np.zeros(n, dtype=int)
        self.span = 0.0
        self._offer()
        return self._obs(), {"action_mask": self._mask()}

    def step(self, action):
        a = int(action)
        if not (0 <= a < len(self.pairs)):
            raise ValueError(
                f"DAGSchedEnv: action {a} is not an offered (task, processor) pair; agents must apply "
                f"info['action_mask'] ({len(self.pairs)} offered)"
            )
        assert self.inst is not None
        i, p, est = self.pairs[a][0], self.pairs[a][1], self.est[a]
        self.proc[i], self.start[i], self.finish[i] = p, est, est + self.inst.cost[i, p]
        self.busy[p].append((est, self.finish[i]))
        self.busy[p].sort()
        self.done[i] = True
        for j in self.inst.succs(i):
            self.placed_preds[j] += 1
        span = max(self.span, float(self.finish[i]))
        reward = -(span - self.span) / self.lb
        self.span = span
        finished = bool(self.done.all())
        if not finished:
            self._offer()
        info = {"action_mask": self._mask() if not finished else np.eye(self.rows, dtype=bool)[0]}
        if finished:
            info["makespan"] = self.span
        return self._obs(), reward, finished, False, info

    @property
    def schedule(self) -> DAGSchedule:
        return DAGSchedule(self.proc.copy(), self.start.copy(), self.finish.copy())

    def _offer(self) -> None:
        """The pairs offered now: the ready tasks of highest upward rank, each on every processor."""
        assert self.inst is not None
        inst = self.inst
        ready = np.flatnonzero(~self.done & (self.placed_preds == self.npred))
        ready = ready[np.argsort(-self.rank[ready], kind="stable")][: self.max_ready]
        self.pairs = [(int(i), p) for i in ready for p in range(self.P)]
        self.dready = np.array([data_ready(inst, i, p, self.proc, self.finish) for i, p in self.pairs])
        self.est = np.array(
            [
                earliest_slot(self.busy[p], r, inst.cost[i, p])
                for (i, p), r in zip(self.pairs, self.dready, strict=True)
            ]
        )
        self.eft = self.est + np.array([inst.cost[i, p] for i, p in self.pairs])

    def _mask(self) -> np.ndarray:
        mask = np.zeros(self.rows, dtype=bool)
        mask[: len(self.pairs)] = True
        return mask

    def _obs(self) -> np.ndarray:
        obs = np.zeros((self.rows, FEATURES), dtype=np.float32)
        if self.inst is None or self.done.all():
            return obs
        inst, s, k = self.inst, self.scale, len(self.pairs)
        tasks = np.array([i for i, _ in self.pairs])
        procs = np.array([p for _, p in self.pairs])
        best_eft = {i: self.eft[tasks == i].min() for i in set(tasks.tolist())}
        task_best = np.array([best_eft[i] for i in tasks])
        free = np.array([self.busy[p][-1][1] if self.busy[p] else 0.0 for p in procs])
        obs[:k, 0] = 1.0
        obs[:k, 1] = inst.cost[tasks, procs] / s
        obs[:k, 2] = (self.eft - task_best) / s  # how much later than on the task's best processor
        obs[:k, 3] = (self.eft - self.eft.min()) / s  # how much later than the earliest finishing pair
        obs[:k, 4] = self.rank[tasks] / self.rank.max()
        obs[:k, 5] = self.rank[tasks] / self.rank[tasks].max()
        obs[:k, 6] = self.eft == task_best  # HEFT's processor for this task
        obs[:k, 7] = inst.cost[tasks].mean(1) / s
        obs[:k, 8] = inst.arcs[tasks].sum(1) / max(1, inst.arcs.sum(1).max())
        obs[:k, 9] = (self.est - np.maximum(free, self.dready)) / s  # < 0: it fills an idle gap
        obs[:k, 10] = self.done.mean()
        obs[:k, 11] = (self.eft - self.span) / s  # growth of the makespan if taken
        return obs


def make_dag_env(
    sizes: Sequence[int] = (10, 20, 30),
    num_procs: int = 3,
    max_ready: int = 16,
    ccr: float = 1.0,
    beta: float = 1.0,
) -> DAGSchedEnv:
    """The registered `schedrl/DAGSched-v0`: random DAGs of `sizes` tasks at every reset."""
    return DAGSchedEnv(RandomDAGs(sizes, num_procs, ccr, beta), num_procs, max_ready)
