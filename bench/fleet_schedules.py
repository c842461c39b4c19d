"""Divided groups (Seer) and long-tail migration (JigsawRL) in the real engine fleet, beside the
simulator's prediction for the same schedules.

Runs of `examples/async_threads.yaml` (the tiny model after 300 SFT steps on the `longtail` mix, where a
group's 8 samples share one prompt, so a long sort's samples are long together), one after another:

  sync              the synchronous loop on one torch thread: the simulator is calibrated on it
  whole             the asynchronous pipeline on threads with two engine workers, k = 0 (generation
                    and training take turns, so the two engines have both cores while they generate);
                    each group goes whole to the engine holding fewer requests
  divided           the same, each request on its own (`schedule.divide_groups`)
  divided_migrate   divided, and an engine that runs dry takes half of the other's requests
                    (`schedule.migrate`; the moved requests resume from their prefixes there)

Then `schedrl simulate --calibrate` fits the engine and learner costs to the sync run and predicts each
two-engine run's mean step time. The gains (whole's step time over divided's, and over
divided_migrate's) are printed measured and predicted.

    python bench/fleet_schedules.py                 # about 5 minutes on 2 cores
    python bench/fleet_schedules.py --runs DIR      # reuse the runs in DIR

The last line is one JSON object: `measured_gain_divided`, `predicted_gain_divided`,
`measured_gain_migrate`, `predicted_gain_migrate`, each run's step time measured and simulated, and the
requests migrated per step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "async_threads.yaml"
COMMON = ["sft.steps=300", "eval.tasks=16", "eval.k=1", "save_every=0"]
TWO = ["pipeline.num_engines=2", "schedule.max_staleness=0", "algo.correction=none"]
RUNS = {
    "sync": ["pipeline.mode=sync"],
    "whole": TWO,
    "divided": [*TWO, "schedule.divide_groups=true"],
    "divided_migrate": [*TWO, "schedule.divide_groups=true", "schedule.migrate=true"],
}


def schedrl(cwd: Path, *args: str, env: dict | None = None) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "schedrl.cli", *args], capture_output=True, text=True, env=env, cwd=cwd
    )
    if out.returncode != 0:
        raise SystemExit(f"schedrl {' '.join(args)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return out.stdout


def metric(run: Path, key: str) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [float(r[key]) for r in rows if key in r]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--runs", type=Path, default=None, help="a directory holding runs/sync, runs/whole, ...")
    ap.add_argument("--steps", type=int, default=60, help="RL steps per run")
    ap.add_argument("--model", choices=("tiny", "small"), default="tiny")
    ap.add_argument(
        "--backend",
        choices=("threads", "ray"),
        default="ray",
        help="the two-engine runs' workers: Ray actors (processes) or threads of one process",
    )
    a = ap.parse_args()
    work = a.runs or ROOT / "bench" / "out" / "fleet_schedules"
    work.mkdir(parents=True, exist_ok=True)
    for name, sets in RUNS.items():
        if (work / "runs" / name / "metrics.jsonl").is_file():
            continue
        env = (
            {**os.environ, "OMP_NUM_THREADS": "1"}
            if name == "sync"
            else {**os.environ, "RAY_AUTH_MODE": "disabled"}
        )
        start = time.perf_counter()
        backend = [] if name == "sync" else [f"pipeline.backend={a.backend}"]
        sets = [*COMMON, f"steps={a.steps}", f"model.preset={a.model}", f"name={name}", *sets, *backend]
        schedrl(work, "train", str(RECIPE), *[x for s in sets for x in ("--set", s)], env=env)
        print(f"{name}: trained in {time.perf_counter() - start:.0f} s", flush=True)
    runs = [work / "runs" / n for n in RUNS]
    out = json.loads(
        schedrl(work, "simulate", "--calibrate", *map(str, runs), "--json").strip().splitlines()[-1]
    )
    step = {}
    for name, sc in zip(RUNS, out["scenarios"], strict=True):
        m = sc["measured"]["step_s"]
        step[name] = {"measured": m["measured"], "simulated": m["simulated"], "rel_error": m["rel_error"]}
        print(f"  {name:<16} measured {m['measured']:.4f} s  simulated {m['simulated']:.4f} s  "
              f"error {m['rel_error']:+.1%}")  # fmt: skip
    moved = metric(work / "runs" / "divided_migrate", "migrated")

    def gain(kind: str, other: str) -> float:
        return round(step["whole"][kind] / step[other][kind], 4)

    summary = {
        "model": a.model,
        "backend": a.backend,
        "measured_gain_divided": gain("measured", "divided"),
        "predicted_gain_divided": gain("simulated", "divided"),
        "measured_gain_migrate": gain("measured", "divided_migrate"),
        "predicted_gain_migrate": gain("simulated", "divided_migrate"),
        "migrated_per_step": round(statistics.fmean(moved), 2) if moved else 0.0,
        "step_s": {n: {k: round(v, 4) for k, v in s.items()} for n, s in step.items()},
    }
    print(
        f"\nwhole / divided: measured {summary['measured_gain_divided']:.3f}x, predicted "
        f"{summary['predicted_gain_divided']:.3f}x; whole / divided + migrate: measured "
        f"{summary['measured_gain_migrate']:.3f}x, predicted {summary['predicted_gain_migrate']:.3f}x "
        f"({summary['migrated_per_step']} requests moved a step)"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
