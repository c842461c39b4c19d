"""Chaos: SIGKILL training runs at random points and inside the checkpoint protocol, resume each, check.

    python bench/chaos.py                          # 20 kills per mode: sync, threads, ray, delayed
    python bench/chaos.py --kills 4 --modes sync   # a quick look

Each mode runs the same small recipe (the tiny model sorting digits, 10 steps, a checkpoint every
2). The kills cycle through five places: a random moment of the run (mid-rollout or mid-update,
wherever it lands), and the four steps of the checkpoint protocol of one save (after the files are
written, after their fsync, after the rename, after the pointer update; `bench/chaos_child.py`).
On Ray the learner writes checkpoints in its actor, out of the driver's reach, so there every kill
is at a random moment. Each killed run is resumed with `schedrl train --resume` and checked:

* sync: its metrics equal those of an uninterrupted run (wall-clock keys aside);
* async (and `delayed`: forecasting, whose samples wait 1 or 2 batches for their rewards, so every
  checkpoint holds some): from the sample ledger of its last checkpoint, no group lost (every issued group is
  consumed, still buffered, or dropped as too stale, and listed so) and none trained twice, and
  no step trained on tokens older than the staleness bound.

It prints a table and, last, one JSON line: kills, resumed, identical, lost_samples,
duplicate_samples, staleness_violations (summed over modes; per mode under `modes`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from schedrl.orchestrate.step_metrics import TIMING_KEYS
from schedrl.training.checkpoint import POINTS, latest_checkpoint
from schedrl.training.run_dir import read_metrics

HERE = Path(__file__).resolve().parent
RECIPE = {
    "task": {"name": "sort", "args": {"min_len": 2, "max_len": 3}},
    "sampling": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
    "steps": 10,
    "save_every": 2,
    "sft": {"steps": 5},
    "eval": {"tasks": 4, "k": 1},
}
# `delayed`: forecasting, whose questions resolve 1 or 2 batches after they are drawn, so every checkpoint
# holds samples waiting for their rewards (`schedrl.envs.forecast`)
DELAYED = {
    **RECIPE,
    "task": {"name": "forecast", "args": {"max_delay": 2}},
    "algo": {"std_normalize": False},
    "sft": {"steps": 0},
}
MAX_STALENESS = 2
ASYNC = ["pipeline.mode=async", "algo.correction=decoupled", f"schedule.max_staleness={MAX_STALENESS}"]
MODES = {
    "sync": [],
    "threads": [*ASYNC, "pipeline.backend=threads", "schedule.weight_sync=inflight"],
    "ray": [*ASYNC, "pipeline.backend=ray", "schedule.weight_sync=inflight"],
    "delayed": [*ASYNC, "pipeline.backend=threads"],
}
PLACES = ("moment", *POINTS)


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "RAY_AUTH_MODE": "disabled"}


def _sets(pairs: list[str]) -> list[str]:
    return [a for kv in pairs for a in ("--set", kv)]


def _launch(work: Path, name: str, mode: str, place: str = "moment", save: int = 0) -> subprocess.Popen:
    recipe = work / "recipe.yaml"
    recipe.write_text(json.dumps({**(DELAYED if mode == "delayed" else RECIPE), "out_dir": str(work)}))
    args = ["train", str(recipe), *_sets([*MODES[mode], f"name={name}"])]
    cmd = [sys.executable, "-m", "schedrl.cli", *args]
    if place != "moment":
        cmd = [sys.executable, str(HERE / "chaos_child.py"), place, str(save), *args]
    return subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _resume(run: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "schedrl.cli", "train", "--resume", str(run)]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=900)


def _steps(run: Path) -> list[dict]:
    rows = read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").exists() else []
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def _ledger(run: Path) -> tuple[int, int, int]:
    """(lost groups, groups trained twice, samples held for their rewards) from the sample ledger of the
    run's last checkpoint."""
    ckpt = latest_checkpoint(run / "checkpoints")
    assert ckpt is not None, f"{run}: no checkpoint after the resumed run"
    final = json.loads((ckpt / "state.json").read_text())["pipeline"]
    consumed = final["consumed"]
    issued = {
        f"train/{w}/{i}"
        for w in range(final["next_wave"])
        for i in range(RECIPE["sampling"]["prompts_per_step"])
    }
    left = {g["id"] for g in final["groups"]}
    spent = issued - set(consumed) - left
    lost = sum(not any(d.startswith(f"{gid}/") for d in final["dropped"]) for gid in spent)
    held = sum(len(g.get("waiting", {})) for g in final["groups"])
    return lost, len(consumed) - len(set(consumed)), held


def _wait_for_start(proc: subprocess.Popen, run: Path) -> float:
    """The moment `run` logs its first row (or its process ends)."""
    while proc.poll() is None and not (run / "metrics.jsonl").exists():
        time.sleep(0.01)
    return time.perf_counter()


def run_mode(
    mode: str, kills: int, rng: random.Random, work: Path, places: tuple[str, ...] | None = None
) -> dict:
    """`kills` killed and resumed runs of `mode`, cycling through `places` (default: all there are)."""
    reference = _launch(work, "reference", mode)
    started = _wait_for_start(reference, work / "reference")
    _, err = reference.communicate(timeout=900)
    if reference.returncode != 0:
        raise RuntimeError(f"{mode}: the uninterrupted run failed:\n{err[-3000:]}")
    duration = time.perf_counter() - started  # from the run's first logged row to its end
    expected = _steps(work / "reference")
    out = {
        "kills": 0,
        "resumed": 0,
        "identical": 0,
        "lost_samples": 0,
        "duplicate_samples": 0,
        "staleness_violations": 0,
        "finished_before_kill": 0,
        "held_samples": 0,
    }
    places = places or (PLACES if mode != "ray" else ("moment",))
    for i in range(kills):
        place = places[i % len(places)]
        save = 1 + rng.randrange(4)  # the kill comes on one of the first four of five saves
        name = f"kill{i:02d}"
        proc = _launch(work, name, mode, place, save)
        if place == "moment":  # a moment of the run itself, not of the interpreter starting up
            _wait_for_start(proc, work / name)
            time.sleep(rng.uniform(0.0, 0.95) * duration)
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=900)
        if proc.returncode != -signal.SIGKILL:
            out["finished_before_kill"] += 1
            continue
        out["kills"] += 1
        done = _resume(work / name)
        if done.returncode != 0:
            print(
                f"{mode} {name} ({place}): resume failed\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}",
                flush=True,
            )
            continue
        out["resumed"] += 1
        rows = _steps(work / name)
        if mode == "sync":
            out["identical"] += rows == expected
        else:
            lost, twice, held = _ledger(work / name)
            out["lost_samples"] += lost
            out["duplicate_samples"] += twice
            out["held_samples"] += held
            out["staleness_violations"] += sum(r.get("staleness_max", 0) > MAX_STALENESS for r in rows)
        print(f"{mode:8s} {name} killed at {place:8s} (save {save}): resumed", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    results = {}
    for mode in args.modes:
        with tempfile.TemporaryDirectory(prefix=f"chaos_{mode}_") as tmp:
            results[mode] = run_mode(mode, args.kills, rng, Path(tmp))
    keys = (
        "kills",
        "resumed",
        "identical",
        "lost_samples",
        "duplicate_samples",
        "staleness_violations",
        "finished_before_kill",
        "held_samples",
    )
    print(f"{'mode':8s} " + " ".join(f"{k:>20s}" for k in keys))
    for mode, r in results.items():
        print(
            f"{mode:8s} "
            + " ".join(f"{r[k] if (k != 'identical' or mode == 'sync') else '-':>20}" for k in keys)
        )
    total = {k: sum(r[k] for r in results.values()) for k in keys}
    total["identical"] = results.get("sync", {}).get("identical", 0)
    total["sync_kills"] = results.get("sync", {}).get("kills", 0)
    print(json.dumps({**total, "modes": results}))


if __name__ == "__main__":
    main()
