"""`schedrl simulate SCENARIO`: run a scenario (or each of its variants), print step time and idle
fractions, and compare them with the figures it records under `measured:` (published or measured)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import yaml

from schedrl.config import read_recipe
from schedrl.sim.cluster import SimResult, simulate
from schedrl.sim.scenario import (
    Claim,
    Scenario,
    claims_from_dict,
    scenario_from_dict,
    variant_sources,
    variants_from_dict,
)
from schedrl.sim.search import schedule_text
from schedrl.timeline import TIMELINE_FILE, append_spans

GANTT_ENGINES = 16  # engines drawn in the timeline (all of them count in the fractions)


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


def check_claims(claims: list[Claim], results: dict[str, SimResult]) -> list[dict]:
    """Each claim's simulated ratio against the published one, and whether the direction holds."""
    out = []
    for c in claims:
        a, b = (getattr(results[v], c.metric) for v in (c.variant, c.over))
        ratio = a / b if b > 0 else float("inf")
        out.append(
            {
                "claim": c.name,
                "metric": c.metric,
                "simulated": round(ratio, 4),
                "published": c.published,
                "rel_error": round(ratio / c.published - 1, 4),
                "direction": (ratio > 1) == (c.published > 1),
            }
        )
    return out


def write_outputs(out: Path, r: SimResult, summary: dict, extra_html: str = "") -> None:
    out.mkdir(parents=True, exist_ok=True)
    keep = {f"engine-{i}" for i in range(GANTT_ENGINES)} | {"learner"}
    (out / TIMELINE_FILE).unlink(missing_ok=True)
    append_spans(out / TIMELINE_FILE, [sp for sp in r.spans if sp.worker in keep])
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    from schedrl.gantt import write_report

    write_report(out, extra_html)


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


def run_search(args, console) -> int:
    """`--search`: coordinate descent over the schedule of one variant's cluster, against the file's
    published policies on that cluster at the same staleness bound."""
    from rich.progress import Progress

    from schedrl.sim.search import describe, ranking_html, search

    data = read_recipe(args.scenario)
    sources = variant_sources(data, str(args.scenario))
    name = args.variant or next(iter(sources))
    if name not in sources:
        raise ValueError(f"--variant {name!r}: {args.scenario} has the variants {', '.join(sources)}")
    base, sets = sources[name]
    start = scenario_from_dict(base, [*sets, *args.overrides], where=f"{args.scenario} (variant {name!r})")
    bound = args.bound if args.bound is not None else start.schedule.k_bound

    # the published policies: the file's variants on the same cluster and workload (a tool-wait policy
    # is a schedule), within the bound
    published = []
    for other, (b, o_sets) in sources.items():
        s = scenario_from_dict(b, [*o_sets, *args.overrides], where=f"{args.scenario} (variant {other!r})")
        same = s.cluster.gpus == start.cluster.gpus and s.workload == start.workload
        if same and s.schedule.k_bound <= bound:
            published.append((other, s, simulate(s)))
    ref_name, ref_s, ref = max(published, key=lambda p: p[2].steps_per_s)
    with Progress(console=console, transient=True, disable=args.json) as bar:
        task = bar.add_task("schedules simulated", total=None)
        ranked = search(
            base, [*sets, *args.overrides], start, bound, progress=lambda n: bar.update(task, completed=n)
        )
    best = ranked[0]
    speedup = best.steps_per_s / ref.steps_per_s
    rows = [
        (f"{i + 1}", r.describe(), r.result.mean_step_s, r.steps_per_s / ref.steps_per_s)
        for i, r in enumerate(ranked[:12])
    ]
    rows += [
        (f"published: {n}", describe(s), r.mean_step_s, r.steps_per_s / ref.steps_per_s)
        for n, s, r in published
    ]
    best_sets = [f"{k}={json.dumps(v)}" for k, v in best.sets]
    out = {
        "variant": name,
        "bound": bound,
        "simulated": len(ranked),
        "best": {"schedule": best.describe(), "set": best_sets, **best.result.summary()},
        "best_published": {"variant": ref_name, "schedule": describe(ref_s), **ref.summary()},
        "search_vs_best_published": round(speedup, 4),
        "ranking": [
            {"rank": rank, "schedule": t, "step_s": round(st, 4), "vs_best_published": round(x, 4)}
            for rank, t, st, x in rows
        ],
    }
    if args.out:
        write_outputs(Path(args.out), best.result, out, ranking_html(rows))
    if args.json:
        print(json.dumps(out))
        return 0
    lines = [
        f"{args.scenario}: the cluster of {name!r} ({start.cluster.gpus} GPUs), staleness bound k <= {bound}"
    ]
    lines.append(f"{'rank':<22}{'schedule':<52}{'step s':>9}{'vs best published':>19}")
    lines += [
        f"{rank[:21]:<22}{text[:51]:<52}{step:>9.4g}{ratio:>18.3f}x" for rank, text, step, ratio in rows
    ]
    lines.append(f"simulated {len(ranked)} schedules; best: {best.describe()}")
    lines.append("  --set " + " --set ".join(best_sets))
    lines.append(f"search_vs_best_published: {speedup:.3f} (best published: {ref_name}, {describe(ref_s)})")
    console.print("\n".join(lines), soft_wrap=True, highlight=False, markup=False)
    if args.out:
        console.print(f"report: {Path(args.out) / 'timeline.html'}")
    return 0


def run_simulate(args, console) -> int:
    if getattr(args, "search", False):
        if args.scenario is None or args.calibrate:
            raise ValueError("schedrl simulate --search needs a SCENARIO file (not --calibrate)")
        return run_search(args, console)
    if args.calibrate:
        from schedrl.sim.calibrate import calibrate, interference, variant_of

        data = calibrate(args.calibrate[0])
        if args.interference_from and getattr(args, "interference_bench", False):
            raise ValueError("give --interference-from or --interference-bench, not both")
        if args.interference_from or getattr(args, "interference_bench", False):
            if args.interference_from:
                engine_f, learner_f = interference(args.calibrate[0], args.interference_from)
            else:
                from schedrl.sim.contention import measure_interference

                engine_f, learner_f = measure_interference(args.calibrate[0])
                data["cluster"]["interference"] = "overlap"  # measured with both busy: only then
            console.print(f"interference: engine x{engine_f:.3f}, learner x{learner_f:.3f}")
            data["cluster"]["engine_interference"] = round(engine_f, 4)
            data["cluster"]["learner_interference"] = round(learner_f, 4)
        data["variants"] = {Path(run).name: variant_of(run) for run in args.calibrate}
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "calibrated.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        label = f"calibrated on {args.calibrate[0]}"
        scenarios = variants_from_dict(data, args.overrides, label)
        claims = []
    elif args.scenario is None:
        raise ValueError("schedrl simulate needs a SCENARIO file or --calibrate RUN_DIR [RUN_DIR ...]")
    else:
        label = args.scenario
        data = read_recipe(args.scenario)
        scenarios = variants_from_dict(data, args.overrides, str(args.scenario))
        claims = claims_from_dict(data, str(args.scenario))
    results = [run_one(s) for s in scenarios]
    by_variant = {s.variant: r for s, (r, _) in zip(scenarios, results, strict=True)}
    checked = check_claims(claims, by_variant)
    errors = [abs(sm["measured"]["step_s"]["rel_error"]) for _, sm in results if "step_s" in sm["measured"]]
    if args.out:
        for (r, summary), s in zip(results, scenarios, strict=True):
            sub = Path(args.out) if len(scenarios) == 1 else Path(args.out) / s.variant
            write_outputs(sub, r, summary)
    if args.json:
        out = {"scenarios": [sm for _, sm in results]}
        if errors:
            out["median_step_error"] = statistics.median(errors)
            out["max_step_error"] = max(errors)
        if checked:
            out["claims"] = checked
        print(json.dumps(out))
        return 0
    # plain columns: a rich table would fold them at 80 characters
    head = f"{'variant':<22}{'schedule':<30}{'GPUs':>8}{'step s':>9}{'measured':>10}{'error':>8}"
    head += f"{'gen s':>8}{'measured':>10}{'error':>8}{'busy eng/lrn':>14}{'stale':>7}{'dropped':>9}"
    lines = [str(label), head]
    for (r, sm), s in zip(results, scenarios, strict=True):
        sch, c = s.schedule, s.cluster
        schedule = schedule_text(sch)
        if s.workload.turns > 1:
            schedule += f" {sch.tool_wait}"
        schedule += f" {sch.admission}"
        gpus = f"{c.gpus}" if c.placement == "colocated" else f"{c.rollout_gpus}:{c.gpus - c.rollout_gpus}"
        m = sm["measured"]

        busy = f"{r.engine_busy_frac:.0%}/{r.learner_busy_frac:.0%}"
        lines.append(
            f"{s.variant[:21]:<22}{schedule[:29]:<30}{gpus:>8}{_cells(m, 'step_s', r.mean_step_s, 9)}"
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
    for c in checked:
        console.print(
            f"claim {c['claim']}: {c['metric']} simulated {c['simulated']:.3g}x, published {c['published']:.3g}x "
            f"({c['rel_error']:+.1%}; direction {'reproduced' if c['direction'] else 'NOT reproduced'})",
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
    if args.out:
        console.print(f"timelines: {args.out}")
    return 0
