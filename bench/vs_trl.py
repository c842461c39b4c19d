"""schedrl vs TRL's GRPOTrainer: same machine, model, start, task, settings; one run, alternating.

For each workload and seed, both systems start from the same weights (the tiny model after the
same SFT warm-up) with the same attention kernels (eager, schedrl's CPU default), see the same
tasks in the same order (TRL's dataset is schedrl's task stream, unshuffled), and use the same
G, prompts per step, learning rate (constant), max completion length, temperature, clip range,
token-mean loss, beta = 0, AdamW with the fused kernel, and one forward/backward over the step's
batch without recomputing activations: TRL's GRPOConfig turns gradient checkpointing on by
default, which re-runs each layer's forward in the backward; it is off here, as schedrl has no
such recomputation (`--trl-gradient-checkpointing` runs TRL's default instead). Then each final
model is evaluated by the same evaluator on the held-out split.

    pip install -e '.[bench]'
    python bench/vs_trl.py                         # both workloads, 3 seeds each, ~45 min
    python bench/vs_trl.py --workloads addition    # schedrl's synchronous loop, ~6 min
    python bench/vs_trl.py --workloads longtail    # schedrl's best schedule, ~35 min
    python bench/vs_trl.py --workloads addition --seeds 1 --steps 20   # a quick look
    python bench/vs_trl.py --workloads tools --seeds 2 --steps 200      # multi-turn, a slow tool, ~35 min
    python bench/vs_trl.py --model small --workloads longtail --seeds 1 --steps 150 --sync \
        --sft-steps 600 --sft-lr 3e-4 --lr 5e-5 --start-cache starts  # the 25M model, ~80 min on 2 cores

`--start-cache DIR` keeps each warm-up (at small, 600 SFT steps take half an hour on 2 cores) and
starts from it on the next run with the same workload, model, SFT steps, SFT lr and seed.

`tools` is multi-turn RL with a calculator whose answers take time. TRL 1.16's tool path cannot run
it on this model and tokenizer (`bench/trl_tools.py` probes it on every run and prints TRL's own
error), so there schedrl's best schedule is compared with TRL's lock-step tool loop on schedrl's
engine: see `bench/trl_tools.py`.

Each workload runs schedrl under its own schedule (`WORKLOADS[...]["schedule"]`, config overrides):
addition on the synchronous loop, which its target is about; longtail on the best schedule so
far (the asynchronous pipeline on threads, staleness bound 4, decoupled PPO). `--sync` runs the
synchronous loop everywhere; `--schedrl-set KEY=VALUE` adds overrides to every workload.

Time to target: the target reward of a workload is 0.9 x the lower of the two systems' final
reward (mean of the last 20 steps, median over seeds), so both reach it in a typical seed; the
time is the wall-clock, from the call that builds the system, until the 20-step moving average
(over a full window, so from step 20 on) first reaches it. A seed where neither system reaches
it is left out of the time ratio. The start's reward is the mean first-step reward of both systems
(the batch each samples before its first update); a target at or below it measures no learning,
and then no time ratio is given (`target_above_start` is false). The last line printed is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from schedrl.config import config_from_dict
from schedrl.engine import EngineConfig, HFEngine
from schedrl.envs import Task, make_task
from schedrl.models import build_char_tokenizer, build_tiny_model, load_model_and_tokenizer, preset
from schedrl.orchestrate.evaluate import evaluate
from schedrl.orchestrate.run import train
from schedrl.seeding import derive_seed
from schedrl.training.run_dir import RunDir
from schedrl.training.sft import sft_warmup

BEST_SCHEDULE = [
    "pipeline.mode=async",
    "pipeline.backend=threads",
    "schedule.max_staleness=4",
    "algo.correction=decoupled",
]
WORKLOADS = {
    "addition": {
        "task": {"name": "addition", "args": {"min_digits": 1, "max_digits": 1}},
        "max_new_tokens": 8,
        "steps": 300,
        "sft_steps": 30,
        "schedule": [],
    },
    # tiny: 600 SFT steps (start reward ~0.21) and lr 1.5e-4: RL lifts the reward to ~0.27 in 150 steps. After
    # 200 SFT steps (~0.04) it stays flat at every lr tried (5e-5 .. 3e-4); at 3e-4 it falls from either start.
    # small: 1.5e-4 keeps the reward flat near its start (~0.29); --lr 5e-5 lifts it to ~0.45 in 150 steps
    "longtail": {
        "task": {"name": "longtail", "args": {}},
        "max_new_tokens": 50,
        "steps": 300,
        "sft_steps": 600,
        "lr": 1.5e-4,
        "schedule": BEST_SCHEDULE,
    },
}
G, PROMPTS, LR, TEMPERATURE = 8, 16, 3e-4, 1.0
WINDOW = 20


def sft_start(
    workload: dict,
    seed: int,
    out: Path,
    size: str = "tiny",
    steps: int | None = None,
    lr: float | None = None,
) -> Path:
    """The shared starting point: the built-in model of `size` after the same SFT warm-up of `steps`
    at learning rate `lr` (the workload's own and SFT's default if not given). A checkpoint already
    at `out` is that warm-up, kept by an earlier run (`--start-cache`), and is reused as it is; it is
    written beside `out` and renamed into place, so a run killed while saving leaves none."""
    from schedrl.config import SFTConfig

    if (out / "config.json").exists():
        return out
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, preset(size))
    source = make_task(workload["task"]["name"], **workload["task"]["args"])
    n = workload["sft_steps"] if steps is None else steps
    t0 = time.perf_counter()

    def progress(step: int, loss: float) -> None:
        if (step + 1) % 100 == 0:
            print(f"  sft step {step + 1}/{n} loss {loss:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)

    cfg = SFTConfig(steps=n) if lr is None else SFTConfig(steps=n, lr=lr)
    sft_warmup(model, tokenizer, source, cfg, seed, on_step=progress)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(out)
    return out


def task_stream(workload: dict, seed: int, steps: int) -> list[Task]:
    """Exactly the tasks schedrl's loop draws, step after step."""
    source = make_task(workload["task"]["name"], **workload["task"]["args"])
    return [t for k in range(steps) for t in source.sample("train", PROMPTS, derive_seed(seed, "data", k))]


def run_schedrl(start: Path, workload: dict, seed: int, steps: int, work: Path, overrides=()) -> dict:
    cfg = config_from_dict(
        {
            "seed": seed,
            "steps": steps,
            "save_every": 0,
            "out_dir": str(work),
            "name": "schedrl",
            "model": {"path": str(start)},
            "task": workload["task"],
            "sampling": {
                "prompts_per_step": PROMPTS,
                "group_size": G,
                "max_new_tokens": workload["max_new_tokens"],
                "temperature": TEMPERATURE,
            },
            # one forward/backward over the step's 128 sequences, as TRL's per_device_train_batch_size=128
            "optim": {"lr": workload.get("lr", LR), "micro_batch_tokens": 0},
            "sft": {"steps": 0},
            "eval": {"tasks": 0},
        },
        list(overrides),
    )
    times, rewards, tokens = [], [], []

    def on_step(step: int, m: dict) -> None:
        times.append(time.perf_counter())
        rewards.append(m["reward_mean"])
        tokens.append(m["gen_tokens"])

    start_t = time.perf_counter()
    train(cfg, RunDir.create(work, "schedrl"), on_step=on_step)
    return {
        "t0": start_t,
        "times": times,
        "rewards": rewards,
        "tokens": tokens,
        "model": work / "schedrl" / "checkpoints" / f"step_{steps:06d}" / "model",
    }


def run_trl(
    start: Path, workload: dict, seed: int, steps: int, work: Path, checkpointing: bool = False
) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    source = make_task(workload["task"]["name"], **workload["task"]["args"])
    tasks = task_stream(workload, seed, steps)
    by_prompt_answer = {(t.prompt, t.answer): t for t in tasks}
    data = Dataset.from_list([{"prompt": t.prompt, "answer": t.answer} for t in tasks])

    def reward(prompts, completions, answer, **kwargs):
        return [
            source.reward(by_prompt_answer[(p, a)], c)
            for p, c, a in zip(prompts, completions, answer, strict=True)
        ]

    times, rewards, tokens = [], [], []

    class Clock(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                times.append(time.perf_counter())
                rewards.append(logs["reward"])
                tokens.append(logs.get("completions/mean_length", 0.0) * G * PROMPTS)

    start_t = time.perf_counter()  # as schedrl's: from loading the start checkpoint, set-up included
    model, tokenizer = load_model_and_tokenizer(start, device="cpu")
    model.set_attn_implementation(
        "eager"
    )  # the attention schedrl's learner uses on CPU: same model, same kernels
    args = GRPOConfig(
        output_dir=str(work / "trl"),
        seed=seed,
        max_steps=steps,
        per_device_train_batch_size=G * PROMPTS,
        num_generations=G,
        max_completion_length=workload["max_new_tokens"],
        temperature=TEMPERATURE,
        learning_rate=workload.get("lr", LR),
        lr_scheduler_type="constant",
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        disable_tqdm=True,
        gradient_checkpointing=checkpointing,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.remove_callback(PrinterCallback)  # its per-step print is not part of the work compared
    trainer.train()
    out = work / "trl" / "final"
    trainer.model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"t0": start_t, "times": times, "rewards": rewards, "tokens": tokens, "model": out}


def moving_average(xs: list[float], w: int = WINDOW) -> list[float]:
    return [statistics.mean(xs[max(0, i - w + 1) : i + 1]) for i in range(len(xs))]


def summarize(run: dict, workload: dict, seed: int) -> dict:
    t = run["times"]
    model, tokenizer = load_model_and_tokenizer(run["model"], device="cpu")
    source = make_task(workload["task"]["name"], **workload["task"]["args"])
    engine = HFEngine(model, tokenizer, EngineConfig(max_concurrency=256))
    ev = evaluate(
        engine,
        tokenizer,
        source,
        n_tasks=200,
        k=4,
        temperature=1.0,
        max_new_tokens=workload["max_new_tokens"],
        seed=derive_seed(seed, "eval"),
    )
    span = t[-1] - t[0]  # steps 2..N: excludes start-up and the first step's warm-up
    return {
        "steps_per_s": (len(t) - 1) / span,
        "gen_tokens_per_s": sum(run["tokens"][1:]) / span,
        "final_reward": statistics.mean(run["rewards"][-WINDOW:]),
        "eval_pass@1": ev["pass@1"],
        "eval_greedy": ev["greedy_acc"],
        "curve": run["rewards"],
        "elapsed": [x - run["t0"] for x in t],
    }


def time_to(summary: dict, target: float) -> float:
    """Wall-clock until the moving average over a full window first reaches `target`."""
    pairs = list(zip(moving_average(summary["curve"]), summary["elapsed"], strict=True))
    for r, el in pairs[WINDOW - 1 :]:
        if r >= target:
            return el
    return float("inf")


def start_reward(per_system: dict[str, list[dict]]) -> float:
    """The start's reward: the mean over every system and seed of the first step's reward, the one
    batch each system samples from the shared start before any update."""
    return statistics.mean(s["curve"][0] for runs in per_system.values() for s in runs)


def time_ratios(trl: list[dict], schedrl: list[dict], target: float) -> list[float]:
    """TRL's time to `target` over schedrl's, per seed; a seed where neither reaches it says nothing
    about the ratio and is left out (one that only schedrl reaches gives inf, only TRL 0)."""
    pairs = [(time_to(a, target), time_to(b, target)) for a, b in zip(trl, schedrl, strict=True)]
    return [a / b for a, b in pairs if min(a, b) < float("inf")]


def learning_time_ratios(per_system: dict[str, list[dict]], target: float) -> list[float]:
    """`time_ratios` of TRL over schedrl, or none when `target` is not above the start's reward: the
    start already scores such a target, so both reach it at their first full window, learning or not,
    and the ratio would be the time to WINDOW steps."""
    if target <= start_reward(per_system):
        return []
    return time_ratios(per_system["trl"], per_system["schedrl"], target)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(6 * len(results), 8), squeeze=False)
    for col, (name, per_system) in enumerate(results.items()):
        for row, xlabel in enumerate(("wall-clock s", "step")):
            ax = axes[row][col]
            for system, color in (("trl", "tab:blue"), ("schedrl", "tab:orange")):
                for i, s in enumerate(per_system[system]):
                    x = s["elapsed"] if row == 0 else range(1, len(s["curve"]) + 1)
                    ax.plot(
                        x,
                        moving_average(s["curve"]),
                        color=color,
                        alpha=0.8,
                        label=f"{system} (seed runs)" if i == 0 else None,
                    )
            ax.set(title=f"{name}: reward ({WINDOW}-step moving average)", xlabel=xlabel, ylabel="reward")
            ax.grid(alpha=0.3)
            ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def default_plot(model: str) -> str:
    """Where the plots go unless `--plot` says: the tiny model's under the docs' figure names, another
    size's under its own, so a run at small leaves the tiny runs' figures alone."""
    return "docs/vs_trl_{workload}.png" if model == "tiny" else f"docs/vs_trl_{model}_{{workload}}.png"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=[*WORKLOADS, "tools"])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="override the steps of every workload")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--plot",
        default=None,
        help="PNG path; with {workload}, one plot per workload, else one plot of all "
        "(default: docs/vs_trl_{workload}.png, docs/vs_trl_small_{workload}.png at small)",
    )
    ap.add_argument(
        "--trl-gradient-checkpointing",
        action="store_true",
        help="TRL's default: recompute activations in the backward (schedrl does not)",
    )
    ap.add_argument("--sync", action="store_true", help="schedrl's synchronous loop on every workload")
    ap.add_argument(
        "--schedrl-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override schedrl's config on every workload, after the workload's schedule",
    )
    ap.add_argument(
        "--model",
        choices=("tiny", "small"),
        default="tiny",
        help="the built-in model's size: tiny (~0.45M parameters) or small (~25M)",
    )
    ap.add_argument(
        "--lr",
        type=float,
        default=None,
        help="the RL learning rate of both systems (default: the workload's)",
    )
    ap.add_argument("--sft-steps", type=int, default=None, help="override every workload's SFT warm-up steps")
    ap.add_argument(
        "--sft-lr",
        type=float,
        default=None,
        help="the SFT warm-up's learning rate (default: SFT's own, 1e-3, which is too high for small)",
    )
    ap.add_argument(
        "--start-cache",
        type=Path,
        default=None,
        help="keep each SFT warm-up here (a folder per workload, model, SFT steps, SFT lr, seed) and reuse it",
    )
    args = ap.parse_args()
    args.plot = args.plot or default_plot(args.model)
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    results: dict[str, dict[str, list[dict]]] = {}
    report: dict[str, dict] = {}
    for name in args.workloads:
        if name == "tools":
            import trl_tools

            plot_path = Path(args.plot.format(workload=name)) if "{workload}" in args.plot else None
            report[name] = trl_tools.compare(args.seeds, args.steps or 200, plot_path)
            print(json.dumps({name: report[name]}), flush=True)
            continue
        workload = WORKLOADS[name] if args.lr is None else {**WORKLOADS[name], "lr": args.lr}
        steps = args.steps or workload["steps"]
        overrides = ([] if args.sync else workload["schedule"]) + args.schedrl_set
        results[name] = {"trl": [], "schedrl": []}
        for seed in range(args.seeds):
            work = Path(tempfile.mkdtemp(prefix=f"vs_trl_{name}_{seed}_"))
            sft_steps = workload["sft_steps"] if args.sft_steps is None else args.sft_steps
            start_dir = (
                args.start_cache / f"{name}_{args.model}_sft{sft_steps}_lr{args.sft_lr}_seed{seed}"
                if args.start_cache
                else work / "start"
            )
            start = sft_start(workload, seed, start_dir, args.model, sft_steps, args.sft_lr)
            order = ("trl", "schedrl") if seed % 2 == 0 else ("schedrl", "trl")  # alternate who runs first
            for system in order:
                if system == "trl":
                    out = run_trl(start, workload, seed, steps, work, args.trl_gradient_checkpointing)
                else:
                    out = run_schedrl(start, workload, seed, steps, work, overrides)
                summary = summarize(out, workload, seed)
                results[name][system].append(summary)
                print(
                    f"{name} seed {seed} {system:8s} {summary['steps_per_s']:.2f} steps/s "
                    f"{summary['gen_tokens_per_s']:.0f} tok/s  final reward {summary['final_reward']:.3f}  "
                    f"eval pass@1 {summary['eval_pass@1']:.3f}",
                    flush=True,
                )
            shutil.rmtree(work, ignore_errors=True)
        per = results[name]
        target = 0.9 * min(statistics.median(s["final_reward"] for s in per[sys_]) for sys_ in per)
        ratio_speed = [
            b["steps_per_s"] / a["steps_per_s"] for a, b in zip(per["trl"], per["schedrl"], strict=True)
        ]
        start_score = start_reward(per)
        ratio_time = learning_time_ratios(per, target)
        report[name] = {
            "model": args.model,
            "sft_steps": sft_steps,
            "sft_lr": args.sft_lr,
            "steps": steps,
            "lr": workload.get("lr", LR),
            "schedrl_overrides": overrides,
            "target_reward": round(target, 3),
            "start_reward": round(start_score, 3),
            "target_above_start": target > start_score,
            # per seed: wall-clock to the target, and to the end of the first step (start-up included)
            **{f"{sys_}_time_to_target_s": [round(time_to(s, target), 1) for s in per[sys_]] for sys_ in per},
            **{f"{sys_}_first_step_s": [round(s["elapsed"][0], 1) for s in per[sys_]] for sys_ in per},
            "schedrl_vs_trl_steps_per_s": round(statistics.median(ratio_speed), 3),
            "schedrl_vs_trl_steps_per_s_per_seed": [round(r, 3) for r in ratio_speed],
            **{
                f"{sys_}_mean_reward_all_steps": round(
                    statistics.median(statistics.mean(s["curve"]) for s in per[sys_]), 3
                )
                for sys_ in per
            },  # the area under the reward-per-step curve
            "trl_time_to_target_over_schedrl": round(statistics.median(ratio_time), 3)
            if ratio_time
            else None,
            "trl_time_to_target_over_schedrl_per_seed": [round(r, 3) for r in ratio_time],
            **{
                f"{sys_}_{k}": round(statistics.median(s[k] for s in per[sys_]), 3)
                for sys_ in per
                for k in ("steps_per_s", "gen_tokens_per_s", "final_reward", "eval_pass@1", "eval_greedy")
            },
        }
        print(json.dumps({name: report[name]}), flush=True)
    if "{workload}" in args.plot:
        plots = [args.plot.format(workload=name) for name in results]
        for name, path in zip(results, plots, strict=True):
            plot({name: results[name]}, Path(path))
        plots += [args.plot.format(workload="tools")] if "tools" in report else []
    else:
        plots = [args.plot] if results else []
        if results:
            plot(results, Path(args.plot))
    out = {"workloads": report, "plots": plots, "trl_gradient_checkpointing": args.trl_gradient_checkpointing}
    if "addition" in report:
        out["sync_vs_trl_steps_per_s"] = report["addition"]["schedrl_vs_trl_steps_per_s"]
    if "tools" in report:
        out["best_vs_lockstep_time_to_target"] = report["tools"]["lockstep_time_to_target_over_schedrl"]
    if "longtail" in report:
        out["best_vs_trl_time_to_target"] = report["longtail"]["trl_time_to_target_over_schedrl"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
