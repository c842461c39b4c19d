"""Heterogeneous DAG scheduling: task graphs on processors of different speeds, HEFT and a random baseline.

An instance (the model of Topcuoglu, Hariri and Wu 2002, and of gym-ds3) is a DAG of tasks, a
computation cost `cost[i, p]` of task i on processor p (unrelated processors: each task runs
faster on some processor types than on others), and a communication cost `comm[i, j]` on each
arc, paid only when i and j run on different processors. A schedule gives each task a processor
and a start time; a task starts once every predecessor has finished and its data has arrived, and
a processor runs one task at a time. The makespan is the last finish time.

HEFT is written here: SAGA (anrg-saga), the maintained collection of task-graph schedulers, models
a task's time as cost / processor speed (related processors), which cannot express a cost table
per processor as the HEFT paper's own example has.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class DAGInstance:
    cost: np.ndarray  # (tasks, processors) computation cost
    comm: np.ndarray  # (tasks, tasks) communication cost of arc i -> j; 0 where there is no arc
    arcs: np.ndarray  # (tasks, tasks) bool: arc i -> j (i precedes j); tasks are in topological order
    name: str = "dag"

    @property
    def num_tasks(self) -> int:
        return int(self.cost.shape[0])

    @property
    def num_procs(self) -> int:
        return int(self.cost.shape[1])

    def preds(self, j: int) -> np.ndarray:
        return np.flatnonzero(self.arcs[:, j])

    def succs(self, i: int) -> np.ndarray:
        return np.flatnonzero(self.arcs[i])


def random_dag(
    rng: np.random.Generator,
    num_tasks: int,
    num_procs: int = 3,
    shape: float = 1.0,
    out_degree: int = 3,
    ccr: float = 1.0,
    beta: float = 1.0,
    mean_cost: float = 20.0,
) -> DAGInstance:
    """A random instance by the HEFT paper's generator (section 5.1).

    The graph has about sqrt(v) / shape levels of about shape * sqrt(v) tasks; each task but those of
    the last level gets 1..`out_degree` successors in later levels. A task's mean cost w_i is uniform
    in [0, 2 * mean_cost]; its cost on each processor uniform in [w_i (1 - beta/2), w_i (1 + beta/2)]
    (beta: the processors' heterogeneity). Arc costs are uniform with mean `ccr` x the mean
    computation cost (ccr: communication to computation ratio).
    """
    if num_tasks < 2 or num_procs < 1:
        raise ValueError(f"random_dag: need num_tasks >= 2 and num_procs >= 1, got {num_tasks}, {num_procs}")
    if not 0 <= beta <= 2 or shape <= 0 or ccr < 0 or out_degree < 1:
        raise ValueError(
            f"random_dag: need 0 <= beta <= 2, shape > 0, ccr >= 0, out_degree >= 1; got beta={beta}, "
            f"shape={shape}, ccr={ccr}, out_degree={out_degree}"
        )
    width = max(1, round(shape * np.sqrt(num_tasks)))
    level = np.zeros(num_tasks, dtype=int)
    lvl, i = 0, 0
    while i < num_tasks:
        size = int(rng.integers(1, 2 * width)) if i else 1  # one entry task
        level[i : i + size] = lvl
        i, lvl = i + size, lvl + 1
    arcs = np.zeros((num_tasks, num_tasks), dtype=bool)
    for t in range(num_tasks):
        later = np.flatnonzero(level > level[t])
        if len(later):
            k = min(len(later), int(rng.integers(1, out_degree + 1)))
            nxt = later[level[later] == level[later].min()]  # at least one arc to the next level
            arcs[t, rng.choice(nxt)] = True
            if k > 1:
                arcs[t, rng.choice(later, size=k - 1, replace=False)] = True
    for t in range(1, num_tasks):  # every task but the entry has a predecessor
        if not arcs[:, t].any():
            earlier = np.flatnonzero(level < level[t])
            arcs[rng.choice(earlier), t] = True
    w = rng.uniform(0, 2 * mean_cost, num_tasks)
    cost = rng.uniform(w[:, None] * (1 - beta / 2), w[:, None] * (1 + beta / 2), (num_tasks, num_procs))
    cost = np.maximum(cost, 1e-3)
    comm = np.where(arcs, rng.uniform(0, 2 * ccr * cost.mean(), (num_tasks, num_tasks)), 0.0)
    return DAGInstance(cost, comm, arcs, f"random-{num_tasks}x{num_procs}")


@dataclass
class DAGSchedule:
    proc: np.ndarray  # (tasks,) processor of each task
    start: np.ndarray  # (tasks,) start time
    finish: np.ndarray  # (tasks,)

    @property
    def makespan(self) -> float:
        return float(self.finish.max())


def check_schedule(inst: DAGInstance, s: DAGSchedule, tol: float = 1e-6) -> None:
    """Raise `ValueError` naming the first broken rule: precedence with data arrival, or two tasks at once."""
    for j in range(inst.num_tasks):
        if abs(s.finish[j] - s.start[j] - inst.cost[j, s.proc[j]]) > tol:
            raise ValueError(
                f"task {j} runs {s.finish[j] - s.start[j]:.3f}, its cost is {inst.cost[j, s.proc[j]]:.3f}"
            )
        for i in inst.preds(j):
            ready = s.finish[i] + (inst.comm[i, j] if s.proc[i] != s.proc[j] else 0.0)
            if s.start[j] < ready - tol:
                raise ValueError(
                    f"task {j} starts at {s.start[j]:.3f}, before task {i}'s data is there at {ready:.3f}"
                )
    for p in range(inst.num_procs):
        on = sorted(np.flatnonzero(s.proc == p), key=lambda t: s.start[t])
        for a, b in zip(on, on[1:], strict=False):
            if s.start[b] < s.finish[a] - tol:
                raise ValueError(f"processor {p} runs tasks {a} and {b} at once")


def upward_rank(inst: DAGInstance) -> np.ndarray:
    """rank_u(i) = mean_p cost[i, p] + max over successors j of (comm[i, j] + rank_u(j))."""
    mean = inst.cost.mean(1)
    rank = np.zeros(inst.num_tasks)
    for i in reversed(range(inst.num_tasks)):  # tasks are in topological order
        succ = inst.succs(i)
        rank[i] = mean[i] + (max(inst.comm[i, j] + rank[j] for j in succ) if len(succ) else 0.0)
    return rank


def data_ready(inst: DAGInstance, j: int, p: int, proc: np.ndarray, finish: np.ndarray) -> float:
    """When every input of task j is on processor p."""
    arrivals = [finish[i] + (inst.comm[i, j] if proc[i] != p else 0.0) for i in inst.preds(j)]
    return float(max(arrivals, default=0.0))


def earliest_slot(busy: list[tuple[float, float]], ready: float, length: float) -> float:
    """The earliest start >= `ready` of a `length`-long run in the gaps of `busy` (sorted intervals)."""
    t = ready
    for s, f in busy:
        if t + length <= s:
            return t
        t = max(t, f)
    return t


def heft(inst: DAGInstance) -> DAGSchedule:
    """Heterogeneous Earliest Finish Time (Topcuoglu, Hariri and Wu, IEEE TPDS 13(3), 2002).

    Tasks are taken in decreasing upward rank, rank_u(i) = w_i + max_{j in succ(i)} (c_ij + rank_u(j)),
    with w_i the task's mean cost over the processors and c_ij the arc's communication cost (its mean:
    the cost itself, paid between any two processors). Each task goes to the processor that gives it
    the earliest finish time, EFT(i, p) = cost[i, p] + EST(i, p), where EST is the earliest start,
    after its data has arrived, that fits in an idle gap of p (the insertion-based policy). Ties in
    rank go to the earlier task, ties in EFT to the lower processor.
    """
    rank = upward_rank(inst)
    order = sorted(range(inst.num_tasks), key=lambda i: (-rank[i], i))
    n, P = inst.num_tasks, inst.num_procs
    proc, start, finish = np.full(n, -1), np.zeros(n), np.zeros(n)
    busy: list[list[tuple[float, float]]] = [[] for _ in range(P)]
    for i in order:
        best = None
        for p in range(P):
            est = earliest_slot(busy[p], data_ready(inst, i, p, proc, finish), inst.cost[i, p])
            eft = est + inst.cost[i, p]
            if best is None or eft < best[0] - 1e-12:
                best = (eft, est, p)
        assert best is not None
        eft, est, p = best
        proc[i], start[i], finish[i] = p, est, eft
        busy[p].append((est, eft))
        busy[p].sort()
    return DAGSchedule(proc, start, finish)


def random_list(inst: DAGInstance, rng: np.random.Generator) -> DAGSchedule:
    """A random list scheduler: a random ready task, on a random processor, as early as it can start there
    (appended after the processor's last task)."""
    n = inst.num_tasks
    proc, start, finish = np.full(n, -1), np.zeros(n), np.zeros(n)
    free = np.zeros(inst.num_procs)
    done = np.zeros(n, dtype=bool)
    for _ in range(n):
        ready = [j for j in range(n) if not done[j] and all(done[inst.preds(j)])]
        j = int(rng.choice(ready))
        p = int(rng.integers(inst.num_procs))
        start[j] = max(free[p], data_ready(inst, j, p, proc, finish))
        finish[j] = start[j] + inst.cost[j, p]
        proc[j], free[p], done[j] = p, finish[j], True
    return DAGSchedule(proc, start, finish)
