"""The `tools` workload of `bench/vs_trl.py`: multi-turn RL with a calculator whose answers take time.

TRL 1.16's tool path (`GRPOTrainer(tools=...)`) cannot run this workload on the same model and
tokenizer, and `probe_trl` shows why on every run rather than claiming it:

* it needs a chat template that renders a tool-calling conversation (user, assistant with
  `tool_calls`, tool) and a response parser for it; the character tokenizer has neither, and TRL
  refuses to start;
* the templates TRL can parse (Qwen2.5 and the like, `trl.chat_template_utils`) spend 823 tokens of
  the character tokenizer on the system prompt and tool list before the task's few characters,
  past the tiny model's 512-token context; and TRL parses calls from JSON between `<tool_call>`
  tags only, not the compact `<<calc 347*86>>` the 0.45M model learns.

So, as the benchmark's spec allows, schedrl is compared against TRL's way of running tools, the
lock-step loop, on schedrl's own engine: every trajectory of a batch waits for the slowest tool
call of its turn (`schedule.tool_wait=lockstep`, synchronous loop). Same start (the same SFT warm-up
on tool-use traces), tasks, settings and evaluator; only the schedule differs. The calculator
answers after a lognormal latency (median 0.1 s, p99 2 s, as `bench/tool_waits.py`), drawn from the
expression, so both schedules meet the same latencies: a real tool (search, code execution, a web
page) takes time, and an instant one leaves nothing to schedule.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import tempfile
import time
import zlib
from pathlib import Path

from vs_trl import time_to  # the same time-to-target rule as the other workloads

from schedrl.config import SFTConfig, config_from_dict
from schedrl.envs import make_task
from schedrl.envs.calc import calc as exact_calc
from schedrl.models import build_char_tokenizer, build_tiny_model
from schedrl.orchestrate.run import train
from schedrl.training.run_dir import RunDir
from schedrl.training.sft import sft_warmup

MEDIAN_S, P99_S = 0.1, 2.0
TASK = {"name": "calc", "args": {"min_digits": 2, "max_digits": 3, "ops": "*"}}
SFT = SFTConfig(steps=170, batch_size=32, lr=1e-3)  # examples/calc_tools.yaml: a start at pass@1 ~0.2
SCHEDULES = {
    # TRL's tool loop: a batch's next turn starts once its slowest call has answered
    "lockstep": ["schedule.tool_wait=lockstep"],
    # schedrl's best: engine and learner overlap (staleness bound 1, decoupled PPO); weights reach the
    # engine between decode steps; an update trains on the oldest complete groups while episodes still
    # waiting on a slow call carry over (twice a step's episodes in flight); waiting episodes keep their
    # cache and returning ones are admitted first
    "schedrl": [
        "pipeline.mode=async",
        "pipeline.backend=threads",
        "schedule.max_staleness=1",
        "algo.correction=decoupled",
        "schedule.weight_sync=inflight",
        "schedule.consumption=partial",
        "schedule.consumption_args={overprovision: 2.0}",
        "schedule.tool_wait=pin",
        "schedule.tool_wait_args={priority: progress}",
        "engine.park_slots=64",
    ],
}


def latency(expression: str) -> float:
    sigma = math.log(P99_S / MEDIAN_S) / 2.3263  # z of the 99th percentile
    return random.Random(zlib.crc32(expression.encode())).lognormvariate(math.log(MEDIAN_S), sigma)


async def calc(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: integers with + - * / and parentheses, e.g. 347*86
    """
    await asyncio.sleep(latency(expression))
    return exact_calc(expression)


def probe_trl(start: Path) -> list[str]:
    """Why TRL's GRPOTrainer cannot run this workload: each reason as TRL or the numbers give it."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    from schedrl.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(start, device="cpu")
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": "347*86="}]}] * 8)
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_tools_probe_"),
        per_device_train_batch_size=8,
        num_generations=8,
        max_steps=1,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
    )
    reasons = []
    try:
        GRPOTrainer(
            model=model,
            reward_funcs=lambda prompts, completions, **kw: [0.0] * len(prompts),
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
            tools=[exact_calc],
        )
        reasons.append("GRPOTrainer(tools=[calc]) started on the character tokenizer")
    except Exception as err:  # TRL's own refusal, recorded as it says it
        reasons.append(f"GRPOTrainer(tools=[calc]) on the character tokenizer: {type(err).__name__}: {err}")
    templated = AutoTokenizer.from_pretrained(start)
    templated.chat_template = qwen2_5_chat_template
    text = templated.apply_chat_template(
        [{"role": "user", "content": "347*86="}],
        tools=[exact_calc],
        add_generation_prompt=True,
        tokenize=False,
    )
    n = len(templated(text)["input_ids"])
    context = model.config.max_position_embeddings
    reasons.append(
        f"with TRL's Qwen2.5 template (one it can parse), the prompt of one task is {n} tokens "
        f"of the character tokenizer, past the model's {context}-token context"
    )
    return reasons


def sft_start(seed: int, out: Path) -> Path:
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer)
    sft_warmup(model, tokenizer, make_task(TASK["name"], **TASK["args"]), SFT, seed)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def run(start: Path, schedule: list[str], seed: int, steps: int, work: Path) -> dict:
    cfg = config_from_dict(
        {
            "seed": seed,
            "steps": steps,
            "save_every": 0,
            "out_dir": str(work),
            "name": "run",
            "min_start_reward": 0.0,
            "model": {"path": str(start)},
            "task": {
                **TASK,
                "env": "tools",
                "env_args": {
                    "tools": [f"{__name__}:calc"],
                    "parser": "compact",
                    "max_calls": 2,
                    "timeout_s": 10.0,
                },
                "max_turns": 3,
                "max_observation_tokens": 64,
            },
            "sampling": {"prompts_per_step": 16, "group_size": 8, "max_new_tokens": 32, "temperature": 1.0},
            "algo": {"loss": "grpo", "loss_args": {"clip_eps": 0.2, "clip_eps_high": 0.28}},
            "optim": {"lr": 2e-4},
            "sft": {"steps": 0},
            "eval": {"tasks": 100, "k": 4},
        },
        schedule,
    )
    times, rewards = [], []

    def on_step(step: int, m: dict) -> None:
        times.append(time.perf_counter())
        rewards.append(m["reward_mean"])

    t0 = time.perf_counter()
    out = train(cfg, RunDir.create(work, "run"), on_step=on_step)
    return {
        "curve": rewards,
        "elapsed": [t - t0 for t in times],
        "final_reward": statistics.mean(rewards[-20:]),
        "eval_pass@1": out["eval_after"]["pass@1"],
        "eval_greedy": out["eval_after"]["greedy_acc"],
        "eval_before_pass@1": out["eval_before"]["pass@1"],
        "steps_per_s": (len(times) - 1) / (times[-1] - times[0]),
    }


def plot(runs: dict[str, list[dict]], path: Path, window: int = 20) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, color in zip(runs, ("tab:blue", "tab:orange"), strict=False):
        for i, r in enumerate(runs[name]):
            avg = [
                statistics.mean(r["curve"][max(0, j - window + 1) : j + 1]) for j in range(len(r["curve"]))
            ]
            label = name if i == 0 else None
            axes[0].plot(r["elapsed"], avg, color=color, alpha=0.8, label=label)
            axes[1].plot(range(1, len(avg) + 1), avg, color=color, alpha=0.8, label=label)
    for ax, xlabel in zip(axes, ("wall-clock s", "step"), strict=True):
        ax.set(
            title=f"calc with a slow tool: reward ({window}-step moving average)",
            xlabel=xlabel,
            ylabel="reward",
        )
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def compare(seeds: int, steps: int, plot_path: Path | None = None) -> dict:
    """Both schedules from the same start per seed (alternating who runs first); the report."""
    reasons: list[str] = []
    runs: dict[str, list[dict]] = {name: [] for name in SCHEDULES}
    for seed in range(seeds):
        work = Path(tempfile.mkdtemp(prefix=f"vs_trl_tools_{seed}_"))
        start = sft_start(seed, work / "start")
        if seed == 0:
            reasons = probe_trl(start)
            for r in reasons:
                print(f"tools: TRL: {r}", flush=True)
        order = list(SCHEDULES) if seed % 2 == 0 else list(reversed(SCHEDULES))
        for name in order:
            out = run(start, SCHEDULES[name], seed, steps, work / name)
            runs[name].append(out)
            print(
                f"tools seed {seed} {name:8s} {out['steps_per_s']:.2f} steps/s  final reward "
                f"{out['final_reward']:.3f}  eval pass@1 {out['eval_before_pass@1']:.3f} -> "
                f"{out['eval_pass@1']:.3f}",
                flush=True,
            )
    if plot_path is not None:
        plot(runs, plot_path)
    target = 0.9 * min(statistics.median(r["final_reward"] for r in rs) for rs in runs.values())
    times = {name: [time_to(r, target) for r in rs] for name, rs in runs.items()}
    ratios = [a / b for a, b in zip(times["lockstep"], times["schedrl"], strict=True) if min(a, b) < math.inf]
    med = {
        name: {
            k: round(statistics.median(r[k] for r in rs), 3) for k in rs[0] if k not in ("curve", "elapsed")
        }
        for name, rs in runs.items()
    }
    return {
        "trl_cannot_run": reasons,
        "baseline": "lockstep (TRL's tool loop) on schedrl's engine",
        "tool_latency": {"median_s": MEDIAN_S, "p99_s": P99_S},
        "schedules": SCHEDULES,
        "target_reward": round(target, 3),
        **{f"{name}_time_to_target_s": [round(t, 1) for t in ts] for name, ts in times.items()},
        "lockstep_time_to_target_over_schedrl": round(statistics.median(ratios), 3) if ratios else None,
        "per_seed": [round(r, 3) for r in ratios],
        **{f"{name}_{k}": v for name, m in med.items() for k, v in m.items()},
    }
