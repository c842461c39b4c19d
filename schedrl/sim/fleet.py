"""The simulated engines as one fleet: where a request goes, and the weight-sync interface the pipeline's
policies call (`schedrl.contracts.Fleet`: `stage`, `flush`, `push`, `cut`, `version`, `idle`)."""

from __future__ import annotations

import heapq

from schedrl.sim.engine import Job, SimEngine


class SimFleet:
    """The engines, with the interface the weight-sync policies call (`schedrl.orchestrate.fleet`)."""

    def __init__(self, engines: list[SimEngine], sync_s: float) -> None:
        self.engines, self.sync_s = engines, sync_s
        self.version = 0
        self.staged: tuple[object, int] | None = None
        self.now = 0.0
        self.cut_jobs: list[Job] = []
        self.syncs = 0
        self.in_flight = 0  # jobs the engines hold (running or waiting)
        self.touched: set[int] = set()  # engines sent work since the loop last looked
        self.finished: list[Job] = []  # jobs that finished while an engine was advanced to `now`

    @property
    def idle(self) -> bool:
        return self.in_flight == 0

    def send(self, jobs: list[Job], divide: bool, front: bool = False, to: int | None = None) -> None:
        """Each group (each job, if `divide`) to the engine holding the fewest jobs (or to engine `to`:
        where its keys and values are parked); `front`: ahead of the engine's waiting requests."""
        units = [[j] for j in jobs] if divide else _by_group(jobs)
        load = [(e.held, e.index) for e in self.engines if to is None or e.index == to]
        heapq.heapify(load)
        for unit in units:
            held, i = heapq.heappop(load)
            e = self.engines[i]
            self.finished += e.advance(self.now)
            e.submit(unit, front)
            heapq.heappush(load, (e.held, i))
            self.touched.add(i)
        self.in_flight += len(jobs)

    def push(self, weights, version: int, skip: int | None = None) -> None:
        for e in self.engines:
            e.load_weights(version, self.now, self.sync_s)
        self.version = version
        self.syncs += 1

    def stage(self, weights, version: int) -> None:
        self.staged = (weights, version)

    def flush(self, skip: int | None = None) -> None:
        if self.staged is not None:
            self.push(*self.staged)
            self.staged = None

    def cut(self) -> None:
        for e in self.engines:
            jobs = e.cut()
            self.cut_jobs += jobs
            self.in_flight -= len(jobs)


def _by_group(jobs: list[Job]) -> list[list[Job]]:
    out: dict[int, list[Job]] = {}
    for j in jobs:
        out.setdefault(id(j.group), []).append(j)
    return list(out.values())
