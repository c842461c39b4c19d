"""A small job shop written out as text; the answer is an operation order or start times.

The prompt lists each job's operations in order as machine digit + duration, jobs separated by
`|`: `"js:18,26,05|03,23,11|01,21,12="` is job 0 on machine 1 for 8, then machine 2 for 6, then
machine 0 for 5, and so on. Two answer formats (`answer`):

- `order`: one job digit per operation, in dispatch order (`"102120210"`). Each job must appear
  once per operation; the verifier decodes the order as the semi-active schedule (every
  operation starts as soon as its job and its machine are free), which is always feasible, so
  the only violations are a wrong count or an unknown job.
- `starts`: the start time of every operation, job by job (`"0,8,14|0,3,10|3,6,8"`); the verifier
  checks each job's order and each machine's overlaps and names the first violation.

The reward is graded by the gap to the optimum (`gap`: optimum / makespan), which CP-SAT finds
once per instance (job-shop-lib's OR-Tools solver, the optional extra `schedrl[jssp]`) and which
is cached. Instances come from job-shop-lib's random generator: each job visits every machine
once, durations uniform in 1..`max_duration` (at most 9, one digit per duration).
"""

from __future__ import annotations

import random
from functools import lru_cache

import numpy as np

from schedrl.envs.base import Task, check_int_range, task_id
from schedrl.envs.scheduling.graded import PARSE_ERROR, GradedTask, Verdict, check_reward, parse_ints
from schedrl.envs.scheduling.instances import Instance, generate, require_jsl

FORMATS = ("order", "starts")


def write_prompt(inst: Instance) -> str:
    jobs = [
        "".join(f"{m}{d}," for m, d in zip(ms, ds, strict=True)).rstrip(",")
        for ms, ds in zip(inst.machines, inst.durations, strict=True)
    ]
    return "js:" + "|".join(jobs) + "="


def read_prompt(prompt: str) -> tuple[list[list[int]], list[list[int]]]:
    """(machines, durations) per job and operation."""
    jobs = prompt.removeprefix("js:").removesuffix("=").split("|")
    machines = [[int(op[0]) for op in job.split(",")] for job in jobs]
    durations = [[int(op[1:]) for op in job.split(",")] for job in jobs]
    return machines, durations


def decode_order(order: list[int], machines, durations) -> int:
    """The makespan of the semi-active schedule that dispatches operations in `order` (job ids)."""
    job_ready = [0] * len(machines)
    machine_ready: dict[int, int] = {}
    nxt = [0] * len(machines)
    for j in order:
        k = nxt[j]
        m, d = machines[j][k], durations[j][k]
        start = max(job_ready[j], machine_ready.get(m, 0))
        job_ready[j] = machine_ready[m] = start + d
        nxt[j] += 1
    return max(job_ready)


@lru_cache(maxsize=65536)
def optimum(prompt: str, seconds: float = 10.0) -> tuple[int, str]:
    """(optimal makespan, an optimal dispatch order) by CP-SAT, once per instance."""
    require_jsl()
    from job_shop_lib.constraint_programming import ORToolsSolver  # pyright: ignore[reportMissingImports]  # the jssp extra

    machines, durations = read_prompt(prompt)
    inst = Instance("text", np.array(machines), np.array(durations))
    schedule = ORToolsSolver(max_time_in_seconds=seconds).solve(inst.to_jsl())
    if schedule.metadata.get("status") != "optimal":
        raise RuntimeError(f"CP-SAT found no proven optimum for {prompt} in {seconds} s")
    ops = sorted((op.start_time, op.machine_id, op.operation.job_id) for m in schedule.schedule for op in m)
    order = "".join(str(j) for _, _, j in ops)
    return int(schedule.makespan()), order


class JobShopTextTask(GradedTask):
    """Schedule a small job shop given as text; the optimum is CP-SAT's, cached per instance."""

    name = "jssp_text"
    violations = ("count", "unknown", "precedence", "overlap")

    def __init__(
        self,
        min_jobs: int = 2,
        max_jobs: int = 3,
        machines: int = 3,
        max_duration: int = 9,
        answer: str = "order",
        reward: str = "gap",
    ) -> None:
        self.min_jobs = check_int_range(self.name, "min_jobs", min_jobs, 1, 10)
        self.max_jobs = check_int_range(self.name, "max_jobs", max_jobs, min_jobs, 10)
        self.machines = check_int_range(self.name, "machines", machines, 1, 10)
        self.max_duration = check_int_range(self.name, "max_duration", max_duration, 1, 9)
        if answer not in FORMATS:
            raise ValueError(f"task '{self.name}': answer must be order or starts, got {answer!r}")
        self.answer_format = answer
        self.reward_mode = check_reward(self.name, reward)
        require_jsl()

    def candidate(self, rng: random.Random) -> Task:
        n = rng.randint(self.min_jobs, self.max_jobs)
        inst = generate(n, self.machines, rng.getrandbits(31), (1, self.max_duration))
        prompt = write_prompt(inst)
        return Task(task_id("js", prompt), prompt, "", self.name, difficulty=float(n * self.machines))

    def solution(self, task: Task) -> str:
        _, order = optimum(task.prompt)
        if self.answer_format == "order":
            return order
        machines, durations = read_prompt(task.prompt)
        starts = _starts_of(order, machines, durations)
        return "|".join(",".join(map(str, s)) for s in starts)

    def verify(self, task: Task, completion: str) -> Verdict:
        machines, durations = read_prompt(task.prompt)
        if self.answer_format == "order":
            if not (completion.isdigit() and completion.isascii()):
                return PARSE_ERROR
            order = [int(c) for c in completion]
            for j in order:
                if j >= len(machines):
                    return Verdict(True, violation=f"unknown: job {j} is not in the instance")
            for j, ops in enumerate(machines):
                if order.count(j) != len(ops):
                    return Verdict(
                        True,
                        violation=f"count: job {j} is listed {order.count(j)} times, it has {len(ops)} operations",
                    )
            makespan = decode_order(order, machines, durations)
        else:
            rows = [parse_ints(r) for r in completion.split("|")]
            if any(r is None for r in rows):
                return PARSE_ERROR
            starts: list[list[int]] = [r for r in rows if r is not None]
            if len(starts) != len(machines) or any(
                len(s) != len(m) for s, m in zip(starts, machines, strict=False)
            ):
                return Verdict(True, violation="count: one start time per operation, job by job")
            bad = _violation(starts, machines, durations)
            if bad is not None:
                return Verdict(True, violation=bad)
            makespan = max(s[-1] + d[-1] for s, d in zip(starts, durations, strict=True))
        best, _ = optimum(task.prompt)
        return Verdict(True, True, quality=best / makespan, optimal=makespan == best)


def _starts_of(order: str, machines, durations) -> list[list[int]]:
    job_ready = [0] * len(machines)
    machine_ready: dict[int, int] = {}
    starts: list[list[int]] = [[] for _ in machines]
    for c in order:
        j = int(c)
        k = len(starts[j])
        m = machines[j][k]
        start = max(job_ready[j], machine_ready.get(m, 0))
        starts[j].append(start)
        job_ready[j] = machine_ready[m] = start + durations[j][k]
    return starts


def _violation(starts, machines, durations) -> str | None:
    for j, (s, d) in enumerate(zip(starts, durations, strict=True)):
        for k in range(1, len(s)):
            if s[k] < s[k - 1] + d[k - 1]:
                return f"precedence: job {j} operation {k} starts at {s[k]}, before operation {k - 1} ends at {s[k - 1] + d[k - 1]}"
    by_machine: dict[int, list[tuple[int, int, int, int]]] = {}
    for j, (s, ms, d) in enumerate(zip(starts, machines, durations, strict=True)):
        for k, (t, m, dur) in enumerate(zip(s, ms, d, strict=True)):
            by_machine.setdefault(m, []).append((t, t + dur, j, k))
    for m in sorted(by_machine):
        ops = sorted(by_machine[m])
        for a, b in zip(ops, ops[1:], strict=False):
            if b[0] < a[1]:
                return f"overlap: machine {m} runs job {a[2]} operation {a[3]} over [{a[0]}, {a[1]}) and job {b[2]} operation {b[3]} from {b[0]}"
    return None
