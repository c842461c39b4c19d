"""The learner on one GPU at the 0.5b preset: full fine-tuning against LoRA, each with bfloat16 compute,
float32 parameters and AdamW state, and gradient checkpointing; then checked weight pushes into vLLM on
the same GPU (full weights in buckets, and adapters as LoRA requests), each followed by the probe
(`engine.weight_push`). Part of `bench/gpu_check.sh --learner`.

Each system trains `--steps` GRPO steps (after one warm-up) on a synthetic batch of `--rows` sequences of
`--tokens` tokens; its peak is the GPU's allocated peak (on a CPU, the process's resident peak, which only
grows: the LoRA figure is then an upper bound).

    python bench/learner_gpu.py                                   # on a GPU: 0.5b, vLLM pushes
    python bench/learner_gpu.py --model tiny --device cpu --no-vllm --steps 1   # the dry run

The last line is one JSON object: each system's `step_s` and `peak_mb`, `lora_peak_ratio`, and with vLLM
the push times and the probes' largest log-prob difference.
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import statistics
import time

import torch

from schedrl.config import AlgoConfig, OptimConfig
from schedrl.models import build_char_tokenizer, build_tiny_model
from schedrl.models.tiny import preset
from schedrl.training.batch import collate
from schedrl.training.learner import Learner
from schedrl.training.lora import lora_spec


def peak_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def synthetic_batch(rows: int, tokens: int, device: torch.device):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 90, (8,), generator=g).tolist() for _ in range(rows)]
    completions = [torch.randint(4, 90, (tokens - 8,), generator=g).tolist() for _ in range(rows)]
    return collate(prompts, completions, pad_id=0).to(device), torch.randn(rows, generator=g).to(device)


def train(base, system: str, args, device: torch.device) -> tuple[Learner, dict]:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    model = copy.deepcopy(base).to(device)
    lora = lora_spec({"r": args.lora_r, "alpha": 2 * args.lora_r}) if system == "lora" else None
    optim = OptimConfig(micro_batch_size=args.rows, micro_batch_tokens=0, gradient_checkpointing=True)
    learner = Learner(model, optim, AlgoConfig(), total_steps=100, lora=lora, compute_dtype=torch.bfloat16)
    batch, adv = synthetic_batch(args.rows, args.tokens, device)
    times = []
    for step in range(args.steps + 1):  # the first is warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        learner.update(batch, adv, step)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    assert all(p.dtype == torch.float32 for p in learner.model.parameters())  # bf16 compute only
    return learner, {"step_s": round(statistics.median(times[1:]), 4), "peak_mb": round(peak_mb(device))}


def vllm_pushes(base, learners: dict[str, Learner], args) -> dict:
    """A checked full push and a checked adapter push into vLLM engines on this device."""
    from schedrl.engine import EngineConfig
    from schedrl.engine.vllm_engine import VLLMEngine
    from schedrl.engine.weight_push import WeightPush, check_probe, make_probe, push_of, receive
    from schedrl.training.lora import adapter_weights

    tokenizer = build_char_tokenizer()
    settings = {"gpu_memory_utilization": args.vllm_memory} if torch.cuda.is_available() else {}
    out = {}
    engine = VLLMEngine(base, tokenizer, EngineConfig(max_concurrency=8), vllm_args=settings)
    try:
        model = learners["full"].model
        start = time.perf_counter()
        push = push_of(model, 1, tol=args.probe_tol)
        receive(engine, push, 1)
        out["vllm_push_s"] = round(time.perf_counter() - start, 3)
        assert push.probe is not None
        out["vllm_probe_max_diff"] = check_probe(engine.run_probe(push.probe), push.probe, 1)
    finally:
        engine.close()
    spec = lora_spec({"r": args.lora_r, "alpha": 2 * args.lora_r})
    engine = VLLMEngine(base, tokenizer, EngineConfig(max_concurrency=8), vllm_args=settings, lora=spec)
    try:
        peft_model = learners["lora"].model
        start = time.perf_counter()
        push = WeightPush(1, adapters=adapter_weights(peft_model))
        push.probe = make_probe(len(tokenizer), peft_model, args.probe_tol)
        receive(engine, push, 1)
        out["vllm_adapter_push_s"] = round(time.perf_counter() - start, 3)
        out["vllm_adapter_probe_max_diff"] = check_probe(engine.run_probe(push.probe), push.probe, 1)
    finally:
        engine.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--model", default="0.5b", choices=["tiny", "small", "0.5b"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--no-vllm", action="store_true", help="skip the pushes into vLLM")
    ap.add_argument("--vllm-memory", type=float, default=0.3, help="vLLM's gpu_memory_utilization")
    ap.add_argument("--probe-tol", type=float, default=5e-2, help="bfloat16 compute: 5e-2")
    args = ap.parse_args()
    device = torch.device(args.device)
    base = build_tiny_model(build_char_tokenizer(), preset(args.model))  # float32 parameters
    learners, figures = {}, {}
    for system in ("full", "lora"):
        learners[system], figures[system] = train(base, system, args, device)
        print(f"{system}: {figures[system]}", flush=True)
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "model": args.model,
        "params_m": round(sum(p.numel() for p in base.parameters()) / 1e6, 1),
        "compute_dtype": "bfloat16",
        "gradient_checkpointing": True,
        **figures,
        "lora_peak_ratio": round(figures["lora"]["peak_mb"] / figures["full"]["peak_mb"], 3),
    }
    if not args.no_vllm:
        result.update(vllm_pushes(base, learners, args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
