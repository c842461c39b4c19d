"""Soak: a long asynchronous run with the process's memory sampled every 100 steps.

    python bench/soak.py                       # 2,000 steps on the long-tailed mix, ~10 min on 2 cores
    python bench/soak.py --steps 400           # a quick look

The run: the tiny model on `longtail` after the SFT warm-up, the asynchronous pipeline on threads
(staleness bound 4, decoupled PPO), a checkpoint every 500 steps. The resident set size (RSS,
from /proc/self/statm) is read after every 100th step. Warm-up is the first `--warmup` steps
(allocator pools, the engine's cache slots and the optimizer's state fill up there); the growth
is the largest RSS after warm-up minus the RSS at its end. The bound the run must keep is
`--bound-mb`; the last line is JSON with every sample, the growth and whether it held.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import schedrl

SCHEDULE = {
    "pipeline": {"mode": "async", "backend": "threads"},
    "schedule": {"max_staleness": 4},
    "algo": {"correction": "decoupled"},
}


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--bound-mb", type=float, default=64.0)
    args = ap.parse_args()
    samples: list[tuple[int, float]] = []
    start = time.perf_counter()

    def on_step(step: int, metrics: dict) -> None:
        if step % args.every == 0:
            samples.append((step, round(rss_mb(), 1)))
            print(
                f"step {step:5d}  rss {samples[-1][1]:8.1f} MB  {time.perf_counter() - start:7.1f} s",
                flush=True,
            )

    with tempfile.TemporaryDirectory(prefix="soak_") as out:
        schedrl.train(
            task={"name": "longtail", "args": {}},
            steps=args.steps,
            save_every=500,
            sft={"steps": 600},
            optim={"lr": 1.5e-4},
            sampling={"max_new_tokens": 50},
            eval={"tasks": 50, "k": 2},
            out_dir=out,
            name="soak",
            on_step=on_step,
            **SCHEDULE,
        )
    at_warmup = next((mb for step, mb in samples if step >= args.warmup), samples[-1][1])
    after = [mb for step, mb in samples if step > args.warmup] or [at_warmup]
    growth = max(after) - at_warmup
    print(
        json.dumps(
            {
                "steps": args.steps,
                "rss_mb": samples,
                "rss_at_warmup_mb": at_warmup,
                "growth_after_warmup_mb": round(growth, 1),
                "bound_mb": args.bound_mb,
                "held": growth <= args.bound_mb,
                "seconds": round(time.perf_counter() - start, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
