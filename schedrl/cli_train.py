"""`schedrl train | sft | eval | demo`: the training commands, with a rich progress bar."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections import deque
from collections.abc import Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from schedrl.config import RunConfig, load_config
from schedrl.models.loading import quiet_hf

console = Console()

# The demo's recipe (examples/demo.yaml holds the same): sort 2-3 digits, SFT warm-up, then GRPO
# with clip-higher (DAPO) and rollouts at temperature 1.2, which keep the policy exploring.
DEMO = {
    "steps": 400,
    "save_every": 100,
    "min_start_reward": 0.0,  # a start near 0 at T=1.2 is expected here: clip-higher keeps it from collapsing
    "task": {"name": "sort", "args": {"min_len": 2, "max_len": 3}},
    "sampling": {"prompts_per_step": 16, "group_size": 8, "max_new_tokens": 4, "temperature": 1.2},
    "algo": {"loss_args": {"clip_eps": 0.2, "clip_eps_high": 0.28}},
    "optim": {"lr": 3e-4},
    "sft": {"steps": 30, "batch_size": 32, "lr": 1e-3},
    "eval": {"tasks": 200, "k": 8, "temperature": 1.0},
}


@contextmanager
def progress_bar(total_rl: int, total_sft: int):
    """Yields (on_sft_step, on_step) callbacks that drive two bars: SFT warm-up and RL."""
    columns = (
        TextColumn("[bold]{task.description:<5}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as bar:
        sft = bar.add_task("sft", total=total_sft, info="", visible=total_sft > 0)
        rl = bar.add_task("rl", total=total_rl, info="")

        def on_sft(step: int, m: dict) -> None:
            bar.update(sft, completed=step + 1, info=f"loss {m['sft_loss']:.3f}")

        recent: deque[float] = deque(maxlen=10)

        def on_rl(step: int, m: dict) -> None:
            recent.append(m["reward_mean"])
            info = f"reward {sum(recent) / len(recent):.3f} (last 10)  {m['tokens_per_s']:.0f} tok/s"
            bar.update(rl, completed=step, info=info)

        yield on_sft, on_rl


def _train(cfg: RunConfig, resume: str | None, sets: Sequence[str] = ()) -> dict:
    """`schedrl.train` under the progress bars; a new run gets its name first, to print where it goes."""
    from schedrl.api import check_before_start, train

    quiet_hf()
    if resume:
        console.print(f"run directory: {resume}")
        with progress_bar(cfg.steps, 0) as (on_sft, on_rl):
            result = train(resume=resume, sets=sets, on_step=on_rl, on_sft_step=on_sft)
    else:
        source = check_before_start(cfg)  # a bad task, loss or row fails before any directory or bar
        cfg = dataclasses.replace(cfg, name=cfg.name or f"{cfg.task.name}-{datetime.now():%Y%m%d-%H%M%S}")
        console.print(f"run directory: {Path(cfg.out_dir) / str(cfg.name)}")
        with progress_bar(cfg.steps, cfg.sft.steps) as (on_sft, on_rl):
            result = train(cfg, on_step=on_rl, on_sft_step=on_sft, source=source)
    return {
        "eval_before": result.eval_before,
        "eval_after": result.eval_after,
        "run_dir": str(result.run_dir),
        "plot": str(result.plot),
    }


def _eval_table(before: dict, after: dict, title: str = "held-out evaluation") -> Table:
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("before training" if "return_mean" in after else "before RL", justify="right")
    table.add_column("after training" if "return_mean" in after else "after RL", justify="right")
    for key in after:
        table.add_row(key, f"{before.get(key, float('nan')):.3f}", f"{after[key]:.3f}")
    return table


def _recipe(args: argparse.Namespace) -> dict:
    from schedrl.config import read_recipe
    from schedrl.training.run_dir import RunDir

    if args.resume:
        return read_recipe(RunDir.open(args.resume).config_path)
    return read_recipe(args.config) if args.config is not None else {}


@contextmanager
def classic_progress(total: int, summary, unit: str):
    """Yields the `on_update` callback of a bar over a classic run's updates: `summary(metrics)` once
    episodes have ended, and the environment steps (`unit`) per second."""
    columns = (
        TextColumn("[bold]ppo  "),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
    )
    with Progress(*columns, TimeRemainingColumn(), console=console) as bar:
        task = bar.add_task("ppo", total=total, info="")

        def on_update(update: int, m: dict) -> None:
            head = f"{summary(m)}  " if "return_mean_100" in m else ""
            bar.update(task, completed=update, info=f"{head}{m['env_steps_per_s']:.0f} {unit}/s")

        yield on_update


def cmd_train_classic(args: argparse.Namespace) -> int:
    """A classic PPO recipe (an `env:` section): a bar over the updates, the evaluation before and after."""
    from schedrl.api import resolve_classic, train_classic_run

    cfg = resolve_classic(_recipe(args), sets=args.set)
    with classic_progress(
        cfg.updates, lambda m: f"return {m['return_mean_100']:.1f} (last 100 episodes)", "steps"
    ) as on_update:
        config = None if args.resume else args.config
        result = train_classic_run(config, {}, args.set, on_update, resume=args.resume)
    console.print(
        _eval_table(result.eval_before, result.eval_after, title=f"{cfg.env.id}: held-out episodes")
    )
    solved = next((r for r in result.metrics if "solved_at_steps" in r), None)
    if solved is not None:
        console.print(
            f"[bold green]solved (100-episode mean return >= {cfg.eval.solved_return:g}) after "
            f"{int(solved['solved_at_steps'])} environment steps, {solved['solved_at_s']:.1f} s[/]"
        )
    console.print(f"return curve: {result.plot}")
    summary = {
        "env": cfg.env.id,
        "eval_before": result.eval_before,
        "eval_after": result.eval_after,
        "solved_at_steps": None if solved is None else int(solved["solved_at_steps"]),
        "seconds": round(result.seconds, 1),
        "run_dir": str(result.run_dir),
    }
    print(json.dumps(summary))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Train with a YAML recipe (or resume a run directory)."""
    from schedrl.api import resolve_config, saved_config
    from schedrl.classic import is_classic

    if args.resume and args.config is not None:
        raise ValueError(
            "train --resume continues the run's own config.yaml; give --set overrides, not a recipe"
        )
    if is_classic(_recipe(args)):
        return cmd_train_classic(args)
    cfg = (
        saved_config(args.resume, sets=args.set)
        if args.resume
        else resolve_config(args.config, sets=args.set)
    )
    start = time.perf_counter()
    result = _train(cfg, args.resume, args.set)
    console.print(_eval_table(result["eval_before"], result["eval_after"]))
    console.print(f"reward curve: {result['plot']}")
    summary = {
        "steps": cfg.steps,
        "mode": cfg.pipeline.mode,
        "eval_before": result["eval_before"],
        "eval_after": result["eval_after"],
        "seconds": round(time.perf_counter() - start, 1),
        "run_dir": result["run_dir"],
    }
    print(json.dumps(summary))
    return 0


# The job-shop demo's recipe (examples/jssp_ppo.yaml holds the same; a test keeps them equal), embedded
# so that the demo runs from an installed package too.
JSSP_DEMO = {
    "seed": 0,
    "total_steps": 600_000,
    "save_every": 50,
    "env": {
        "id": "schedrl/JobShop-v0",
        "num_envs": 8,
        "kwargs": {"sizes": [[6, 6], [10, 10], [15, 10], [15, 15], [20, 15], [20, 20]], "max_jobs": 20},
    },
    "ppo": {
        "n_steps": 64,
        "batch_size": 256,
        "n_epochs": 4,
        "gamma": 1.0,
        "gae_lambda": 0.95,
        "lr": 0.0003,
        "ent_coef": 0.01,
        "vf_coef": 1.0,
        "clip_range": 0.2,
    },
    "policy": {"kind": "attention", "dim": 64, "layers": 2, "heads": 4},
    "eval": {"episodes": 16},
}


def cmd_demo_jssp(args: argparse.Namespace) -> int:
    """Job-shop dispatching by PPO for a few minutes; its gap against MWKR on held-out random instances,
    and a Gantt chart of one schedule."""
    import numpy as np

    from schedrl.api import resolve_classic, train_classic_run
    from schedrl.classic.dispatch import solve
    from schedrl.classic.runner import make_policy
    from schedrl.envs.scheduling.baselines import checked_makespan, rule_makespan
    from schedrl.envs.scheduling.instances import generate, require_jsl

    jsl = require_jsl()
    start = time.perf_counter()
    steps = 4000 if args.fast else 150_000
    overrides = {"total_steps": steps, "out_dir": args.out_dir, "eval": {"episodes": 4 if args.fast else 16}}
    cfg = resolve_classic(JSSP_DEMO, overrides, args.set)
    with classic_progress(
        cfg.updates, lambda m: f"-(makespan - LB)/LB {m['return_mean_100']:.3f}", "decisions"
    ) as on_update:
        result = train_classic_run(JSSP_DEMO, overrides, args.set, on_update)
    from schedrl.classic.envs import make_envs

    envs = make_envs(cfg.env, 1)
    policy = make_policy(cfg.policy, envs.single_observation_space, envs.single_action_space)
    envs.close()
    saved = torch_load(Path(result.run_dir) / "checkpoints")
    policy.load_state_dict(saved)
    n, m, count = (10, 10, 4) if args.fast else (15, 15, 20)
    held_out = [generate(n, m, seed=10**7 + i) for i in range(count)]  # seeds training never draws
    learned = [solve(policy, inst) for inst in held_out]
    mwkr = [rule_makespan(inst, "mwkr") for inst in held_out]
    vs = 100 * (np.mean([s.makespan / w for s, w in zip(learned, mwkr, strict=True)]) - 1)
    wins = sum(s.makespan < w for s, w in zip(learned, mwkr, strict=True))
    first = held_out[0]
    assert checked_makespan(first, learned[0].sequences) == learned[0].makespan
    from job_shop_lib.visualization.gantt import plot_gantt_chart  # pyright: ignore[reportMissingImports]

    schedule = jsl.Schedule.from_job_sequences(first.to_jsl(), learned[0].sequences)
    fig, _ = plot_gantt_chart(
        schedule, title=f"{first.name}: makespan {learned[0].makespan:.0f} (MWKR {mwkr[0]:.0f})"
    )
    gantt = Path(result.run_dir) / "gantt.png"
    fig.savefig(gantt, dpi=110, bbox_inches="tight")
    console.print(
        f"[bold green]{count} held-out {n}x{m} instances: greedy makespan {vs:+.1f}% against MWKR "
        f"(better on {wins} of {count})[/]\nGantt chart: {gantt}"
    )
    summary = {
        "task": "jssp",
        "vs_mwkr_percent": round(float(vs), 2),
        "wins": wins,
        "instances": count,
        "seconds": round(time.perf_counter() - start, 1),
        "run_dir": str(result.run_dir),
        "gantt": str(gantt),
    }
    print(json.dumps(summary))
    return 0


def torch_load(ckpt_dir: Path) -> dict:
    """The policy weights of a classic run's latest checkpoint."""
    import torch

    from schedrl.training.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(ckpt_dir)
    if ckpt is None:
        raise FileNotFoundError(f"no checkpoint in {ckpt_dir}")
    return torch.load(ckpt / "model" / "policy.pt", weights_only=False)["state_dict"]


def cmd_demo(args: argparse.Namespace) -> int:
    """Tiny model, SFT warm-up, GRPO, and held-out accuracy before and after (`--task jssp`: job-shop
    dispatching by PPO, measured against MWKR)."""
    from schedrl.config import config_from_dict

    if args.task == "jssp":
        return cmd_demo_jssp(args)
    if args.task == "rlhf":
        return cmd_demo_rlhf(args)
    start = time.perf_counter()
    overrides = list(args.set)
    if args.fast:
        overrides += ["steps=4", "sft.steps=2", "eval.tasks=8", "eval.k=2", "save_every=2"]
    cfg = config_from_dict({**DEMO, "out_dir": args.out_dir}, overrides)
    result = _train(cfg, None)
    before, after = result["eval_before"], result["eval_after"]
    console.print(_eval_table(before, after))
    console.print(
        f"[bold green]held-out accuracy (pass@1, sampled at T={cfg.eval.temperature}): "
        f"{before['pass@1']:.2f} -> {after['pass@1']:.2f}; greedy: {before['greedy_acc']:.2f} -> "
        f"{after['greedy_acc']:.2f}[/]\nreward curve: {result['plot']}"
    )
    summary = {
        "acc_before": before["pass@1"],
        "acc_after": after["pass@1"],
        "greedy_before": before["greedy_acc"],
        "greedy_after": after["greedy_acc"],
        "seconds": round(time.perf_counter() - start, 1),
        "run_dir": result["run_dir"],
    }
    print(json.dumps(summary))
    return 0


def cmd_demo_rlhf(args: argparse.Namespace) -> int:
    """RLHF on the sort task: preference pairs from the hidden rule, a reward model trained on them, GRPO
    against the reward model, judged by the rule, beside GRPO on the rule itself
    (`schedrl.rewards.rlhf_demo`)."""
    from schedrl.config import config_from_dict
    from schedrl.rewards.rlhf_demo import rlhf_recipe, write_pairs
    from schedrl.rewards.train_rm import RMConfig, train_reward_model

    start = time.perf_counter()
    root = Path(args.out_dir) / f"rlhf-{datetime.now():%Y%m%d-%H%M%S}"
    root.mkdir(parents=True)
    overrides = list(args.set)
    if args.fast:
        overrides += ["steps=4", "sft.steps=2", "eval.tasks=8", "eval.k=2", "save_every=2"]
    write_pairs(root / "prefs.jsonl", 40 if args.fast else 4000, seed=0)
    console.print(f"preference pairs from the hidden rule: {root / 'prefs.jsonl'}")
    rm_cfg = RMConfig(
        data=str(root / "prefs.jsonl"),
        out=str(root / "rm"),
        steps=4 if args.fast else 1500,
        batch_size=32,
        lr=5e-4,
    )
    rm = train_reward_model(rm_cfg, progress=True)
    console.print(f"reward model: held-out pair accuracy {rm['eval/accuracy']:.3f} ({root / 'rm' / 'model'})")
    kl = 1e-3  # both runs: a small penalty to the start, whose value is the curve's x axis
    rlhf = rlhf_recipe(DEMO, str(root / "rm" / "model"), kl)
    runs = {}
    for name, recipe in (("rlhf", rlhf), ("rule", {**DEMO, "algo": {**DEMO["algo"], "kl_coef": kl}})):
        cfg = config_from_dict({**recipe, "out_dir": str(root), "name": name}, overrides)
        console.print(f"[bold]GRPO on {'the reward model' if name == 'rlhf' else 'the rule itself'}[/]")
        runs[name] = _train(cfg, None)
    before, after = runs["rlhf"]["eval_before"], runs["rlhf"]["eval_after"]
    rule_after = runs["rule"]["eval_after"]
    table = Table(title="true reward (the hidden rule), held-out")
    for column in ("metric", "before RL", "GRPO on the reward model", "GRPO on the rule"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for key in after:
        table.add_row(
            key, f"{before.get(key, float('nan')):.3f}", f"{after[key]:.3f}", f"{rule_after[key]:.3f}"
        )
    console.print(table)
    summary = {
        "rm_heldout_accuracy": round(rm["eval/accuracy"], 3),
        "true_reward_before": before["pass@1"],
        "true_reward_after": after["pass@1"],
        "rule_grpo_true_reward": rule_after["pass@1"],
        "seconds": round(time.perf_counter() - start, 1),
        "run_dir": str(root),
    }
    print(json.dumps(summary))
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    """Supervised warm-up only; saves the model to --out."""
    from schedrl.envs import make_task
    from schedrl.models import default_device
    from schedrl.orchestrate.build import load_policy
    from schedrl.training.sft import sft_warmup

    quiet_hf()
    cfg = load_config(args.config, args.set)
    model, tokenizer = load_policy(cfg, cfg.model.path, default_device())
    source = make_task(cfg.task.name, **cfg.task.args)
    with progress_bar(0, cfg.sft.steps) as (on_sft, _):
        losses = sft_warmup(
            model, tokenizer, source, cfg.sft, cfg.seed, lambda s, loss: on_sft(s, {"sft_loss": loss})
        )
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    console.print(f"SFT loss {losses[0]:.3f} -> {losses[-1]:.3f}; model saved to {args.out}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate a model directory on the config's task (held-out split)."""
    from schedrl.envs import make_task
    from schedrl.models import load_model_and_tokenizer
    from schedrl.orchestrate.build import make_engine, make_episodes
    from schedrl.orchestrate.evaluate import evaluate
    from schedrl.seeding import derive_seed

    quiet_hf()
    cfg = load_config(args.config, args.set)
    model, tokenizer = load_model_and_tokenizer(args.model)
    engine = make_engine(cfg, model, tokenizer)  # the config's engine section: backend, caps, admission
    source = make_task(cfg.task.name, **cfg.task.args)
    episodes = make_episodes(cfg, engine, tokenizer, source)  # multi-turn tasks: episodes with their tools
    e = cfg.eval
    try:
        result = evaluate(
            engine,
            tokenizer,
            source,
            n_tasks=e.tasks,
            k=e.k,
            temperature=e.temperature,
            max_new_tokens=cfg.sampling.max_new_tokens,
            seed=derive_seed(cfg.seed, "eval"),
            episodes=episodes,
        )
    finally:
        if episodes is not None:
            episodes.close()
    table = Table(title=f"{cfg.task.name}: {e.tasks} held-out tasks")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in result.items():
        table.add_row(k, f"{v:.3f}")
    console.print(table)
    print(json.dumps(result))
    return 0


def add_training_commands(sub) -> None:
    train = sub.add_parser("train", help=cmd_train.__doc__)
    train.add_argument("config", nargs="?", default=None, help="YAML recipe (see examples/)")
    train.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. optim.lr=1e-4"
    )
    train.add_argument(
        "--resume", default=None, metavar="RUN_DIR", help="continue a run from its last checkpoint"
    )
    train.set_defaults(fn=cmd_train)
    demo = sub.add_parser("demo", help=cmd_demo.__doc__)
    demo.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    demo.add_argument("--out-dir", default="runs")
    demo.add_argument("--fast", action="store_true", help="a few steps only (smoke test)")
    demo.add_argument(
        "--task",
        choices=["sort", "jssp", "rlhf"],
        default="sort",
        help="jssp: needs schedrl[jssp]; rlhf: a reward model",
    )
    demo.set_defaults(fn=cmd_demo)
    sft = sub.add_parser("sft", help=cmd_sft.__doc__)
    sft.add_argument("config", nargs="?", default=None)
    sft.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    sft.add_argument("--out", required=True, help="directory for the warmed-up model")
    sft.set_defaults(fn=cmd_sft)
    ev = sub.add_parser("eval", help=cmd_eval.__doc__)
    ev.add_argument("config", nargs="?", default=None)
    ev.add_argument(
        "--model", required=True, help="HF model directory (e.g. RUN/checkpoints/step_000150/model)"
    )
    ev.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ev.set_defaults(fn=cmd_eval)
