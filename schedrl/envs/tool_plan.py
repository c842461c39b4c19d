"""`tool_plan` (TPS-Bench's tool planning and scheduling, and SGH's static plan): the model writes the
whole plan of tool calls up front; a harness executes it; the reward is right answer x plan efficiency.

A problem is a sum of two or three tool results: ``"sq 3+inc 4="`` (9 + 5). The answer is a plan of
stages separated by ``;``, each a set of calls separated by ``,`` that the harness runs at once; a
call binds a letter to a tool's result, and its arguments are numbers or letters bound in an earlier
stage: ``a=sq 3,b=inc 4;c=sum a b``. The plan's last call gives the answer. The tools take time: `sq`
2 units, `inc` and `sum` 1. A plan's makespan is the sum over its stages of the stage's longest call,
and the best plan runs every leaf call in the first stage and `sum` in the second. A plan scores

    reward = [its answer is right and it calls exactly the problem's leaf tools] x best / makespan

so the sequential plan ``a=sq 3;b=inc 4;c=sum a b`` (makespan 4) earns 0.75 and the parallel one 1.
Anything that does not parse, reads a letter before its stage, computes a leaf itself, or answers wrong
scores 0.

The harness really runs each plan: a call is a coroutine that sleeps its duration (`UNIT_S` a unit), a
stage is gathered, and a batch's plans run concurrently in one event loop. The wall time each plan took
is logged (`plan/wall_ms_mean`, with `plan/units_mean`, `plan/optimal_frac`); the reward uses the
makespan in units, which the measured time follows, so a seeded run stays exactly reproducible.

References: TPS-Bench (tool planning and scheduling: parallel against sequential calls); SGH (an explicit
plan executed by a harness instead of an agent loop).
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from schedrl.envs.base import GeneratedTasks, Task, check_int_range, stable_hash, task_id

UNITS = {"sq": 2, "inc": 1, "sum": 1}
LEAVES = {"sq": lambda x: x * x, "inc": lambda x: x + 1}
UNIT_S = 0.005  # seconds a unit of tool time takes in the harness
_CALL = re.compile(r"([a-z])=(sq|inc|sum)((?: [a-z0-9]+)+)")


@dataclass(frozen=True)
class Call:
    var: str
    tool: str
    args: tuple[str, ...]


def parse_plan(text: str) -> list[list[Call]] | None:
    """The stages of `text` (``"a=sq 3,b=inc 4;c=sum a b"``), or None when it is not a plan."""
    stages = []
    for stage in text.strip().split(";"):
        calls = []
        for call in stage.split(","):
            m = _CALL.fullmatch(call.strip())
            if m is None:
                return None
            calls.append(Call(m.group(1), m.group(2), tuple(m.group(3).split())))
        stages.append(calls)
    return stages if stages and stages[-1] else None


def leaves(prompt: str) -> list[tuple[str, int]]:
    """The problem's leaf calls: ``"sq 3+inc 4="`` -> [("sq", 3), ("inc", 4)]."""
    return [(t.split()[0], int(t.split()[1])) for t in prompt.removesuffix("=").split("+")]


def best_units(prompt: str) -> int:
    """The best plan's makespan: every leaf at once, then the sum."""
    return max(UNITS[tool] for tool, _ in leaves(prompt)) + UNITS["sum"]


def makespan(stages: list[list[Call]]) -> int:
    return sum(max(UNITS[c.tool] for c in stage) for stage in stages)


def check(stages: list[list[Call]], prompt: str) -> str | None:
    """What makes `stages` not a plan for the problem `prompt` (None: it is one): a letter read before
    its stage or bound twice, a leaf call on a letter or a sum on a number, other leaf calls than the
    problem's."""
    bound: set[str] = set()
    for stage in stages:
        new = [c.var for c in stage]
        if len(set(new)) != len(new) or bound & set(new):
            return "a letter bound twice"
        for c in stage:
            if c.tool == "sum" and not all(a in bound for a in c.args):
                return f"sum reads {' '.join(c.args)} before they are bound"
            if c.tool != "sum" and (len(c.args) != 1 or not c.args[0].isdigit()):
                return f"{c.tool} takes one number"
        bound |= set(new)
    calls = Counter((c.tool, int(c.args[0])) for s in stages for c in s if c.tool != "sum")
    if calls != Counter(leaves(prompt)):
        return "not the problem's leaf calls"
    return None


async def execute(stages: list[list[Call]]) -> tuple[int, float]:
    """Run the plan: each stage's calls at once, each sleeping its tool's time; (answer, wall seconds)."""
    values: dict[str, int] = {}

    async def run(c: Call) -> tuple[str, int]:
        await asyncio.sleep(UNITS[c.tool] * UNIT_S)
        if c.tool == "sum":
            return c.var, sum(values[a] for a in c.args)
        return c.var, LEAVES[c.tool](int(c.args[0]))

    t0 = time.perf_counter()
    for stage in stages:
        values.update(await asyncio.gather(*(run(c) for c in stage)))
    return values[stages[-1][-1].var], time.perf_counter() - t0


async def _score_all(tasks: Sequence[Task], texts: Sequence[str]) -> list[tuple[float, int, float] | None]:
    """(reward, makespan, wall seconds) of each plan, all executed at once (None: not a plan)."""

    async def one(task: Task, text: str) -> tuple[float, int, float] | None:
        stages = parse_plan(text)
        if stages is None or check(stages, task.prompt) is not None:
            return None
        answer, wall = await execute(stages)
        units = makespan(stages)
        right = answer == int(task.answer)
        return (best_units(task.prompt) / units if right else 0.0), units, wall

    return list(await asyncio.gather(*(one(t, x) for t, x in zip(tasks, texts, strict=True))))


def score_plans(tasks: Sequence[Task], texts: Sequence[str]) -> list[tuple[float, int, float] | None]:
    """`_score_all` on an event loop of its own (the caller may be running one)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _score_all(tasks, texts)).result()


class ToolPlanTask(GeneratedTasks):
    """A sum of tool results, answered with a staged plan; right answer x best makespan / its makespan."""

    name = "tool_plan"

    def __init__(self, min_leaves: int = 2, max_leaves: int = 3, sequential_demos: float = 0.5) -> None:
        self.min_leaves = check_int_range(self.name, "min_leaves", min_leaves, 2, 6)
        self.max_leaves = check_int_range(self.name, "max_leaves", max_leaves, self.min_leaves, 6)
        if not 0.0 <= sequential_demos <= 1.0:
            raise ValueError(
                f"task 'tool_plan': sequential_demos must be in [0, 1], got {sequential_demos!r}"
            )
        self.sequential_demos = sequential_demos

    def candidate(self, rng: random.Random) -> Task:
        k = rng.randint(self.min_leaves, self.max_leaves)
        calls = [(rng.choice(list(LEAVES)), rng.randint(1, 9)) for _ in range(k)]
        prompt = "+".join(f"{tool} {x}" for tool, x in calls) + "="
        answer = sum(LEAVES[tool](x) for tool, x in calls)
        return Task(task_id("plan", prompt), prompt, str(answer), domain=self.name)

    def reward(self, task: Task, completion: str) -> float:
        out = score_plans([task], [completion])[0]
        return 0.0 if out is None else out[0]

    def reward_batch(
        self, tasks: Sequence[Task], completions: Sequence[str], completion_ids: Sequence[Sequence[int]]
    ) -> tuple[list[float], dict[str, float], list[str | None]]:
        outs = score_plans(tasks, completions)
        plans = [o for o in outs if o is not None]
        metrics = {"plan/valid_frac": len(plans) / max(1, len(outs))}
        if plans:
            metrics["plan/units_mean"] = sum(u for _, u, _ in plans) / len(plans)
            metrics["plan/wall_ms_mean"] = 1000 * sum(w for _, _, w in plans) / len(plans)
            metrics["plan/optimal_frac"] = sum(r >= 1.0 for r, _, _ in plans) / len(plans)
        return [0.0 if o is None else o[0] for o in outs], metrics, [None] * len(outs)

    def solution(self, task: Task) -> str:
        """A right plan for the warm-up: the best one (every leaf in the first stage, their sum in the
        second), or, for a `sequential_demos` share of the problems, one call per stage, as an agent loop
        calls tools."""
        calls = leaves(task.prompt)
        names = "abcdef"[: len(calls)]
        sep = ";" if stable_hash(f"demo:{task.prompt}") % 1000 < 1000 * self.sequential_demos else ","
        first = sep.join(f"{v}={tool} {x}" for v, (tool, x) in zip(names, calls, strict=True))
        return f"{first};z=sum {' '.join(names)}"
