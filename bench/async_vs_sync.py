"""Asynchronous pipeline vs the synchronous loop on the `longtail` mix: throughput, reward, idle time.

Every mode starts from the same weights (the tiny model after one shared SFT warm-up of 600
steps, the start of `bench/vs_trl.py`'s longtail workload, where RL lifts the reward from
about 0.21), with the same seed, tasks, samples per step and learning settings (lr 1.5e-4, as
there), so "equal reward" compares runs that learn. `sync` is the single-process loop using
both cores for each phase; the asynchronous modes run the engine and the learner on
`--backend` (threads by default, or Ray actors), one core each. Modes run alternately,
round after round.

    pip install -e .
    python bench/async_vs_sync.py                      # all modes, 2 rounds
    python bench/async_vs_sync.py --steps 20 --rounds 1 --modes sync k1   # a quick look

Figures per mode (median over rounds): steps/s over the RL steps after the first two
(start-up excluded), wall-clock to the target reward (the first step where the
10-step moving average of the training reward reaches 0.95 x sync's final reward), first and
final reward (means of the first and last 20 steps), and the engine's and learner's idle fractions from the
run's timeline (the learner's also while active: between its first and last update, leaving out
the wait for the first batch). `ceiling` is what any schedule of a mode's measured work could reach: sync's
step time over (the workers' busy core-seconds per step / 2 cores); it is shown for the modes
with one single-threaded process per core, where busy time is CPU time. Modes `k2-2e` and
`combined-2e` run two engine workers beside the learner (three processes on two cores);
they are not in the default set. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

MODES = {
    "sync": {},
    "k0": {"mode": "async"},
    "k1": {"mode": "async", "max_staleness": 1},
    "k2": {"mode": "async", "max_staleness": 2},
    "auto": {"mode": "async", "max_staleness": "auto", "staleness_args": {"k_max": 3}},
    "inflight": {"mode": "async", "max_staleness": 1, "weight_sync": "inflight"},
    "partial": {
        "mode": "async",
        "max_staleness": 1,
        "consumption": "partial",
        "weight_sync": "cut_resume",
        "consumption_args": {"overprovision": 1.5},
        "stale": "mask",
    },
    "combined": {
        "mode": "async",
        "max_staleness": 2,
        "weight_sync": "inflight",
        "consumption": "partial",
        "consumption_args": {"overprovision": 1.5},
        "stale": "mask",
    },
    "tail": {
        "mode": "async",
        "consumption": "tail",
        "consumption_args": {"eta": 1.25},
    },  # RollPacker, on-policy
    "k4": {"mode": "async", "max_staleness": 4},
    "combined-k4": {
        "mode": "async",
        "max_staleness": 4,
        "weight_sync": "inflight",
        "consumption": "partial",
        "consumption_args": {"overprovision": 1.5},
        "stale": "mask",
    },
    "k0-2e": {"mode": "async", "num_engines": 2, "learner_cpus": 2},
    "k1-2e": {
        "mode": "async",
        "max_staleness": 1,
        "num_engines": 2,
        "learner_cpus": 2,
        "weight_sync": "inflight",
    },
    "k2-2e": {"mode": "async", "max_staleness": 2, "num_engines": 2},
    "combined-2e": {
        "mode": "async",
        "max_staleness": 2,
        "weight_sync": "inflight",
        "consumption": "partial",
        "consumption_args": {"overprovision": 1.5},
        "stale": "mask",
        "num_engines": 2,
    },
}
SKIP, WINDOW, TAIL = 2, 10, 20
CORES = 2
DEFAULT_MODES = ["sync", "k0", "k1", "k2", "auto", "inflight", "partial", "combined"]


def recipe(args, model_path: str, out: str, name: str, mode: dict) -> dict:
    """The run of `mode`: its `schedule:` keys and its `pipeline:` keys, one mapping in MODES."""
    from schedrl.config import Schedule

    schedule_keys = {f.name for f in dataclasses.fields(Schedule)}
    schedule = {k: v for k, v in mode.items() if k in schedule_keys}
    pipeline = {k: v for k, v in mode.items() if k not in schedule_keys}
    return {
        "seed": args.seed,
        "steps": args.steps,
        "save_every": 0,
        "out_dir": out,
        "name": name,
        "min_start_reward": 0.0,
        "model": {"path": model_path},
        "task": {"name": "longtail", "args": {}},
        "sft": {"steps": 0},
        "sampling": {"prompts_per_step": 16, "group_size": 8, "max_new_tokens": 50, "temperature": 1.0},
        "algo": {"correction": "decoupled" if pipeline.get("mode") == "async" else "none"},
        "optim": {"lr": args.lr, "micro_batch_tokens": 0},
        "eval": {"tasks": 0},
        "pipeline": {**pipeline, "backend": args.backend} if pipeline.get("mode") == "async" else pipeline,
        "schedule": schedule,
    }


def warm_start(steps: int, seed: int, out: Path, size: str = "tiny") -> str:
    from schedrl.config import SFTConfig
    from schedrl.envs import make_task
    from schedrl.models import build_char_tokenizer, build_tiny_model, preset
    from schedrl.training.sft import sft_warmup

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, preset(size))
    sft_warmup(model, tokenizer, make_task("longtail"), SFTConfig(steps=steps), seed)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def one_run(args, mode: str, model_path: str, out: str, rnd: int) -> dict:
    from schedrl.config import config_from_dict
    from schedrl.gantt import write_report
    from schedrl.orchestrate.run import train
    from schedrl.training.run_dir import RunDir, read_metrics

    cfg = config_from_dict(recipe(args, model_path, out, f"{mode}-{rnd}", MODES[mode]))
    run = RunDir.create(cfg.out_dir, cfg.name)
    train(cfg, run)
    rows = [r for r in read_metrics(run.metrics_path) if "reward_mean" in r]
    step_s = [r["step_s"] for r in rows]
    rewards = [r["reward_mean"] for r in rows]
    idle = write_report(run.root)
    return {
        "steps_per_s": len(step_s[SKIP:]) / sum(step_s[SKIP:]),
        "rewards": rewards,
        "elapsed": [sum(step_s[: i + 1]) for i in range(len(step_s))],
        "first_reward": statistics.mean(rewards[:TAIL]),
        "final_reward": statistics.mean(rewards[-TAIL:]),
        "learner_idle": idle.get("learner", idle.get("trainer", {})).get("idle_frac", 0.0),
        "engine_idle": statistics.mean(
            v["idle_frac"] for k, v in idle.items() if k.startswith(("engine", "trainer"))
        ),
        "learner_idle_active": idle.get("learner", idle.get("trainer", {})).get("active_idle_frac", 0.0),
        "staleness_mean": statistics.mean(r.get("staleness_mean", 0.0) for r in rows),
        # CPU work per step: every worker's busy seconds (one thread each in the asynchronous modes)
        "core_s_per_step": sum(v["busy_s"] for v in idle.values()) / len(rows),
    }


def pinned(mode: str) -> bool:
    """One single-threaded process per core: busy spans are CPU time, so the ceiling is meaningful."""
    p = MODES[mode]
    return mode != "sync" and p.get("num_engines", 1) + p.get("learner_cpus", 1) <= CORES


def ceiling(t: dict) -> str:
    return f"{t['ceiling_vs_sync']:.2f}x" if t["ceiling_vs_sync"] is not None else "-"


def time_to(run: dict, target: float) -> float | None:
    r = run["rewards"]
    for i in range(WINDOW - 1, len(r)):
        if statistics.mean(r[i - WINDOW + 1 : i + 1]) >= target:
            return run["elapsed"][i]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sft-steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=1.5e-4)
    parser.add_argument("--backend", choices=["threads", "ray"], default="threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--model",
        choices=("tiny", "small"),
        default="tiny",
        help="the built-in model's size: tiny (~0.45M parameters) or small (~25M)",
    )
    parser.add_argument("--modes", nargs="+", default=DEFAULT_MODES, choices=list(MODES))
    args = parser.parse_args()
    if "sync" not in args.modes:
        args.modes.insert(0, "sync")
    from schedrl.models.loading import quiet_hf

    quiet_hf()
    if args.backend == "ray":  # one cluster for every run
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        import ray

        ray.init(
            num_cpus=CORES, object_store_memory=200 * 2**20, include_dashboard=False, log_to_driver=False
        )
    results: dict[str, list[dict]] = {m: [] for m in args.modes}
    with tempfile.TemporaryDirectory() as tmp:
        model_path = warm_start(args.sft_steps, args.seed, Path(tmp) / "start", args.model)
        for rnd in range(args.rounds):
            for mode in args.modes:
                t = time.perf_counter()
                results[mode].append(one_run(args, mode, model_path, tmp, rnd))
                r = results[mode][-1]
                print(
                    f"round {rnd} {mode:<9} {r['steps_per_s']:.2f} steps/s  reward {r['first_reward']:.3f} -> "
                    f"{r['final_reward']:.3f}  "
                    f"learner idle {r['learner_idle']:.1%} (active {r['learner_idle_active']:.1%})  "
                    f"engine idle {r['engine_idle']:.1%}  "
                    f"({time.perf_counter() - t:.0f} s)",
                    flush=True,
                )
    if args.backend == "ray":
        import ray

        ray.shutdown()
    med = lambda xs: statistics.median(xs)  # noqa: E731
    target = 0.95 * med([r["final_reward"] for r in results["sync"]])
    table = {}
    for mode, runs in results.items():
        ttt = [time_to(r, target) for r in runs]
        table[mode] = {
            "steps_per_s": med([r["steps_per_s"] for r in runs]),
            "time_to_target_s": med([t for t in ttt if t is not None])
            if any(t is not None for t in ttt)
            else None,
            "first_reward": med([r["first_reward"] for r in runs]),
            "final_reward": med([r["final_reward"] for r in runs]),
            "learner_idle": med([r["learner_idle"] for r in runs]),
            "engine_idle": med([r["engine_idle"] for r in runs]),
            "learner_idle_active": med([r["learner_idle_active"] for r in runs]),
            "staleness_mean": med([r["staleness_mean"] for r in runs]),
            "core_s_per_step": med([r["core_s_per_step"] for r in runs]),
        }
    sync = table["sync"]
    for mode, t in table.items():  # the most any schedule of this work could give on the cores at hand
        t["ceiling_vs_sync"] = (
            (1 / sync["steps_per_s"]) / (t["core_s_per_step"] / CORES) if pinned(mode) else None
        )
    print(
        f"\n{'mode':<9} {'steps/s':>8} {'vs sync':>8} {'to target s':>12} {'first R':>8} {'final R':>8} "
        f"{'learner idle':>13} {'(active)':>9} "
        f"{'engine idle':>12} {'staleness':>10} {'ceiling':>8}"
    )
    for mode, t in table.items():
        ttt = f"{t['time_to_target_s']:.1f}" if t["time_to_target_s"] is not None else "never"
        print(
            f"{mode:<9} {t['steps_per_s']:>8.2f} {t['steps_per_s'] / sync['steps_per_s']:>7.2f}x {ttt:>12} "
            f"{t['first_reward']:>8.3f} {t['final_reward']:>8.3f} {t['learner_idle']:>13.1%} {t['learner_idle_active']:>9.1%} "
            f"{t['engine_idle']:>12.1%} "
            f"{t['staleness_mean']:>10.2f} {ceiling(t):>8}"
        )
    asyncs = {m: t for m, t in table.items() if m != "sync"}
    best = max(asyncs, key=lambda m: asyncs[m]["steps_per_s"]) if asyncs else "sync"
    print(
        json.dumps(
            {
                "best_async_mode": best,
                "best_async_speedup": table[best]["steps_per_s"] / sync["steps_per_s"],
                "reward_gap": sync["final_reward"] - table[best]["final_reward"],
                "learner_idle": table[best]["learner_idle"],
                "learner_idle_active": table[best]["learner_idle_active"],
                "target_reward": target,
                "modes": table,
            }
        )
    )


if __name__ == "__main__":
    main()
