"""Where a reward model runs: driver, colocated or separate placement, synchronous and asynchronous.

A reward model as large as the policy (the policy's preset with a one-score head, random weights: this
measures throughput, not what is learned) scores every sample of RL runs on the `sort` task whose
completions run to `--max-new-tokens`. The runs use the asynchronous pipeline on the threads backend
(an engine worker pinned to core 0, the learner to core 1), with `schedule.max_staleness` 0
(`sync`: generate, then train, sample for sample the synchronous loop) or 1 (`async`: the next batch is
generated while the learner trains). `pipeline.reward_placement` puts the reward model:

- `driver`: in the driving thread, scoring each engine chunk's finished samples as they come back;
- `colocated`: in the engine worker, between its engine steps, on the engine's core;
- `separate`: in a reward worker of its own (a thread on no core of its own), scoring while the
  engine decodes.

Each run is a fresh process. Per placement and mode (median over rounds, the first two steps left out as
start-up): RL steps per
second, samples scored per second (samples per step x steps per second) and the reward model's busy
seconds per step where it has a worker of its own to time (colocated, separate). Runs alternate, round
after round. The last line printed is one JSON object.

    python bench/reward_placement.py                       # tiny, 8 steps, 2 rounds
    python bench/reward_placement.py --model small --steps 5 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLACEMENTS = ("driver", "colocated", "separate")
MODES = {"sync": 0, "async": 1}


def reward_model_dir(name: str, out: Path) -> str:
    """A reward model the size of the policy: the preset's shape with a one-score head."""
    import torch
    from transformers import LlamaForSequenceClassification

    from schedrl.models import build_char_tokenizer, build_tiny_model
    from schedrl.models.tiny import preset

    tokenizer = build_char_tokenizer()
    torch.manual_seed(1)
    config = build_tiny_model(tokenizer, preset(name)).config
    config.num_labels = 1
    LlamaForSequenceClassification(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def one_run(args, rm: str, out: str, placement: str, mode: str, rnd: int) -> dict:
    import schedrl
    from schedrl.timeline import TIMELINE_FILE, read_spans
    from schedrl.training.run_dir import read_metrics

    name = f"{mode}-{placement}-{rnd}"
    cfg = {
        "steps": args.steps, "save_every": 0, "out_dir": out, "name": name, "seed": rnd,
        "model": {"preset": args.model}, "sft": {"steps": 0}, "eval": {"tasks": 0},
        "min_start_reward": -1e9, "logging": {"backends": ["jsonl"]},
        "sampling": {"prompts_per_step": args.prompts, "group_size": args.group,
                     "max_new_tokens": args.max_new_tokens, "temperature": 1.0},
        "task": {"name": "sort", "args": {"min_len": 2, "max_len": 3},
                 "reward_model": {"path": rm, "weight": 1.0, "rule_weight": 0.0, "batch_size": 64}},
        "algo": {"correction": "decoupled"},
        "pipeline": {"mode": "async", "backend": "threads", "reward_placement": placement},
        "schedule": {"max_staleness": MODES[mode]},
    }  # fmt: skip
    start = time.perf_counter()
    schedrl.train(cfg)
    wall = time.perf_counter() - start
    rows = [r for r in read_metrics(Path(out) / name / "metrics.jsonl") if "step_s" in r]
    steady = rows[2:] if len(rows) > 3 else rows
    step_s = statistics.median(r["step_s"] for r in steady)
    spans = [s for s in read_spans(Path(out) / name / TIMELINE_FILE) if s.kind == "reward"]
    reward_busy = sum(s.end - s.start for s in spans) / len(rows) if spans else None
    samples = args.prompts * args.group
    return {
        "steps_per_s": 1 / step_s,
        "samples_scored_per_s": samples / step_s,
        "reward_busy_s_per_step": reward_busy,
        "wall_s": wall,
    }


def in_process(args, rm: str, out: str, placement: str, mode: str, rnd: int) -> dict:
    """`one_run` in a fresh Python process (its figures, the last line it prints)."""
    argv = [sys.executable, __file__, "--one", rm, out, placement, mode, str(rnd)]
    for flag in ("model", "steps", "prompts", "group", "max_new_tokens"):
        argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "small"], default="tiny")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--out", default=None, help="where the runs go (default: a temporary directory)")
    parser.add_argument(
        "--one", nargs=5, metavar=("RM", "OUT", "PLACEMENT", "MODE", "ROUND"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.one:
        rm, out, placement, mode, rnd = args.one
        print(json.dumps(one_run(args, rm, out, placement, mode, int(rnd))))
        return

    root = Path(args.out or tempfile.mkdtemp(prefix="reward-placement-"))
    root.mkdir(parents=True, exist_ok=True)
    rm = reward_model_dir(args.model, root / "reward-model")
    runs: dict[tuple[str, str], list[dict]] = {}
    for rnd in range(args.rounds):
        for mode in MODES:
            for placement in PLACEMENTS:
                r = in_process(args, rm, str(root), placement, mode, rnd)
                runs.setdefault((mode, placement), []).append(r)
                print(f"round {rnd} {mode:5s} {placement:9s} {r['steps_per_s']:.3f} steps/s "
                      f"{r['samples_scored_per_s']:.1f} samples/s", flush=True)  # fmt: skip

    def median(mode: str, placement: str, key: str) -> float | None:
        values = [r[key] for r in runs[(mode, placement)] if r[key] is not None]
        return round(statistics.median(values), 4) if values else None

    result: dict = {"model": args.model, "steps": args.steps, "rounds": args.rounds}
    print(
        f"\n{'mode':6s} {'placement':10s} {'steps/s':>8s} {'samples/s':>10s} {'vs driver':>9s} {'reward s/step':>13s}"
    )
    for mode in MODES:
        table = {}
        for placement in PLACEMENTS:
            table[placement] = {
                k: median(mode, placement, k)
                for k in ("steps_per_s", "samples_scored_per_s", "reward_busy_s_per_step")
            }
        base = table["driver"]["steps_per_s"] or 1.0
        for placement, t in table.items():
            t["vs_driver"] = round((t["steps_per_s"] or 0.0) / base, 3)
            busy = t["reward_busy_s_per_step"]
            print(f"{mode:6s} {placement:10s} {t['steps_per_s']:8.3f} {t['samples_scored_per_s']:10.1f} "
                  f"{t['vs_driver']:9.3f} {'-' if busy is None else f'{busy:.3f}':>13s}")  # fmt: skip
        result[mode] = table
        result[f"best_{mode}"] = max(PLACEMENTS, key=lambda p: table[p]["steps_per_s"] or 0.0)
    result["samples_scored_per_s"] = {
        f"{mode}/{p}": result[mode][p]["samples_scored_per_s"] for mode in MODES for p in PLACEMENTS
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
