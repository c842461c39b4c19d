"""`schedrl simulate SCENARIO`: run a scenario (or each of its variants), print step time and idle
fractions, and compare them with the figures it records under `measured:` (published or measured)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import yaml

from schedrl.sim.cluster import SimResult, simulate
from schedrl.sim.scenario import Scenario, load_variants, variants_from_dict
from schedrl.timeline import TIMELINE_FILE, append_spans

GANTT_ENGINES = 16  # engines drawn in the timeline (all of them count in the fractions)
COMPARED = ("step_s", "gen_s", "steps_per_s", "engine_busy_frac", "learner_busy_frac")


def simulated_figures(s: Scenario, r: SimResult) -> dict[str, float]:
    gen = r.gen_s[s.warmup_steps :] or r.gen_s
    return {
        "step_s": r.mean_step_s,
        "steps_per_s": r.steps_per_s,
        "gen_s": statistics.fmean(gen) if gen else float("nan"),
        "engine_busy_frac": r.engine_busy_frac,
        "learner_busy_frac": r.learner_busy_frac,
    }


def compare_measured(s: Scenario, r: SimResult) -> dict[str, dict[str, float]]:
    """measured key -> {measured, simulated, rel_error} for the keys the simulation reports."""
    sim = simulated_figures(s, r)
    out = {}
    for key, value in s.measured.items():
        if key in sim and isinstance(value, (int, float)) and value:
            out[key] = {
                "measured": float(value),
                "simulated": sim[key],
                "rel_error": (sim[key] - value) / value,
            }
    return out


def write_outputs(out: Path, r: SimResult, summary: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    keep = {f"engine-{i}" for i in range(GANTT_ENGINES)} | {"learner"}
    (out / TIMELINE_FILE).unlink(missing_ok=True)
    append_spans(out / TIMELINE_FILE, [sp for sp in r.spans if sp.worker in keep])
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    from schedrl.report import write_report

    write_report(out)


def run_one(s: Scenario) -> tuple[SimResult, dict]:
    start = time.perf_counter()
    r = simulate(s)
    wall = time.perf_counter() - start
    summary = {
        **r.summary(),
        "gen_s": round(simulated_figures(s, r)["gen_s"], 4),
        "step_s": [round(x, 4) for x in r.step_s],
        "num_engines": s.num_engines,
        "learner_gpus": s.learner_gpus,
        "wall_s": round(wall, 3),
        "wall_s_per_step": round(wall / s.steps, 4),
        "measured": compare_measured(s, r),
    }
    return r, summary


def _cells(m: dict, key: str, value: float, width: int) -> str:
    """The simulated figure, and the measured one with the relative error where there is one."""
    if key not in m:
        return f"{value:>{width}.4g}{'':>10}{'':>8}"
    return f"{value:>{width}.4g}{m[key]['measured']:>10.4g}{m[key]['rel_error']:>+8.1%}"


def run_simulate(args, console) -> int:
    if args.calibrate:
        from schedrl.sim.calibrate import calibrate, interference, variant_of

        data = calibrate(args.calibrate[0])
        if args.interference_from:
            engine_f, learner_f = interference(args.calibrate[0], args.interference_from)
            data["cluster"]["engine_interference"] = round(engine_f, 4)
            data["cluster"]["learner_interference"] = round(learner_f, 4)
        data["variants"] = {Path(run).name: variant_of(run) for run in args.calibrate}
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "calibrated.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        label = f"calibrated on {args.calibrate[0]}"
        scenarios = variants_from_dict(data, args.overrides, label)
    elif args.scenario is None:
        raise ValueError("schedrl simulate needs a SCENARIO file or --calibrate RUN_DIR [RUN_DIR ...]")
    else:
        label = args.scenario
        scenarios = load_variants(args.scenario, args.overrides)
    results = [run_one(s) for s in scenarios]
    errors = [abs(sm["measured"]["step_s"]["rel_error"]) for _, sm in results if "step_s" in sm["measured"]]
    if args.out:
        for (r, summary), s in zip(results, scenarios, strict=True):
            sub = Path(args.out) if len(scenarios) == 1 else Path(args.out) / s.name.split(": ")[-1]
            write_outputs(sub, r, summary)
    if args.json:
        out = {"scenarios": [sm for _, sm in results]}
        if errors:
            out["median_step_error"] = statistics.median(errors)
            out["max_step_error"] = max(errors)
        print(json.dumps(out))
        return 0
    # plain columns: a rich table would fold them at 80 characters
    head = f"{'variant':<22}{'schedule':<30}{'GPUs':>8}{'step s':>9}{'measured':>10}{'error':>8}"
    head += f"{'gen s':>8}{'measured':>10}{'error':>8}{'busy eng/lrn':>14}{'stale':>7}{'dropped':>9}"
    lines = [str(label), head]
    for (r, sm), s in zip(results, scenarios, strict=True):
        sch, c = s.schedule, s.cluster
        schedule = (
            "sync" if sch.mode == "sync" else f"k={sch.max_staleness} {sch.weight_sync}/{sch.consumption}"
        )
        schedule += f" {sch.admission}"
        gpus = f"{c.gpus}" if c.placement == "colocated" else f"{c.rollout_gpus}:{c.gpus - c.rollout_gpus}"
        m = sm["measured"]

        busy = f"{r.engine_busy_frac:.0%}/{r.learner_busy_frac:.0%}"
        lines.append(
            f"{s.name.split(': ')[-1][:21]:<22}{schedule[:29]:<30}{gpus:>8}{_cells(m, 'step_s', r.mean_step_s, 9)}"
            f"{_cells(m, 'gen_s', sm['gen_s'], 8)}{busy:>14}{r.mean_staleness:>7.2f}{r.dropped:>9}"
        )
    console.print("\n".join(lines), soft_wrap=True, highlight=False, markup=False)
    wall = sum(sm["wall_s"] for _, sm in results)
    steps = sum(s.steps for s in scenarios)
    console.print(f"simulated {steps} steps in {wall:.2f} s ({wall / steps:.3f} s per step)")
    if errors:
        console.print(
            f"step time error against measured: median {statistics.median(errors):.1%}, max {max(errors):.1%}"
        )
    if args.out:
        console.print(f"timelines: {args.out}")
    return 0
