"""`schedrl` command line: train, sft, eval, demo, engine-demo, make-tiny, tasks."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from schedrl.cli_train import add_training_commands
from schedrl.distributed.backend import WorkerStuckError
from schedrl.models.loading import quiet_hf
from schedrl.training.checkpoint import CheckpointError

console = Console()


def _model_and_tokenizer(model_dir: str | None):
    from schedrl.models import build_char_tokenizer, build_tiny_model, load_model_and_tokenizer

    if model_dir:
        return load_model_and_tokenizer(model_dir)
    tokenizer = build_char_tokenizer()
    return build_tiny_model(tokenizer), tokenizer


def _run_with_bar(engine, requests, label: str) -> tuple[list, float]:
    total = sum(r.params.max_new_tokens for r in requests)
    columns = (
        TextColumn(f"[bold]{label:<22}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("tokens  {task.fields[rate]:>7} tok/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(label, total=total, rate="-")
        start = time.perf_counter()

        def on_step(_finished) -> None:
            done = engine.num_generated
            bar.update(task, completed=done, rate=f"{done / (time.perf_counter() - start):.0f}")

        samples = engine.generate(requests, on_step=on_step)
        elapsed = time.perf_counter() - start
    return samples, elapsed


def cmd_engine_demo(args: argparse.Namespace) -> int:
    """Continuous vs static batching on the long-tailed task mix, side by side."""
    import torch

    from schedrl.engine import EngineConfig, HFEngine, StaticBatch
    from schedrl.envs import make_task
    from schedrl.types import Request, SamplingParams

    quiet_hf()
    torch.set_num_threads(args.threads)
    model, tokenizer = _model_and_tokenizer(args.model)
    task = make_task(args.task)
    tasks = task.sample("train", args.requests, seed=args.seed)
    # An untrained model's lengths say nothing; each output runs to its task's answer length
    # (+ eos), so both schedules generate exactly the same tokens.
    requests = [
        Request(
            f"{t.id}#{i}",
            tuple(tokenizer(t.prompt).input_ids),
            SamplingParams(
                max_new_tokens=len(tokenizer(task.solution(t)).input_ids) + 1, seed=i, ignore_eos=True
            ),
            task_id=t.id,
        )
        for i, t in enumerate(tasks)
    ]
    lengths = sorted(r.params.max_new_tokens for r in requests)
    console.print(
        f"[bold]schedrl demo[/]: {len(requests)} '{args.task}' requests, output length median "
        f"{lengths[len(lengths) // 2]}, p99 {lengths[int(0.99 * (len(lengths) - 1))]}, max {lengths[-1]}; "
        f"concurrency {args.concurrency}, {args.threads} thread(s)"
    )
    results = {}
    for label, admission in (("static batching", StaticBatch()), ("continuous batching", None)):
        engine = HFEngine(
            model, tokenizer, EngineConfig(max_concurrency=args.concurrency), admission=admission
        )
        samples, elapsed = _run_with_bar(engine, requests, label)
        tokens = sum(s.num_tokens for s in samples)
        results[label] = (tokens, elapsed, engine.num_steps, samples)
    table = Table(title="Same requests, same model, same tokens")
    for col in ("schedule", "tokens", "forward steps", "seconds", "tokens/s", "mean queue s"):
        table.add_column(col, justify="right")
    for label, (tokens, elapsed, steps, samples) in results.items():
        queue = sum(s.timings.queue_s for s in samples) / len(samples)
        table.add_row(
            label, str(tokens), str(steps), f"{elapsed:.2f}", f"{tokens / elapsed:.0f}", f"{queue:.2f}"
        )
    console.print(table)
    static, cont = results["static batching"], results["continuous batching"]
    speedup = (cont[0] / cont[1]) / (static[0] / static[1])
    console.print(f"[bold green]continuous batching: {speedup:.2f}x the tokens/s of static batching[/]")
    return 0


def cmd_make_tiny(args: argparse.Namespace) -> int:
    from schedrl.models import preset, save_tiny_model

    quiet_hf()
    path = save_tiny_model(args.path, preset(args.preset, args.seed))
    console.print(f"saved the {args.preset} model and its tokenizer to {path}")
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    from schedrl.envs import make_task

    task = make_task(args.name)
    table = Table(title=f"{args.name} ({args.split})")
    for col in ("id", "domain", "prompt", "solution"):
        table.add_column(col)
    for t in task.sample(args.split, args.n, seed=args.seed):
        table.add_row(t.id, t.domain, t.prompt, task.solution(t))
    console.print(table)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """List registered components with their one-line descriptions."""
    from schedrl.algos import registry

    kinds = {"algos": ("loss", "advantage")}[args.what]
    table = Table(title=f"registered {args.what}")
    for col in ("kind", "name", "description"):
        table.add_column(col)
    for kind in kinds:
        for name, description in sorted(registry.available(kind).items()):
            table.add_row(kind, name, description)
    console.print(table, soft_wrap=True)
    loss_args = Table(title="loss arguments (algo.loss_args; a correction reads those of algo.loss)")
    for col in ("loss", "arguments"):
        loss_args.add_column(col)
    for name in sorted(registry.available("loss")):
        loss_args.add_row(name, ", ".join(registry.loss_spec(name).arg_names()) or "-")
    console.print(loss_args, soft_wrap=True)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Write a run's report (report.html: curves, lengths, staleness, schedulers, timeline, config)."""
    from schedrl.gantt import format_fractions, write_report
    from schedrl.run_report import write_run_report

    root = Path(args.run_dir)
    if (root / "timeline.jsonl").is_file():  # the Gantt chart on its own too: timeline.png, timeline.html
        console.print(format_fractions(write_report(root)))
    if (root / "metrics.jsonl").is_file() or not (root / "timeline.jsonl").is_file():
        console.print(f"report: {write_run_report(root, args.out)}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Overlay several runs on one page."""
    from schedrl.run_report import write_compare

    console.print(f"comparison: {write_compare(args.run_dirs, args.out)}")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    """Simulate an RL post-training cluster under a schedule (a scenario YAML): step time, idle fractions."""
    from schedrl.sim.cli import run_simulate

    return run_simulate(args, console)


PAIR_ARGS = ("data", "out", "model", "steps", "batch_size", "lr", "eval_fraction", "seed")


def cmd_rm(args: argparse.Namespace) -> int:
    """train a reward model on preference pairs (JSONL: prompt, chosen, rejected, margin) into OUT/model"""
    from schedrl.rewards.train_rm import RMConfig, train_reward_model

    cfg = RMConfig(**{k: getattr(args, k) for k in PAIR_ARGS}, use_margin=not args.no_margin)
    result = train_reward_model(cfg, progress=True)
    console.print(f"reward model in {args.out}/model: held-out accuracy {result['eval/accuracy']:.3f}")
    print(json.dumps(result))
    return 0


def cmd_dpo(args: argparse.Namespace) -> int:
    """train a policy on preference pairs by DPO (the offline baseline to RL on a reward model) into OUT/model"""
    from schedrl.rewards.dpo import DPOConfig, train_dpo

    cfg = DPOConfig(**{k: getattr(args, k) for k in PAIR_ARGS}, beta=args.beta, loss_type=args.loss_type)
    result = train_dpo(cfg, progress=True)
    console.print(
        f"policy in {args.out}/model: held-out implicit-reward accuracy {result['eval/accuracy']:.3f}"
    )
    print(json.dumps(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="schedrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_training_commands(sub)
    demo = sub.add_parser("engine-demo", help=cmd_engine_demo.__doc__)
    demo.add_argument("--task", default="longtail")
    demo.add_argument("--requests", type=int, default=1024)
    demo.add_argument("--concurrency", type=int, default=32)
    demo.add_argument("--threads", type=int, default=1)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--model", default=None, help="HF model directory (default: the built-in tiny model)")
    demo.set_defaults(fn=cmd_engine_demo)
    tiny = sub.add_parser("make-tiny", help="save an offline built-in model and its tokenizer to PATH")
    tiny.add_argument("path")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument(
        "--preset", choices=("tiny", "small"), default="tiny", help="tiny (~0.45M) or small (~25M)"
    )
    tiny.set_defaults(fn=cmd_make_tiny)
    listing = sub.add_parser("list", help=cmd_list.__doc__)
    listing.add_argument("what", choices=("algos",))
    listing.set_defaults(fn=cmd_list)
    tasks = sub.add_parser("tasks", help="show sample tasks of a built-in task")
    tasks.add_argument("name")
    tasks.add_argument("--split", default="train", choices=("train", "eval"))
    tasks.add_argument("-n", type=int, default=8)
    tasks.add_argument("--seed", type=int, default=0)
    tasks.set_defaults(fn=cmd_tasks)
    report = sub.add_parser("report", help=cmd_report.__doc__)
    report.add_argument("run_dir")
    report.add_argument("--out", default=None, help="HTML path (default: RUN_DIR/report.html)")
    report.set_defaults(fn=cmd_report)
    simulate = sub.add_parser("simulate", help=cmd_simulate.__doc__)
    simulate.add_argument("scenario", nargs="?", default=None, help="a scenario YAML (examples/sim/)")
    simulate.add_argument(
        "--calibrate",
        nargs="+",
        default=None,
        metavar="RUN_DIR",
        help="fit the costs to the first run (a synchronous one); predict every run's schedule",
    )
    simulate.add_argument(
        "--interference-from",
        default=None,
        metavar="RUN_DIR",
        help="with --calibrate: an asynchronous run whose workers' slowdown on shared cores is fit too",
    )
    simulate.add_argument(
        "--interference-bench",
        action="store_true",
        help="with --calibrate: measure the workers' slowdown on shared cores by a microbenchmark of the "
        "first run's engine and learner side by side (no asynchronous run needed)",
    )
    simulate.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    simulate.add_argument(
        "--out", default=None, help="write timeline.jsonl, timeline.html and summary.json here"
    )
    simulate.add_argument("--json", action="store_true", help="print the summary as one JSON line only")
    simulate.add_argument(
        "--search",
        action="store_true",
        help="rank schedules for the cluster of --variant by simulated step time; print the best",
    )
    simulate.add_argument(
        "--variant", default=None, help="with --search: the variant whose cluster is searched"
    )
    simulate.add_argument(
        "--bound",
        type=int,
        default=None,
        help="with --search: the staleness bound (default: the variant's k)",
    )
    simulate.set_defaults(fn=cmd_simulate)
    rm = sub.add_parser("rm", help=cmd_rm.__doc__)
    rm.add_argument("data", help="a JSONL file of preference pairs")
    rm.add_argument("--out", required=True, help="the run directory (resumed if it holds checkpoints)")
    rm.add_argument(
        "--model", default=None, help="a model directory to start from (default: the tiny preset)"
    )
    rm.add_argument("--steps", type=int, default=300)
    rm.add_argument("--batch-size", type=int, default=16)
    rm.add_argument("--lr", type=float, default=1e-3)
    rm.add_argument("--no-margin", action="store_true", help="ignore the pairs' margins")
    rm.add_argument("--eval-fraction", type=float, default=0.1)
    rm.add_argument("--seed", type=int, default=0)
    rm.set_defaults(fn=cmd_rm)
    dpo = sub.add_parser("dpo", help=cmd_dpo.__doc__)
    dpo.add_argument("data", help="a JSONL file of preference pairs")
    dpo.add_argument("--out", required=True, help="the run directory (resumed if it holds checkpoints)")
    dpo.add_argument(
        "--model", help="the policy to start from (e.g. `schedrl sft`'s output); also the reference"
    )
    dpo.add_argument("--steps", type=int, default=300)
    dpo.add_argument("--batch-size", type=int, default=16)
    dpo.add_argument("--lr", type=float, default=1e-4)
    dpo.add_argument("--beta", type=float, default=0.1)
    dpo.add_argument("--loss-type", default="sigmoid", help="sigmoid (DPO), hinge (SLiC) or ipo")
    dpo.add_argument("--eval-fraction", type=float, default=0.1)
    dpo.add_argument("--seed", type=int, default=0)
    dpo.set_defaults(fn=cmd_dpo)
    compare = sub.add_parser("compare", help=cmd_compare.__doc__)
    compare.add_argument("run_dirs", nargs="+")
    compare.add_argument("--out", default="compare.html")
    compare.set_defaults(fn=cmd_compare)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except WorkerStuckError as err:  # its thread cannot be joined: leave without waiting for it
        console.print(f"[bold red]error:[/] {escape(str(err))}", soft_wrap=True)
        sys.stdout.flush()
        os._exit(3)
    except (
        ValueError,
        FileNotFoundError,
        FileExistsError,
        RuntimeError,
        CheckpointError,
        ImportError,
    ) as err:
        console.print(f"[bold red]error:[/] {escape(str(err))}", soft_wrap=True)  # "[ray]" is not markup
        return 2


if __name__ == "__main__":
    sys.exit(main())
