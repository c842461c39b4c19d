"""`experiments` (ML-engineering agents, generated): pick the modelling method for a data set; running it
takes a time that depends on the method, as training a model does.

The prompt is the data set's size, ``"rows 7k:"``. The action is a method ended by ``;``: ``lin``
(linear, fast), ``knn`` (twice as slow) or ``gbm`` (boosted trees, `slow` times as slow as ``lin``). The
environment runs it, an asynchronous wait of the method's time (`unit_s` per unit), and scores it: on
a small set (under 5k rows) ``lin`` is best (1.0) and ``gbm`` overfits (0.4); on a large one ``gbm`` is
best (1.0) and ``lin`` underfits (0.4); ``knn`` earns 0.5 on both.

The best method on large sets is also the slowest. A schedule that keeps the first episodes of a group
to finish (`tail` with spares) or trains on what finishes first trains on ``gbm`` less often than the
policy picks it: `algo.duration_aware` weighs each episode's advantage by its environment time to undo
that. The environment reports each run's time as `info["latency_s"]`, so a virtual clock charges it.

The supervised warm-up shows the three methods evenly, whatever the data (`solution`).
"""

from __future__ import annotations

import asyncio
import random

from schedrl.envs.base import GeneratedTasks, Task, TaskSource, check_int_range, task_id
from schedrl.envs.environment import Observation, StepResult

END = ";"
METHODS = ("lin", "knn", "gbm")
LARGE = 5  # thousands of rows from which a data set is large


def score(method: str, rows_k: int) -> float:
    """What `method` scores on a data set of `rows_k` thousand rows (0 for an unknown method)."""
    large = rows_k >= LARGE
    return {"lin": 0.4 if large else 1.0, "knn": 0.5, "gbm": 1.0 if large else 0.4}.get(method, 0.0)


class ExperimentsTask(GeneratedTasks):
    """A data set of 1k-9k rows (a few variants of each size, for the split)."""

    name = "experiments"

    def candidate(self, rng: random.Random) -> Task | None:
        rows, variant = rng.randint(1, 9), rng.randrange(1000)
        prompt = f"rows {rows}k:"
        best = "gbm" if rows >= LARGE else "lin"
        meta = {"rows_k": rows, "variant": variant}
        return Task(task_id("exp", f"{rows}/{variant}"), prompt, best, domain=self.name, metadata=meta)

    def split_key(self, task: Task) -> str:
        """Both splits hold every size: the split is by variant, the prompt is the size."""
        return task.id

    def reward(self, task: Task, completion: str) -> float:
        return score(completion.strip().removesuffix(END).strip(), task.metadata["rows_k"])

    def solution(self, task: Task) -> str:
        """A method chosen evenly, whatever the data: the warm-up shows all three."""
        return METHODS[task.metadata["variant"] % len(METHODS)] + END


class ExperimentsEnv:
    """Runs the picked method for its time, then scores it; one action per episode."""

    stop_strings: tuple[str, ...] = (END,)

    def __init__(self, source: TaskSource, unit_s: float = 0.01, slow: int = 6) -> None:
        if not 0.0 <= unit_s <= 10.0:
            raise ValueError(f"ExperimentsEnv.unit_s must be in [0, 10], got {unit_s!r}")
        self.slow = check_int_range("experiments", "slow", slow, 1, 100)
        self.source, self.unit_s = source, unit_s
        self.rows_k = 0

    def units(self, method: str) -> int:
        return {"lin": 1, "knn": 2, "gbm": self.slow}.get(method, 1)

    async def reset(self, task: Task, seed: int) -> Observation:
        self.rows_k = task.metadata["rows_k"]
        return Observation(task.prompt, "template")

    async def step(self, action: str) -> StepResult:
        method = action.strip().removesuffix(END).strip()
        took = self.units(method) * self.unit_s
        await asyncio.sleep(took)
        return StepResult(
            None, score(method, self.rows_k), done=True, info={"latency_s": took, "method": method}
        )

    async def close(self) -> None:
        return None
