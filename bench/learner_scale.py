"""The learner at scale on this machine: one process against FSDP2 on two ranks, full against LoRA, full
weight pushes against adapter pushes, and the learner's share of the machine's matmul peak (MFU).

Each system runs in a fresh process (its peak resident memory is its own), one after another, on the
same synthetic GRPO batch (`--rows` sequences of `--tokens` tokens, random tokens and advantages):

  full     one learner process, the whole model trained (AdamW on every parameter)
  fsdp2    two learner ranks (gloo), `fully_shard` per decoder layer and the root; each rank's peak
  lora     one learner process, LoRA r = `--lora-r` on the attention projections (`learner.lora`'s
           default targets; peft)

Every process is started with MALLOC_MMAP_THRESHOLD_=65536, so that freed tensors go back to the OS
and resident memory follows what is live (with glibc's default a rank's peak exceeds one process's).
Push: the time of a weight push through the pipeline's path (`engine.weight_push`): the push made (the
weights in buckets, or the adapters), carried across a process boundary (pickled and unpickled, as the
Ray and process backends do) and taken by a built-in engine phase by phase, with its checks (checksums
read back, the probe made and reproduced) and without them; full weights against the adapters (merged
into the engine's kept base); the same without the boundary (the threads backend) beside it. The
simulator's weight-sync cost (`sim.costs.SyncCost`: latency + bytes / bandwidth) is fitted on every
model but the largest and checked against the largest's measured push.
MFU: model FLOPs (6 x trained-through parameters x tokens per step, attention left out) per second over
the machine's measured float32 matmul peak on the same threads.

    python bench/learner_scale.py                       # tiny (0.45M), small (25M), medium (155M), ~7 min
    python bench/learner_scale.py --models small --steps 2

The last line is one JSON object with `fsdp2_peak_ratio` (per-rank peak / one process's),
`lora_peak_ratio` (LoRA / full), `lora_push_speedup` (full push time / adapter push time) and
`push_check_overhead` (checked / unchecked push time), each for the largest model run,
`sim_sync_ratio` (the simulator's predicted / measured push time for it), and every model's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import socket
import statistics
import subprocess
import sys
import time

MODELS = {
    "tiny": {},  # the tiny preset (0.45M)
    "small": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "intermediate_size": 1344},
    "medium": {"hidden_size": 1024, "num_layers": 12, "num_heads": 16, "intermediate_size": 2816},
}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")  # learner.lora's default


def build(model_name: str):
    from schedrl.models import build_char_tokenizer, build_tiny_model
    from schedrl.models.tiny import TinyModelConfig

    return build_tiny_model(build_char_tokenizer(), TinyModelConfig(**MODELS[model_name]))


def batch(rows: int, tokens: int):
    import torch

    from schedrl.training.batch import collate

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 90, (8,), generator=g).tolist() for _ in range(rows)]
    completions = [torch.randint(4, 90, (tokens - 8,), generator=g).tolist() for _ in range(rows)]
    return collate(prompts, completions, pad_id=0), torch.randn(rows, generator=g)


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def train(args, ranks=None) -> dict:
    """Steps of one learner (or rank); its step times and peak resident memory."""
    import torch

    from schedrl.config import AlgoConfig, OptimConfig
    from schedrl.training.learner import Learner
    from schedrl.training.lora import lora_spec

    torch.manual_seed(0)
    model = build(args.model)
    lora = lora_spec({"r": args.lora_r, "alpha": 2 * args.lora_r, "target_modules": LORA_TARGETS})
    optim = OptimConfig(micro_batch_size=args.rows, micro_batch_tokens=0, padding_free=False)
    learner = Learner(
        model, optim, AlgoConfig(), total_steps=100, ranks=ranks, lora=lora if args.system == "lora" else None
    )
    b, adv = batch(args.rows, args.tokens)
    times = []
    for step in range(args.steps + 1):  # the first is warm-up
        start = time.perf_counter()
        learner.update(b, adv, step)
        times.append(time.perf_counter() - start)
    trained = sum(p.numel() for p in model.parameters())  # what the forward and backward go through
    return {
        "step_s": statistics.median(times[1:]),
        "peak_mb": peak_mb(),
        "params": trained,
        "learner": learner,
    }


def rank_main(rank: int, port: int, args, out) -> None:
    import torch

    from schedrl.training.parallel import Ranks, init_group

    torch.set_num_threads(1)
    init_group(rank, 2, port, torch.device("cpu"))
    result = train(args, Ranks(rank, 2, "fsdp2"))
    result.pop("learner")
    torch.distributed.barrier()
    out.put(pickle.dumps((rank, result)))
    torch.distributed.destroy_process_group()


def push_times(learner, model_name: str, lora: bool) -> dict[str, float]:
    """Seconds of a weight push from `learner` to a built-in engine through the pipeline's path: the push
    made (buckets, or the adapters), carried across a process boundary (pickled and unpickled, as the Ray
    and process backends do) and taken by the engine phase by phase (`weight_push.receive`); with the
    checks (bucket checksums read back, the probe made and reproduced) and without; and with the checks
    but no boundary (the threads backend). Medians of 3 after a warm-up."""
    from schedrl.engine import EngineConfig, HFEngine
    from schedrl.engine.weight_push import WeightPush, bucketed, make_probe, receive
    from schedrl.models import build_char_tokenizer
    from schedrl.training.lora import adapter_weights

    tokenizer = build_char_tokenizer()
    engine = HFEngine(build(model_name), tokenizer, EngineConfig())
    model = learner.model

    def make(version: int, check: bool) -> WeightPush:
        if lora:
            push = WeightPush(version, adapters=adapter_weights(model))
        else:
            buckets = bucketed(
                ((n, lambda t=t: t.detach().to("cpu", copy=True)) for n, t in model.state_dict().items()),
                check,
            )
            push = WeightPush(version, buckets, [b.name for b in buckets])
        if check:
            push.probe = make_probe(len(tokenizer), model, 1e-3)
        return push

    times: dict[str, list[float]] = {"push_s": [], "push_unchecked_s": [], "push_in_process_s": []}
    for version in range(4):
        for key, check, boundary in (
            ("push_s", True, True), ("push_unchecked_s", False, True), ("push_in_process_s", True, False)
        ):  # fmt: skip
            start = time.perf_counter()
            push = make(version, check)
            if boundary:
                push = pickle.loads(pickle.dumps(push))
            receive(engine, push, version, check=check)
            times[key].append(time.perf_counter() - start)
    out = {k: statistics.median(v[1:]) for k, v in times.items()}
    out["push_bytes"] = 4 * sum(
        (a.numel() + b.numel() for a, b, _ in adapter_weights(model).layers.values())
        if lora
        else (t.numel() for t in model.state_dict().values())
    )
    return out


def fit_sync_cost(points: list[tuple[float, float]]):
    """The simulator's `SyncCost` (latency + bytes / bandwidth) fitted by least squares to (bytes, seconds)."""
    from schedrl.sim.costs import SyncCost

    n = len(points)
    mx, my = sum(b for b, _ in points) / n, sum(t for _, t in points) / n
    slope = sum((b - mx) * (t - my) for b, t in points) / sum((b - mx) ** 2 for b, _ in points)
    return SyncCost(latency_s=max(my - slope * mx, 0.0), bandwidth_gbs=1 / (slope * 1e9))


def matmul_peak(threads: int) -> float:
    """float32 FLOP/s of a 2,048-square matrix product on `threads` threads (best of 5)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * 2048**3 / best


def child(args) -> None:
    import torch

    if args.system == "fsdp2":
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [ctx.Process(target=rank_main, args=(r, port, args, out)) for r in range(2)]
        for p in procs:
            p.start()
        results = dict(pickle.loads(out.get(timeout=3600)) for _ in range(2))
        for p in procs:
            p.join()
        peak = max(r["peak_mb"] for r in results.values())
        print(json.dumps({"step_s": results[0]["step_s"], "peak_mb": peak, "params": results[0]["params"]}))
        return
    torch.set_num_threads(args.threads)
    result = train(args)
    learner = result.pop("learner")
    result.update(push_times(learner, args.model, args.system == "lora"))
    result["matmul_flops"] = matmul_peak(args.threads)
    print(json.dumps(result))


def run(system: str, model: str, args) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, __file__, "--child", system, "--models", model, "--steps", str(args.steps)]
    cmd += ["--rows", str(args.rows), "--tokens", str(args.tokens), "--lora-r", str(args.lora_r)]
    cmd += ["--threads", str(args.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{system} on {model} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of a one-process learner")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        args.system, args.model = args.child, args.models[0]
        child(args)
        return
    figures = {}
    for model in args.models:
        r = {system: run(system, model, args) for system in ("full", "fsdp2", "lora")}
        full, fsdp2, lora = r["full"], r["fsdp2"], r["lora"]
        flops = 6 * full["params"] * args.rows * args.tokens
        figures[model] = {
            "params_m": round(full["params"] / 1e6, 1),
            "peak_mb": {k: round(v["peak_mb"]) for k, v in r.items()},
            "step_s": {k: round(v["step_s"], 3) for k, v in r.items()},
            "fsdp2_peak_ratio": round(fsdp2["peak_mb"] / full["peak_mb"], 3),
            "lora_peak_ratio": round(lora["peak_mb"] / full["peak_mb"], 3),
            "push_s": {"full": round(full["push_s"], 4), "lora": round(lora["push_s"], 4)},
            "push_unchecked_s": round(full["push_unchecked_s"], 4),
            "push_check_overhead": round(full["push_s"] / full["push_unchecked_s"], 2),
            "push_bytes": full["push_bytes"],
            "lora_push_speedup": round(full["push_s"] / lora["push_s"], 2),
            "lora_push_speedup_unchecked": round(full["push_unchecked_s"] / lora["push_unchecked_s"], 2),
            "lora_push_speedup_in_process": round(full["push_in_process_s"] / lora["push_in_process_s"], 2),
            "mfu_full": round(flops / full["step_s"] / full["matmul_flops"], 3),
            "matmul_gflops": round(full["matmul_flops"] / 1e9, 1),
        }
        f = figures[model]
        print(
            f"{model} ({f['params_m']}M): peak MB {f['peak_mb']}, step s {f['step_s']}; fsdp2 per-rank / one "
            f"process {f['fsdp2_peak_ratio']}, LoRA / full {f['lora_peak_ratio']}; push full "
            f"{f['push_s']['full']} s vs adapters {f['push_s']['lora']} s ({f['lora_push_speedup']}x; without "
            f"the checks {f['lora_push_speedup_unchecked']}x; in one process {f['lora_push_speedup_in_process']}x); MFU "
            f"{f['mfu_full']} of {f['matmul_gflops']} GFLOP/s",
            flush=True,
        )
    last = figures[args.models[-1]]
    sync = {}
    if (
        len(args.models) >= 3
    ):  # the simulator's weight-sync cost, fitted on the smaller models, predicts the largest
        points = [(figures[m]["push_bytes"], figures[m]["push_s"]["full"]) for m in args.models[:-1]]
        cost = fit_sync_cost(points)
        predicted = cost.sync_s(last["push_bytes"])
        sync = {
            "sim_sync_fit": {
                "latency_s": round(cost.latency_s, 4),
                "bandwidth_gbs": round(cost.bandwidth_gbs, 3),
            },
            "sim_sync_predicted_s": round(predicted, 4),
            "sim_sync_ratio": round(predicted / last["push_s"]["full"], 3),
        }
        print(
            f"simulator's weight-sync cost fitted on {', '.join(args.models[:-1])}: latency {cost.latency_s:.4f} s, "
            f"{cost.bandwidth_gbs:.3f} GB/s; predicts {predicted:.3f} s for {args.models[-1]}, measured "
            f"{last['push_s']['full']:.3f} s (ratio {sync['sim_sync_ratio']})",
            flush=True,
        )
    summary = {
        "model": args.models[-1],
        "fsdp2_peak_ratio": last["fsdp2_peak_ratio"],
        "lora_peak_ratio": last["lora_peak_ratio"],
        "lora_push_speedup": last["lora_push_speedup"],
        "push_check_overhead": last["push_check_overhead"],
        **sync,
        "malloc_mmap_threshold": 65536,
        "models": figures,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
