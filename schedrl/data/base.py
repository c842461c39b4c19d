"""The data-scheduler protocol: which tasks a step trains on, and how many samples each one gets.

    batch = scheduler.next_batch(budget)   # [(task, n_samples)], sum of n_samples <= budget
    ... generate, score, compute advantages ...
    scheduler.observe(groups)              # one ScoredGroup per task of the batch

A scheduler is a pure function of its construction arguments, the run seed and what it has
observed: step k's random draws come from ``derive_seed(seed, "data", ..., k)``, never from
global state, so a seeded run is deterministic and ``state_dict()`` (plain JSON: numbers,
strings, lists, dicts) is everything a resumed run needs.

Group sizes may differ per task: the advantage estimators normalise within each group. A group of
one has zero advantage under a group baseline, so schedulers that choose sizes give every trained
task at least ``min_group >= 2`` samples; only a profiling probe (``probe_samples=1``) may be
smaller, and then it only measures.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from schedrl.data.stats import TaskStats
from schedrl.envs import Task, TaskSource
from schedrl.registry import check_arg
from schedrl.seeding import derive_seed

Batch = list[tuple[Task, int]]


@dataclass(frozen=True)
class ScoredGroup:
    """The scored samples of one task at one step."""

    task: Task
    rewards: tuple[float, ...]  # one per sample
    advantages: tuple[float, ...]  # one per sample, from the run's advantage estimator
    tokens: int = 0  # generated tokens of the whole group
    texts: tuple[str, ...] = ()  # the completions, one per sample (what a self-play scheduler reads)

    @property
    def accuracy(self) -> float:
        """Mean reward clipped to [0, 1]: the fraction solved for 0/1 rewards."""
        return sum(min(1.0, max(0.0, r)) for r in self.rewards) / len(self.rewards)

    @property
    def mean_abs_advantage(self) -> float:
        return sum(abs(a) for a in self.advantages) / len(self.advantages)


@dataclass(frozen=True)
class DataContext:
    """What every scheduler is built from, besides its own arguments."""

    source: TaskSource  # where tasks come from (its "train" split)
    seed: int  # the run seed
    group_size: int  # the run's G: samples per task for schedulers with fixed groups
    steps: int  # planned training steps (schedules such as easy-to-hard read it)


@runtime_checkable
class DataScheduler(Protocol):
    """Picks each step's tasks and group sizes; learns from the scored groups."""

    def next_batch(self, budget: int) -> Batch:
        """The next step's ``[(task, n_samples)]``: non-empty, every ``n >= 1``, ``sum(n) <= budget``."""
        ...

    def observe(self, groups: Sequence[ScoredGroup]) -> None:
        """Take in the scored groups of the batch just trained on."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state; ``load_state_dict`` of it resumes the scheduler exactly."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def check_number(
    field: str,
    value: Any,
    lo: float,
    hi: float | None = None,
    *,
    integer: bool = False,
    lo_open: bool = False,
) -> None:
    """In an `Args.__post_init__`: `value` is a number (an int when `integer`) in range, ``(lo`` when
    `lo_open`; else the `check_arg` error "argument 'field' must be an int >= 2, got 1"."""
    check_arg(
        _in_range(value, lo, hi, integer=integer, lo_open=lo_open),
        field,
        value,
        _rule(lo, hi, integer=integer, lo_open=lo_open),
    )


def check_budget(sched: str, budget: Any, lo: int) -> None:
    """A step's budget (no argument: it comes with each call) is an int of at least one group, `lo`."""
    if not _in_range(budget, lo, integer=True):
        raise ValueError(
            f"data scheduler {sched!r}: budget must be {_rule(lo, integer=True)}, got {budget!r}"
        )


def _in_range(
    value: Any, lo: float, hi: float | None = None, *, integer: bool = False, lo_open: bool = False
) -> bool:
    kind = int if integer else int | float
    ok = isinstance(value, kind) and not isinstance(value, bool)
    return ok and (value > lo if lo_open else value >= lo) and (hi is None or value <= hi)


def _rule(lo: float, hi: float | None = None, *, integer: bool = False, lo_open: bool = False) -> str:
    """What `_in_range` asks for, in words: "an int >= 2", "a number in (0, 1]"."""
    what = "an int" if integer else "a number"
    rng = f"{'>' if lo_open else '>='} {lo}" if hi is None else f"in {'(' if lo_open else '['}{lo}, {hi}]"
    return f"{what} {rng}"


def check_batch(sched: str, batch: Batch, budget: int) -> Batch:
    """Return ``batch`` if it keeps the protocol's promises, else ``RuntimeError`` (a scheduler bug)."""
    total = sum(n for _, n in batch)
    if not batch or total > budget or any(not isinstance(n, int) or n < 1 for _, n in batch):
        raise RuntimeError(
            f"data scheduler {sched!r} returned an invalid batch for budget {budget}: "
            f"{len(batch)} tasks, sample counts {[n for _, n in batch]}"
        )
    return batch


class TaskPool:
    """A fixed set of train tasks drawn once from the source (deduplicated by id), indexed by domain.

    Per-task statistics need tasks that come back; a pool is the finite dataset a scheduler
    cycles through, as in the papers. It is a pure function of (source, size, seed).
    """

    def __init__(self, source: TaskSource, size: int, seed: int) -> None:
        by_id: dict[str, Task] = {}
        for task in source.sample("train", size, derive_seed(seed, "data", "pool")):
            by_id.setdefault(task.id, task)
        self.tasks = list(by_id.values())
        self.by_id = by_id
        self.by_domain: dict[str, list[Task]] = {}
        for task in self.tasks:
            self.by_domain.setdefault(task.domain, []).append(task)
        self.domains = sorted(self.by_domain)


class PoolScheduler(ABC):
    """Shared plumbing: a step counter, per-step RNGs, a task pool and per-task statistics.

    Subclasses implement ``_select(budget, rng) -> Batch`` and may extend ``observe`` and the
    state with ``_extra_state`` / ``_load_extra``; their ``Args`` extend ``PoolScheduler.Args``, so
    every pool scheduler takes the pool and statistics arguments too.
    """

    name = "pool"

    @dataclass(frozen=True)
    class Args:
        pool_size: int = 1024  # distinct train tasks drawn once from the source
        prior_weight: float = 4.0  # k: pseudo-trials of the domain's rate a task's estimate is shrunk toward
        decay: float = 0.5  # factor on a task's old counts each time it is observed again

        def __post_init__(self) -> None:
            check_number("pool_size", self.pool_size, 1, integer=True)
            check_number("prior_weight", self.prior_weight, 0, lo_open=True)
            check_number("decay", self.decay, 0, 1)

    def __init__(self, ctx: DataContext, args: Args = Args()) -> None:
        self.ctx, self.pool_size = ctx, args.pool_size
        self.stats = TaskStats(args.prior_weight, args.decay)
        self.position = 0  # batches handed out so far
        self._pool: TaskPool | None = None

    @property
    def pool(self) -> TaskPool:
        if self._pool is None:  # built on first use: tests of allocation rules need no source
            self._pool = TaskPool(self.ctx.source, self.pool_size, self.ctx.seed)
        return self._pool

    def rng(self, *where: object) -> random.Random:
        return random.Random(derive_seed(self.ctx.seed, "data", self.name, *where))

    @property
    def min_budget(self) -> int:
        """The smallest budget this scheduler can fill (one group)."""
        return self.ctx.group_size

    def next_batch(self, budget: int) -> Batch:
        check_budget(self.name, budget, self.min_budget)
        batch = check_batch(self.name, self._select(budget, self.rng("step", self.position)), budget)
        self.position += 1
        return batch

    @abstractmethod
    def _select(self, budget: int, rng: random.Random) -> Batch:
        """This step's batch within `budget`, drawing only from `rng`."""

    def observe(self, groups: Sequence[ScoredGroup]) -> None:
        self.stats.update(groups, self.position)

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "stats": self.stats.state_dict(), **self._extra_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])
        self.stats.load_state_dict(state["stats"])
        self._load_extra(state)

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra(self, state: dict[str, Any]) -> None:  # noqa: B027 -- optional hook, no extra state by default
        """Restore what `_extra_state` saved."""


class EpochOrder:
    """Walks the pool in a fresh seeded shuffle each epoch; the cursor is part of the state."""

    def __init__(self) -> None:
        self.epoch, self.cursor = 0, 0

    def take(self, sched: PoolScheduler, n: int) -> list[Task]:
        """The next ``n`` tasks (fewer only if the pool is smaller than ``n``)."""
        tasks, n = [], min(n, len(sched.pool.tasks))
        while len(tasks) < n:
            order = list(sched.pool.tasks)
            sched.rng("epoch", self.epoch).shuffle(order)
            take = order[self.cursor : self.cursor + n - len(tasks)]
            tasks += take
            self.cursor += len(take)
            if self.cursor >= len(order):
                self.epoch, self.cursor = self.epoch + 1, 0
        return tasks

    def state_dict(self) -> list[int]:
        return [self.epoch, self.cursor]

    def load_state_dict(self, state: list[int]) -> None:
        self.epoch, self.cursor = int(state[0]), int(state[1])


def largest_remainder(weights: Sequence[float], n: int) -> list[int]:
    """Split ``n`` into integer counts proportional to ``weights`` (Hamilton's method; ties to the lower index).

    E.g. weights (0.5, 0.3, 0.2), n = 4: quotas 2.0, 1.2, 0.8 -> floors 2, 1, 0 -> the one left goes
    to the largest remainder (0.8) -> (2, 1, 1).
    """
    total = sum(weights)
    quotas = [w / total * n for w in weights]
    counts = [int(q) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts
