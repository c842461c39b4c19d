"""The classical baselines of job-shop scheduling, used from job-shop-lib rather than rewritten: its
dispatching rules (SPT, MWKR, MOR, with its default ready-operation filters) and its OR-Tools CP-SAT
model under a time limit. Each returns the makespan, checked as a complete schedule by job-shop-lib."""

from __future__ import annotations

import time

from schedrl.envs.scheduling.instances import Instance, require_jsl

RULES = {
    "spt": "shortest_processing_time",
    "mwkr": "most_work_remaining",
    "mor": "most_operations_remaining",
}


def rule_makespan(inst: Instance, rule: str) -> float:
    """The makespan of dispatching rule `rule` (spt, mwkr or mor)."""
    require_jsl()
    from job_shop_lib.dispatching.rules import DispatchingRuleSolver  # pyright: ignore[reportMissingImports]  # the jssp extra

    if rule not in RULES:
        raise ValueError(f"unknown dispatching rule {rule!r}; known: {', '.join(RULES)}")
    schedule = DispatchingRuleSolver(dispatching_rule=RULES[rule]).solve(inst.to_jsl())
    return float(schedule.makespan())


def cpsat_makespan(inst: Instance, seconds: float) -> tuple[float, float, str]:
    """(makespan, seconds used, status) of CP-SAT under a time limit, on all cores (its default)."""
    require_jsl()
    from job_shop_lib.constraint_programming import ORToolsSolver  # pyright: ignore[reportMissingImports]  # the jssp extra

    start = time.perf_counter()
    schedule = ORToolsSolver(max_time_in_seconds=seconds).solve(inst.to_jsl())
    return float(schedule.makespan()), time.perf_counter() - start, str(schedule.metadata.get("status", ""))


def checked_makespan(inst: Instance, sequences: list[list[int]]) -> float:
    """The makespan job-shop-lib computes for machine sequences (jobs in order on each machine): an
    independent check of a schedule built elsewhere (it raises on an infeasible one)."""
    jsl = require_jsl()
    schedule = jsl.Schedule.from_job_sequences(inst.to_jsl(), sequences)
    if not schedule.is_complete():
        raise ValueError(f"the sequences do not schedule every operation of {inst.name}")
    return float(schedule.makespan())


def gap(makespan: float, reference: float) -> float:
    """The optimality gap in percent against a reference makespan (the best known bound)."""
    return 100.0 * (makespan - reference) / reference
