"""Data schedulers vs uniform sampling: generated tokens and wall-clock to a target eval accuracy.

Suite: the ``tiered`` task mix (trivial, learnable and out-of-reach domains; see
``schedrl/envs/tiered.py``), or with ``--task sched_tiered`` the scheduling text tasks' mix
(``schedrl/envs/scheduling/mix.py``). For each seed, one shared start: the tiny model after a short SFT
warm-up on the mix. From it, every scheduler runs the same synchronous GRPO loop (same budget of
``prompts x G`` samples per step, same steps, same learning rate) and is evaluated on the same
held-out tasks every ``--eval-every`` steps (pass@1 at temperature 1).

    python bench/data_scheduling.py                        # all schedulers, seeds 0-2, 2 workers
    python bench/data_scheduling.py --schedulers uniform coba --seeds 0 --steps 30   # a quick look

Target: ``start + 0.8 * (uniform final - start)``, with start and uniform final the medians over
seeds, so uniform reaches it by construction. Tokens (and training wall-clock: generation plus
update, evaluations excluded) to target are read at the first evaluation at or above it; a run that
never gets there counts as infinite. Per scheduler the median over seeds is reported;
``token_savings`` = uniform's median tokens / the scheduler's. Final accuracy is the mean of the
last two evaluations (less noise than one). As a check on the seeds' different starts, the savings
are also reported against per-seed targets (``start_s + 0.8 * (uniform final_s - start_s)``).
Runs are deterministic given their seed on CPU, so ``--from-json`` re-summarises a saved ``--json``
file exactly (wall-clock aside). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

STEPS, PROMPTS, G, MAX_NEW, LR, SFT_STEPS = 100, 16, 8, 8, 3e-4, 80
# --task: the registered mix and its arguments; sched_long swaps rcpsp for rcpsp_long, whose failures
# are long (8 start times), so that an all-fail prompt costs many tokens
MIXES = {
    "tiered": ("tiered", {}),
    "sched_tiered": ("sched_tiered", {}),
    "sched_long": (
        "sched_tiered",
        {"weights": {"activity_pair": 0.2, "activity": 0.2, "lis": 0.2, "lis_long": 0.2, "rcpsp_long": 0.2}},
    ),
}
EVAL_TASKS, EVAL_K, TARGET_FRAC = 300, 2, 0.8


def quiet_hf() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def sft_start(seed: int, sft_steps: int, out: Path, task: str = "tiered") -> Path:
    """The shared start of one seed: the tiny model after SFT on the task mix."""
    import torch

    from schedrl.config import SFTConfig
    from schedrl.envs import make_task
    from schedrl.models import build_char_tokenizer, build_tiny_model
    from schedrl.models.tiny import TinyModelConfig
    from schedrl.training.sft import sft_warmup

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    quiet_hf()

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, TinyModelConfig(seed=seed))
    name, task_args = MIXES[task]
    sft_warmup(model, tokenizer, make_task(name, **task_args), SFTConfig(steps=sft_steps), seed)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def run_one(
    scheduler: str,
    seed: int,
    start: str,
    steps: int,
    eval_every: int,
    work: str,
    task: str = "tiered",
    max_new: int = MAX_NEW,
) -> dict:
    """One training run; returns its evaluation curve against cumulative tokens and training seconds."""
    import torch

    torch.set_num_threads(1)
    quiet_hf()
    from schedrl.config import config_from_dict
    from schedrl.orchestrate.run import train
    from schedrl.training.run_dir import RunDir

    cfg = config_from_dict(
        {
            "seed": seed,
            "steps": steps,
            "save_every": 0,
            "out_dir": work,
            "name": f"{scheduler}-{seed}",
            "min_start_reward": 0.0,
            "model": {"path": start},
            "task": {"name": MIXES[task][0], "args": MIXES[task][1]},
            "sampling": {"prompts_per_step": PROMPTS, "group_size": G, "max_new_tokens": max_new},
            "algo": {"loss_args": {"clip_eps_high": 0.28}},
            "optim": {"lr": LR},
            "sft": {"steps": 0},
            "eval": {"tasks": EVAL_TASKS, "k": EVAL_K, "every": eval_every},
            "data": {"scheduler": scheduler},
        }
    )
    tokens, seconds, curve = [0.0], [0.0], []

    def on_step(step: int, m: dict) -> None:
        tokens.append(tokens[-1] + m["gen_tokens"])
        seconds.append(seconds[-1] + m["step_s"])
        if "eval/pass@1" in m:
            curve.append((step, tokens[-1], seconds[-1], m["eval/pass@1"]))

    t0 = time.perf_counter()
    out = train(cfg, RunDir.create(work, f"{scheduler}-{seed}"), on_step=on_step)
    curve.insert(0, (0, 0.0, 0.0, out["eval_before"]["pass@1"]))
    curve.append((steps, tokens[-1], seconds[-1], out["eval_after"]["pass@1"]))
    return {"scheduler": scheduler, "seed": seed, "curve": curve, "wall_s": time.perf_counter() - t0}


def to_target(curve: list[tuple], target: float) -> tuple[float, float]:
    """(tokens, training seconds) at the first evaluation at or above ``target``; inf if none."""
    for _, tok, sec, acc in curve:
        if acc >= target:
            return tok, sec
    return math.inf, math.inf


def final_acc(curve: list[tuple]) -> float:
    return statistics.mean(acc for *_, acc in curve[-2:])


def summarize(runs: list[dict], schedulers: list[str]) -> dict:
    by = {s: [r for r in runs if r["scheduler"] == s] for s in schedulers}
    start = statistics.median(r["curve"][0][3] for r in by["uniform"])
    uni_final = statistics.median(final_acc(r["curve"]) for r in by["uniform"])
    target = start + TARGET_FRAC * (uni_final - start)
    uni_by_seed = {r["seed"]: r["curve"] for r in by["uniform"]}
    seed_target = {k: c[0][3] + TARGET_FRAC * (final_acc(c) - c[0][3]) for k, c in uni_by_seed.items()}
    table = {}
    for s, rs in by.items():
        hits = [to_target(r["curve"], target) for r in rs]
        seed_hits = [to_target(r["curve"], seed_target[r["seed"]])[0] for r in rs]
        table[s] = {
            "tokens_to_target": statistics.median(h[0] for h in hits),
            "train_s_to_target": statistics.median(h[1] for h in hits),
            "final_acc": statistics.median(final_acc(r["curve"]) for r in rs),
            "tokens_total": statistics.median(r["curve"][-1][1] for r in rs),
            "reached": sum(math.isfinite(h[0]) for h in hits),
            "tokens_to_seed_target": statistics.median(seed_hits),
        }
    for row in table.values():
        for key, out in (
            ("tokens_to_target", "token_savings"),
            ("tokens_to_seed_target", "seed_target_savings"),
        ):
            base = table["uniform"][key]
            if not math.isfinite(row[key]):
                row[out] = 0.0
            elif row[key] == 0:  # the target lies at or below the start: no run needs a token for it
                row[out] = 1.0 if base == 0 else math.inf
            else:
                row[out] = base / row[key]
        row["final_acc_gap"] = row["final_acc"] - table["uniform"]["final_acc"]
    return {"start_acc": start, "uniform_final": uni_final, "target": target, "table": table}


def print_table(summary: dict, n_seeds: int) -> None:
    print(
        f"\nstart pass@1 {summary['start_acc']:.3f}, uniform final {summary['uniform_final']:.3f}, "
        f"target {summary['target']:.3f} (medians over {n_seeds} seeds)"
    )
    print(
        f"{'scheduler':<20}{'tokens->target':>16}{'train s->target':>17}{'savings':>9}{'final':>8}{'gap':>8}"
        f"{'reached':>9}{'tokens total':>14}{'per-seed savings':>18}"
    )
    for s, r in summary["table"].items():
        print(
            f"{s:<20}{r['tokens_to_target']:>16,.0f}{r['train_s_to_target']:>17.1f}{r['token_savings']:>9.2f}"
            f"{r['final_acc']:>8.3f}{r['final_acc_gap']:>+8.3f}{r['reached']:>6}/{n_seeds}"
            f"{r['tokens_total']:>14,.0f}{r['seed_target_savings']:>18.2f}"
        )


def main() -> None:
    from schedrl.data import SCHEDULERS

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schedulers", nargs="+", default=list(SCHEDULERS), choices=list(SCHEDULERS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument(
        "--task",
        default="tiered",
        choices=list(MIXES),
        help="the mix: digits, scheduling, scheduling with long failures",
    )
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--max-new", type=int, default=MAX_NEW, help="new tokens per sample (sched_long: 24)")
    ap.add_argument("--sft-steps", type=int, default=SFT_STEPS)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2, help="runs in parallel, one torch thread each")
    ap.add_argument("--json", default=None, help="also write every run's curve to this file")
    ap.add_argument("--from-json", default=None, help="summarise the runs saved by an earlier --json")
    args = ap.parse_args()
    schedulers = ["uniform"] + [s for s in args.schedulers if s != "uniform"]
    t0 = time.perf_counter()
    if args.from_json:
        runs = json.loads(Path(args.from_json).read_text())["runs"]
        report(runs, sorted({r["seed"] for r in runs}), max(r["curve"][-1][0] for r in runs), None, t0)
        return
    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(args.workers) as pool:
        paths = [Path(tmp) / f"start-{s}" for s in args.seeds]
        built = pool.map(
            sft_start, args.seeds, [args.sft_steps] * len(paths), paths, [args.task] * len(paths)
        )
        starts = dict(zip(args.seeds, built, strict=True))
        jobs = [(s, seed) for seed in args.seeds for s in schedulers]
        futures = [
            pool.submit(
                run_one, s, seed, str(starts[seed]), args.steps, args.eval_every, tmp, args.task, args.max_new
            )
            for s, seed in jobs
        ]
        runs = []
        for f in futures:
            runs.append(f.result())
            r = runs[-1]
            print(
                f"{r['scheduler']:<20} seed {r['seed']}  final {final_acc(r['curve']):.3f}  "
                f"tokens {r['curve'][-1][1]:>9,.0f}  {r['wall_s']:.0f}s",
                flush=True,
            )
    report(runs, args.seeds, args.steps, args.json, t0)


def report(runs: list[dict], seeds: list[int], steps: int, json_path: str | None, t0: float) -> None:
    schedulers = list(dict.fromkeys(r["scheduler"] for r in runs))
    if json_path:  # the runs first: a summary that fails loses none of them
        Path(json_path).write_text(json.dumps({"runs": runs}, indent=1))
    summary = summarize(runs, schedulers)
    print_table(summary, len(seeds))
    if json_path:
        Path(json_path).write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))
    others = {s: r for s, r in summary["table"].items() if s != "uniform"}
    best = max(others, key=lambda s: others[s]["token_savings"])
    worst = min(others, key=lambda s: others[s]["final_acc_gap"])
    below = sorted(s for s, r in others.items() if r["final_acc_gap"] < -0.02)
    print(
        json.dumps(
            {
                "token_savings_best": round(others[best]["token_savings"], 3),
                "best_scheduler": best,
                "worst_final_acc_gap": round(others[worst]["final_acc_gap"], 4),
                "worst_scheduler": worst,
                "below_uniform_by_more_than_0.02": below,
                "target_acc": round(summary["target"], 4),
                "uniform_final_acc": round(summary["uniform_final"], 4),
                "seeds": seeds,
                "steps": steps,
                "token_savings": {s: round(r["token_savings"], 3) for s, r in others.items()},
                "final_acc_gap": {s: round(r["final_acc_gap"], 4) for s, r in others.items()},
                "token_savings_per_seed_target": {
                    s: round(r["seed_target_savings"], 3) for s, r in others.items()
                },
                "wall_s": round(time.perf_counter() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
