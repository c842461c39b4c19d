"""The simulator against real runs: calibrated on local runs, predicting the others; and its speed.

Four runs of `examples/async_threads.yaml` (80 RL steps after 300 SFT steps, the tiny model on the
`longtail` mix), one after another on this machine:

  sync              the synchronous loop (one torch thread, so it uses one core as each async worker)
  k2                the async pipeline on threads, k = 2, drain, wave
  partial_inflight  k = 2, partial consumption at 1.5x over-provision, in-flight weight updates
  tail              k = 0, drain, tail batching at eta 1.25 (RollPacker: short rounds, a long round
                    of the deferred prompts every fifth)

`schedrl simulate --calibrate` fits the engine, learner and sync costs to the sync run and predicts
each run's mean step time; a second calibration also measures the workers' slowdown on shared cores
with a microbenchmark of the run's engine and learner side by side (`--interference-bench`), applied
only while both work. Then the speed: seconds of wall-clock per simulated RL step for a
1,024-GPU scenario (512 engines, 512 learner GPUs, 8,192 samples per step).

    python bench/sim_calibration.py                 # about 4 minutes on 2 cores
    python bench/sim_calibration.py --runs DIR      # reuse the runs in DIR

The last line is one JSON object with `max_rel_error` (with interference, over the four runs),
`target_rel_error` (the same over the three runs the target names: sync, k2, partial_inflight),
`max_rel_error_sync_only` and `sim_s_per_step_1024`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "async_threads.yaml"
COMMON = ["steps=80", "sft.steps=300", "eval.tasks=16", "eval.k=1", "save_every=0"]
RUNS = {
    "sync": ["pipeline.mode=sync"],
    "k2": ["schedule.max_staleness=2"],
    "partial_inflight": [
        "schedule.max_staleness=2",
        "schedule.consumption=partial",
        "schedule.consumption_args={overprovision: 1.5}",
        "schedule.weight_sync=inflight",
    ],
    "tail": [
        "schedule.max_staleness=0",
        "schedule.consumption=tail",
        "schedule.consumption_args={eta: 1.25}",
    ],
}
TARGET = ("sync", "k2", "partial_inflight")  # the schedules the 10% target names
BIG = {
    "name": "1024-gpus",
    "steps": 4,
    "workload": {
        "prompts_per_step": 512,
        "group_size": 16,
        "prompt_tokens": 256,
        "lengths": {"kind": "lognormal", "median": 1500, "sigma": 1.0, "cap": 28672},
    },
    "cluster": {"gpus": 1024, "gpu": "h100", "placement": "disaggregated", "rollout_gpus": 512},
    "schedule": {"max_staleness": 1},
    "learner": {"tokens_per_s_per_gpu": 1500},
}


def schedrl(*args: str, env: dict | None = None) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "schedrl.cli", *args], capture_output=True, text=True, env=env, cwd=args_cwd
    )
    if out.returncode != 0:
        raise SystemExit(f"schedrl {' '.join(args)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return out.stdout


def main() -> None:
    global args_cwd
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=Path, default=None, help="a directory holding runs/sync, runs/k2, ...")
    a = ap.parse_args()
    work = a.runs or ROOT / "bench" / "out" / "sim_calibration"
    work.mkdir(parents=True, exist_ok=True)
    args_cwd = str(work)
    for name, sets in RUNS.items():
        if (work / "runs" / name / "metrics.jsonl").is_file():
            continue
        env = {**os.environ, "OMP_NUM_THREADS": "1"} if name == "sync" else None
        start = time.perf_counter()
        overrides = [x for s in [*COMMON, f"name={name}", *sets] for x in ("--set", s)]
        schedrl("train", str(RECIPE), *overrides, env=env)
        print(f"{name}: trained in {time.perf_counter() - start:.0f} s")
    runs = [str(work / "runs" / n) for n in RUNS]
    results = {}
    for label, extra in (("sync_only", []), ("with_interference", ["--interference-bench"])):
        out = json.loads(schedrl("simulate", "--calibrate", *runs, *extra, "--json").strip().splitlines()[-1])
        results[label] = out
        print(f"\ncalibrated on sync{' (+ the contention microbenchmark)' if extra else ''}:")
        for sc in out["scenarios"]:
            m = sc["measured"]["step_s"]
            print(f"  {sc['scenario']:<40} simulated {m['simulated']:.4f} s  measured {m['measured']:.4f} s  "
                  f"error {m['rel_error']:+.1%}")  # fmt: skip
    big = work / "big.yaml"
    import yaml

    big.write_text(yaml.safe_dump(BIG))
    speed = json.loads(schedrl("simulate", str(big), "--json").strip().splitlines()[-1])
    per_step = speed["scenarios"][0]["wall_s_per_step"]
    print(
        f"\n1,024 GPUs (512 engines, 8,192 samples a step): {per_step:.3f} s of wall-clock per simulated step"
    )
    named = {
        sc["scenario"].split(": ")[-1]: abs(sc["measured"]["step_s"]["rel_error"])
        for sc in results["with_interference"]["scenarios"]
    }
    summary = {
        "max_rel_error": round(results["with_interference"]["max_step_error"], 4),
        "target_rel_error": round(max(named[n] for n in TARGET), 4),
        "median_rel_error": round(results["with_interference"]["median_step_error"], 4),
        "max_rel_error_sync_only": round(results["sync_only"]["max_step_error"], 4),
        "errors": {
            label: {
                sc["scenario"].split(": ")[-1]: round(sc["measured"]["step_s"]["rel_error"], 4)
                for sc in r["scenarios"]
            }
            for label, r in results.items()
        },
        "sim_s_per_step_1024": per_step,
    }
    print(json.dumps(summary))


args_cwd = "."

if __name__ == "__main__":
    main()
