"""`schedrl simulate SCENARIO`: run a scenario, print its step time and idle fractions, and compare
them with the figures the scenario records under `measured:` (published or measured)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.table import Table

from schedrl.sim.cluster import SimResult, simulate
from schedrl.sim.scenario import Scenario, load_scenario
from schedrl.timeline import TIMELINE_FILE, append_spans

GANTT_ENGINES = 16  # engines drawn in the timeline (all of them count in the fractions)


def compare_measured(s: Scenario, r: SimResult) -> dict[str, dict[str, float]]:
    """measured key -> {measured, simulated, rel_error} for the keys the simulation reports."""
    simulated = {
        "step_s": r.mean_step_s,
        "steps_per_s": r.steps_per_s,
        "gen_s": sum(r.gen_s[s.warmup_steps :]) / max(1, len(r.gen_s) - s.warmup_steps),
        "engine_busy_frac": r.engine_busy_frac,
    }
    out = {}
    for key, value in s.measured.items():
        if key in simulated and isinstance(value, (int, float)):
            out[key] = {
                "measured": float(value),
                "simulated": simulated[key],
                "rel_error": (simulated[key] - value) / value,
            }
    return out


def write_outputs(out: Path, s: Scenario, r: SimResult, summary: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    keep = {f"engine-{i}" for i in range(GANTT_ENGINES)} | {"learner"}
    (out / TIMELINE_FILE).unlink(missing_ok=True)
    append_spans(out / TIMELINE_FILE, [sp for sp in r.spans if sp.worker in keep])
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    from schedrl.report import write_report

    write_report(out)


def run_simulate(args, console) -> int:
    s = load_scenario(args.scenario, args.overrides)
    start = time.perf_counter()
    r = simulate(s)
    wall = time.perf_counter() - start
    summary = {
        **r.summary(),
        "step_s": [round(x, 4) for x in r.step_s],
        "num_engines": s.num_engines,
        "learner_gpus": s.learner_gpus,
        "wall_s": round(wall, 3),
        "wall_s_per_step": round(wall / s.steps, 4),
        "measured": compare_measured(s, r),
    }
    if args.out:
        write_outputs(Path(args.out), s, r, summary)
    if args.json:
        print(json.dumps(summary))
        return 0
    sch = s.schedule
    title = (
        f"{s.name}: {s.cluster.gpus} GPUs ({s.cluster.placement}), {s.num_engines} engines, "
        f"{sch.mode} k={sch.max_staleness if sch.mode == 'async' else 0} {sch.weight_sync}/{sch.consumption}, "
        f"admission {sch.admission}"
    )
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("simulated", justify="right")
    table.add_column("measured", justify="right")
    table.add_column("error", justify="right")
    measured = summary["measured"]
    rows = [
        ("step_s", r.mean_step_s),
        ("steps_per_s", r.steps_per_s),
        ("gen_s", compare_measured(s, r).get("gen_s", {}).get("simulated", float("nan"))),
        ("engine_busy_frac", r.engine_busy_frac),
        ("learner_busy_frac", r.learner_busy_frac),
        ("mean_staleness", r.mean_staleness),
        ("dropped samples", float(r.dropped)),
    ]
    for key, value in rows:
        m = measured.get(key)
        table.add_row(
            key,
            f"{value:.4g}",
            f"{m['measured']:.4g}" if m else "",
            f"{m['rel_error']:+.1%}" if m else "",
        )
    console.print(table)
    console.print(f"simulated {s.steps} steps in {wall:.2f} s ({wall / s.steps:.3f} s per step)")
    if args.out:
        console.print(f"timeline: {Path(args.out) / 'timeline.html'}")
    return 0
