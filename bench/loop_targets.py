"""The one-loop redesign's figures, this checkout and another side by side.

    git worktree add /tmp/before b55567c && python bench/loop_targets.py --baseline /tmp/before

Each figure is measured in a fresh process that imports schedrl from its tree, rounds alternating
between the two trees (a second busy process would slow a run tenfold: run it on a quiet machine):

- `loop_lines`: lines of the loop's book-keeping (`orchestrate/sync.py`, `orchestrate/pipeline.py`,
  `sim/cluster.py`, and where they exist `orchestrate/books.py`, `orchestrate/loop.py`, and the two files
  split out of those, `orchestrate/run.py` and `sim/fleet.py`); target: <= 600;
- `sync_steps_per_s`: the synchronous loop on `addition` (tiny model, 16 prompts x 8 samples), steps per
  wall-clock second after the first two steps (from step ends, the same in both trees);
- `async_k2_over_sync`: on `longtail`, steps per second of the asynchronous pipeline at k = 2 (threads
  backend, decoupled correction) over the synchronous loop's, both from the same short warm-up;
- `sim_s_per_step_1024`: wall-clock seconds per simulated step of a 1,024-GPU scenario (512 engines,
  8,192 samples a step, k = 1);
- with `--demo`: the seconds and held-out pass@1 of `schedrl demo`.

Both trees read the same settings; the keys that moved to `schedule:` are written where each tree
expects them. The last line is one JSON object: each figure for both trees and this tree's ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sim_calibration import BIG  # the 1,024-GPU scenario of the simulator's own benchmark

HERE = Path(__file__).resolve()
LOOP_FILES = (
    "orchestrate/sync.py",
    "orchestrate/pipeline.py",
    "sim/cluster.py",
    "orchestrate/books.py",  # b55567c..1452802: the shared admission, purge and take
    "orchestrate/loop.py",
    "orchestrate/run.py",  # the run around the loop, split out of sync.py: counted as before
    "sim/fleet.py",  # the simulated fleet, split out of sim/cluster.py: counted as before
)
SKIP = 2  # steps left out of a run's mean (the first compiles and warms the allocator)
QUIET = {"logging": {"backends": ["jsonl"]}, "save_every": 0, "eval": {"tasks": 16, "k": 1}}


def loop_lines(tree: Path) -> int:
    return sum(
        len((tree / "schedrl" / f).read_text().splitlines())
        for f in LOOP_FILES
        if (tree / "schedrl" / f).is_file()
    )


def has_schedule() -> bool:
    import schedrl.config

    return hasattr(schedrl.config, "Schedule")


def staleness(k: int) -> dict:
    """k = `k` where the tree reads it: `schedule.max_staleness`, or `pipeline.max_staleness` before it."""
    if has_schedule():
        return {"schedule": {"max_staleness": k}, "pipeline": {"mode": "async", "backend": "threads"}}
    return {"pipeline": {"mode": "async", "backend": "threads", "max_staleness": k}}


def mean_step_s(config: dict, out: str) -> float:
    """Wall-clock seconds per step, from the end of step SKIP to the end of the last: everything the
    loop does in between (generation, scoring, the update, the weight push, logging), measured the same
    way in both trees."""
    import schedrl

    ends: list[float] = []
    schedrl.train(
        {**QUIET, **config, "out_dir": out}, on_step=lambda step, m: ends.append(time.perf_counter())
    )
    ends = ends[SKIP:]
    return (ends[-1] - ends[0]) / (len(ends) - 1)


def sync_addition(out: str) -> dict:
    config = {"task": {"name": "addition"}, "steps": 30, "sft": {"steps": 10}, "name": "sync-addition"}
    return {"sync_steps_per_s": 1.0 / mean_step_s(config, out)}


def async_longtail(out: str) -> dict:
    base = {
        "task": {"name": "longtail"},
        "steps": 16,
        "sft": {"steps": 20},
        "algo": {"correction": "decoupled"},
    }
    sync = mean_step_s({**base, "name": "longtail-sync"}, out)
    k2 = mean_step_s({**base, **staleness(2), "name": "longtail-k2"}, out)
    return {"longtail_sync_step_s": sync, "longtail_k2_step_s": k2, "async_k2_over_sync": sync / k2}


def sim_1024(out: str) -> dict:
    from schedrl.sim.cluster import simulate
    from schedrl.sim.scenario import scenario_from_dict

    schedule = {"max_staleness": 1} if has_schedule() else {"mode": "async", "max_staleness": 1}
    s = scenario_from_dict({**BIG, "schedule": schedule})
    start = time.perf_counter()
    simulate(s)
    return {"sim_s_per_step_1024": (time.perf_counter() - start) / s.steps}


def demo(out: str) -> dict:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "schedrl.cli", "demo", "--out-dir", out],
        capture_output=True,
        text=True,
        check=True,
    )
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return {"demo_s": time.perf_counter() - start, "demo_pass_at_1": summary["acc_after"]}


FIGURES = {"sync": sync_addition, "async": async_longtail, "sim": sim_1024, "demo": demo}


def measure(tree: Path, what: str) -> dict:
    """`FIGURES[what]` in a fresh process that imports schedrl from `tree`."""
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "PYTHONPATH": str(tree), "TOKENIZERS_PARALLELISM": "false"}
        cmd = [sys.executable, str(HERE), "--child", what, "--tree", str(tree), "--out", out]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree)
        if done.returncode != 0:
            raise SystemExit(f"{what} in {tree} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, help="another checkout to measure side by side")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of each figure")
    ap.add_argument("--demo", action="store_true", help="also time `schedrl demo` (about a minute a run)")
    ap.add_argument("--only", nargs="+", choices=list(FIGURES), help="measure these figures only")
    ap.add_argument("--child", choices=list(FIGURES), help=argparse.SUPPRESS)
    ap.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, str(args.tree))
        print(json.dumps(FIGURES[args.child](args.out)))
        return
    trees = {"this": HERE.parents[1]}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    figures = args.only or [w for w in FIGURES if w != "demo" or args.demo]
    runs: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    for _ in range(args.rounds):
        for what in figures:
            for name, tree in trees.items():
                for key, value in measure(tree, what).items():
                    runs[name].setdefault(key, []).append(value)
    out = {name: {"loop_lines": loop_lines(tree)} for name, tree in trees.items()}
    for name, figs in runs.items():
        out[name] |= {key: round(statistics.median(values), 4) for key, values in figs.items()}
    print(f"{'figure':<26}" + "".join(f"{name:>14}" for name in trees))
    for key in out["this"]:
        print(f"{key:<26}" + "".join(f"{out[name].get(key, float('nan')):>14.4g}" for name in trees))
    if "baseline" in out:
        out["ratio"] = {
            k: round(v / out["baseline"][k], 3) for k, v in out["this"].items() if out["baseline"].get(k)
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
