"""What one engine step of the asynchronous pipeline costs, by schedule: the simulator's engine model
against the real engine's steps.

The simulator charges an engine step `overhead + per_row x running rows` (fit to a synchronous run),
and a calibration adds a slowdown while an update runs beside it (`--interference-bench`). This
benchmark looks at the steps themselves: it trains `examples/async_threads.yaml` (80 RL steps after
300 SFT steps, threads backend, one engine beside the learner) under each schedule, in this process,
and times every engine step with what ran in it (running rows, prefill tokens, keys attended, rows
finished). The learner's `train` spans of the run's timeline tell the steps taken while an update
ran from those taken while the learner waited.

    python bench/engine_steps.py                          # four schedules, ~4 minutes on 2 cores
    python bench/engine_steps.py --modes k2 partial_inflight

It prints the median decode step (no prefill in it) by running rows, per schedule, and a fit of
`base + per_row x rows` over the decode steps taken while the learner trained and while it did not.
The last line is one JSON object with the same figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

import schedrl.distributed.workers as workers
from schedrl.config import config_from_dict
from schedrl.orchestrate.run import train
from schedrl.timeline import TIMELINE_FILE, read_spans
from schedrl.training.run_dir import RunDir

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "async_threads.yaml"
COMMON = {"steps": 80, "sft": {"steps": 300}, "eval": {"tasks": 16, "k": 1}, "save_every": 0}
MODES = {
    "k2": {"max_staleness": 2, "consumption": "wave", "weight_sync": "drain"},
    "k2_inflight": {"max_staleness": 2, "consumption": "wave", "weight_sync": "inflight"},
    "partial_drain": {
        "max_staleness": 2,
        "consumption": "partial",
        "consumption_args": {"overprovision": 1.5},
        "weight_sync": "drain",
    },
    "partial_inflight": {
        "max_staleness": 2,
        "consumption": "partial",
        "consumption_args": {"overprovision": 1.5},
        "weight_sync": "inflight",
    },
}
BINS = ((1, 16), (16, 48), (48, 96), (96, 144), (144, 200), (200, 300))
STEPS: list[tuple] = []  # (wall start, seconds, rows, prefill tokens, keys attended, finished)


def timed_run(self, max_steps: int):
    """`EngineWorker.run`, timing each step with the work in it."""
    finished = []
    for _ in range(max_steps):
        if not self.engine.has_unfinished():
            break
        start, t = time.time(), time.perf_counter()
        out = self.engine.step()
        dt = time.perf_counter() - t
        st = self.engine.last_step
        STEPS.append((start, dt, st.decode_rows, st.prefill_tokens, st.context_tokens, len(out)))
        finished += out
    return finished


def fit(dt: np.ndarray, rows: np.ndarray) -> dict[str, float]:
    if len(dt) < 3:
        return {}
    base, per_row = np.linalg.lstsq(np.stack([np.ones_like(rows), rows], 1), dt, rcond=None)[0]
    return {"base_ms": round(base * 1e3, 3), "per_row_us": round(per_row * 1e6, 2), "steps": len(dt)}


def run_mode(name: str, schedule: dict, work: Path) -> dict:
    data = yaml.safe_load(RECIPE.read_text())
    data.update(COMMON)
    data["schedule"] = {**data["schedule"], **schedule}
    data["name"] = name
    cfg = config_from_dict(data)
    run = RunDir.create(str(work), name)
    STEPS.clear()
    start = time.perf_counter()
    train(cfg, run)
    seconds = time.perf_counter() - start
    s = np.array(STEPS, dtype=float)
    t0, dt, rows, prefill = s[:, 0], s[:, 1], s[:, 2], s[:, 3]
    spans = [
        sp for sp in read_spans(run.root / TIMELINE_FILE) if sp.worker == "learner" and sp.kind == "train"
    ]
    mid = t0 + dt / 2
    training = np.array([any(sp.start <= m <= sp.end for sp in spans) for m in mid])
    decode = prefill == 0
    by_rows = {}
    for lo, hi in BINS:
        k = decode & (rows >= lo) & (rows < hi)
        if k.sum() >= 5:
            by_rows[f"{lo}-{hi}"] = round(float(np.median(dt[k])) * 1e3, 3)
    return {
        "train_s": round(seconds, 1),
        "engine_steps": len(s),
        "engine_s": round(float(dt.sum()), 3),
        "mean_rows": round(float(rows[decode].mean()), 1),
        "finished_per_step": round(float(s[:, 5].mean()), 2),
        "median_decode_ms_by_rows": by_rows,
        "fit_learner_training": fit(dt[decode & training], rows[decode & training]),
        "fit_learner_waiting": fit(dt[decode & ~training], rows[decode & ~training]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    a = ap.parse_args()
    workers.EngineWorker.run = timed_run  # the threads backend builds its engine worker in this process
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.modes:
            out[name] = run_mode(name, MODES[name], Path(tmp))
    print(f"\n{'schedule':<18}" + "".join(f"{f'{lo}-{hi} rows':>13}" for lo, hi in BINS))
    for name, r in out.items():
        cells = [r["median_decode_ms_by_rows"].get(f"{lo}-{hi}") for lo, hi in BINS]
        print(f"{name:<18}" + "".join(f"{c:>10.2f} ms" if c is not None else f"{'-':>13}" for c in cells))
    print("\nbase + per_row x rows over decode steps, while the learner trained / waited:")
    for name, r in out.items():
        a_, b_ = r["fit_learner_training"], r["fit_learner_waiting"]
        print(
            f"  {name:<18} {a_.get('base_ms', float('nan')):.2f} ms + {a_.get('per_row_us', float('nan')):.1f} us"
            f"  /  {b_.get('base_ms', float('nan')):.2f} ms + {b_.get('per_row_us', float('nan')):.1f} us"
            f"   ({r['engine_steps']} steps, {r['engine_s']:.1f} s, mean rows {r['mean_rows']})"
        )
    print(json.dumps({"modes": out, "median_train_s": statistics.median(r["train_s"] for r in out.values())}))


if __name__ == "__main__":
    main()
