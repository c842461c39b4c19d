"""`schedrl simulate SCENARIO --search`: rank schedules for one cluster by simulated steps per second.

The cluster, the model and the workload stay the scenario's; the schedule's knobs move:

    placement     colocated, or disaggregated with each rollout share of the GPUs (eighths, in whole engines)
    staleness     k from 0 to the bound (the scenario's own k unless `--bound` says otherwise)
    consumption   wave, or partial with 1.25x, 1.5x or 2x a step's samples in flight
    weight sync   drain, inflight, cut_resume, and any other registered policy
    admission     fcfs, lpt (with the scenario's predictor error)
    groups        whole to one engine, or divided
    migration     none, or long-tail migration (an engine that runs dry takes half the busiest one's)
    tool wait     multi-turn workloads: release, pin, priority and any other registered policy but lockstep

Coordinate descent: from the scenario's schedule, each knob in turn is set to its best value with the
others held, until a full round changes nothing (at most `rounds`). Every schedule simulated is kept
and ranked; a schedule the simulator refuses (a split that leaves no whole engine) is skipped. The
bound on staleness is never crossed, and the scenario's `stale` rule is kept: a faster schedule found
here trains on samples no older than the one it is compared with.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from schedrl.config import ConfigError, Schedule
from schedrl.orchestrate.weight_sync import WEIGHT_SYNC
from schedrl.registry import Registry
from schedrl.rollout.tool_wait import TOOL_WAITS
from schedrl.sim.cluster import SimResult, simulate
from schedrl.sim.scenario import Scenario, scenario_from_dict

Sets = tuple[tuple[str, Any], ...]  # dotted key -> value, sorted


@dataclass
class Ranked:
    sets: Sets
    scenario: Scenario
    result: SimResult

    @property
    def steps_per_s(self) -> float:
        return self.result.steps_per_s

    def describe(self) -> str:
        return describe(self.scenario)


def describe(s: Scenario) -> str:
    """A schedule in one line: placement, k, consumption, weight sync, admission, groups, migration and
    (multi-turn) the tool-wait policy."""
    c, sch = s.cluster, s.schedule
    place = "colocated" if c.placement == "colocated" else f"split {c.rollout_gpus}:{c.gpus - c.rollout_gpus}"
    out = f"{place} {schedule_text(sch)} {sch.admission}"
    out += (" divided" if sch.divide_groups else "") + (" migrate" if sch.migrate else "")
    return out + (f" {sch.tool_wait}" if s.workload.turns > 1 else "")


def schedule_text(sch: Schedule) -> str:
    """k, consumption (with its arguments) and weight sync; "sync" for the synchronous loop's schedule."""
    args = "".join(f" x{v:g}" for v in sch.consumption_args.values() if isinstance(v, int | float))
    if sch.max_staleness == 0 and sch.weight_sync == "drain" and sch.consumption in ("wave", "tail"):
        return "sync" + (f" tail{args}" if sch.consumption == "tail" else "")
    return f"k={sch.max_staleness} {sch.consumption}{args} {sch.weight_sync}"


def knobs(s: Scenario, bound: int) -> dict[str, list[dict[str, Any]]]:
    """Each knob's values, as the dotted keys each one sets."""
    c = s.cluster
    splits: list[dict[str, Any]] = [{"cluster.placement": "colocated"}]
    shares = sorted({round(c.gpus * i / 8 / c.gpus_per_engine) * c.gpus_per_engine for i in range(1, 8)})
    splits += [
        {"cluster.placement": "disaggregated", "cluster.rollout_gpus": r} for r in shares if 0 < r < c.gpus
    ]
    return {
        "placement": splits,
        "staleness": [{"schedule.max_staleness": k} for k in range(bound + 1)],
        "consumption": [{"schedule.consumption": "wave", "schedule.consumption_args": {}}]
        + [
            {"schedule.consumption": "partial", "schedule.consumption_args": {"overprovision": x}}
            for x in (1.25, 1.5, 2.0)
        ],
        "weight sync": [
            {"schedule.weight_sync": w} for w in registered(WEIGHT_SYNC, ("drain", "inflight", "cut_resume"))
        ],
        "admission": [{"schedule.admission": a} for a in ("fcfs", "lpt")],
        "groups": [{"schedule.divide_groups": d} for d in (False, True)],
        "migration": [{"schedule.migrate": m} for m in (False, True)],
        **(
            {
                "tool wait": [
                    {"schedule.tool_wait": w} for w in registered(TOOL_WAITS, ("release", "pin", "priority"))
                ]
            }
            if s.workload.turns > 1
            else {}
        ),
    }


def registered(registry: Registry, first: tuple[str, ...]) -> list[str]:
    """The shipped policies in their order, then every other registered one (a policy registered once is
    searched too); lock-step tool waits, the baseline the others are measured against, are left out."""
    return [*first, *(n for n in registry.names() if n not in first and n != "lockstep")]


def start_point(s: Scenario) -> dict[str, Any]:
    """The scenario's schedule as the dotted keys the search moves (tail batching, a synchronous schedule,
    as wave)."""
    c, sch = s.cluster, s.schedule
    if sch.consumption == "tail":
        sch = dataclasses.replace(sch, consumption="wave", consumption_args={})
    out: dict[str, Any] = {
        "cluster.placement": c.placement,
        "schedule.max_staleness": sch.k_bound,
        "schedule.staleness_args": {},
        "schedule.consumption": sch.consumption,
        "schedule.consumption_args": sch.consumption_args,
        "schedule.weight_sync": sch.weight_sync,
        "schedule.admission": sch.admission,
        "schedule.divide_groups": sch.divide_groups,
        "schedule.migrate": sch.migrate,
    }
    if s.workload.turns > 1:
        out["schedule.tool_wait"] = "release" if sch.tool_wait == "lockstep" else sch.tool_wait
        out["schedule.tool_wait_args"] = {} if sch.tool_wait == "lockstep" else sch.tool_wait_args
    if c.placement == "disaggregated":
        out["cluster.rollout_gpus"] = c.rollout_gpus
    return out


def search(
    data: dict[str, Any],
    base_sets: list[str],
    start: Scenario,
    bound: int,
    rounds: int = 4,
    progress: Callable[[int], None] | None = None,
) -> list[Ranked]:
    """Every schedule the descent simulated, fastest first. `data` and `base_sets` build the scenario
    (a file's base and its variant's `set` lines); `start` is where the descent begins."""
    tried: dict[str, Ranked | None] = {}  # by the point's keys and values as JSON (arguments are dicts)

    def run(point: dict[str, Any]) -> Ranked | None:
        if point.get("cluster.placement") == "colocated":
            point = {k: v for k, v in point.items() if k != "cluster.rollout_gpus"}
        items: Sets = tuple(sorted(point.items()))
        key = json.dumps(items, sort_keys=True)
        if key not in tried:
            sets = [*base_sets, *(f"{k}={json.dumps(v)}" for k, v in items)]
            try:
                s = scenario_from_dict(data, sets, where="search")
                tried[key] = Ranked(items, s, simulate(s))
            except (ConfigError, RuntimeError):
                tried[key] = None
            if progress is not None:
                progress(len(tried))
        return tried[key]

    point = start_point(start)
    if point["schedule.max_staleness"] > bound:
        point["schedule.max_staleness"] = bound
    best = run(point)
    if best is None:
        raise ValueError("search: the scenario's own schedule does not simulate")
    options = knobs(start, bound)
    for _ in range(rounds):
        moved = False
        for values in options.values():
            for v in values:
                cand = run({**point, **v})
                if cand is not None and cand.steps_per_s > best.steps_per_s * (1 + 1e-9):
                    best, point, moved = cand, {**point, **v}, True
        if not moved:
            break
    ranked = [r for r in tried.values() if r is not None]
    return sorted(ranked, key=lambda r: -r.steps_per_s)


def ranking_html(rows: list[tuple[str, str, float, float]]) -> str:
    """The ranking as an HTML table: (rank or label, schedule, step seconds, speedup over the reference)."""
    import html

    body = "".join(
        f"<tr><td>{html.escape(rank)}</td><td style='text-align:left'>{html.escape(text)}</td>"
        f"<td>{step:.2f}</td><td>{ratio:.3f}x</td></tr>"
        for rank, text, step, ratio in rows
    )
    return (
        "<h2>Schedules ranked by simulated step time</h2>"
        "<table><tr><th>rank</th><th>schedule</th><th>step s</th><th>vs best published</th></tr>"
        f"{body}</table>"
    )
