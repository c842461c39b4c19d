"""What the cluster's work costs: a decode step, a prefill, a training step, a weight sync.

A decode step of an engine holding `b` running requests with `ctx` tokens of keys and values in all,
which also prefills `p` new prompt tokens, takes the roofline time

    overhead_s + max(weights_s + kv_token_s x ctx, compute_token_s x b) + prefill_token_s x p

the larger of the memory time (stream the weights once, and every cached key and value) and the
compute time of its `b` decode tokens, plus the prefill's compute. An engine that pads its batched
decode attention to the longest running request (the built-in engine on a CPU: every row gathers and
attends `longest` keys) adds `padded_key_s x b x longest`; a paged-attention engine reads each row's
own keys only, and leaves it 0. `EngineCost.from_hardware` derives
the coefficients from a model and a GPU (bandwidth, FLOP/s, and the fractions of each achieved);
with `combine: sum` the two terms add (a CPU, which overlaps neither);
a scenario may give them directly, or a calibration fits them to a run's timings.

A training step on `g` devices over `T` tokens (prompts and responses) takes
`fixed_s + T / (tokens_per_s_per_gpu x g)`. A weight sync takes `seconds`, or
`latency_s + weight bytes / bandwidth`.
"""

from __future__ import annotations

from dataclasses import dataclass

# accelerator specs: HBM bandwidth (GB/s) and dense bf16 tensor FLOP/s (TFLOP/s), from the vendors' sheets
GPUS = {
    "h100": {"bandwidth_gbs": 3350.0, "tflops": 989.0},
    "h200": {"bandwidth_gbs": 4800.0, "tflops": 989.0},
    "h800": {"bandwidth_gbs": 3350.0, "tflops": 989.0},
    "a100": {"bandwidth_gbs": 2039.0, "tflops": 312.0},
    "h20": {"bandwidth_gbs": 4000.0, "tflops": 148.0},
}


@dataclass
class EngineCost:
    overhead_s: float = 0.005  # per decode step: scheduling, kernel launches
    weights_s: float = 0.0  # per decode step: streaming the weights once
    kv_token_s: float = 0.0  # per cached key/value token read in a step
    compute_token_s: float = 0.0  # per decoded token of the batch
    prefill_token_s: float = 0.0  # per prefilled prompt token
    padded_key_s: float = 0.0  # per key of a decode step's attention padded to its longest context
    max_batch: int = 256  # running requests per engine
    kv_capacity_tokens: int = 0  # keys/values an engine holds (0: no limit beyond max_batch)
    # how the memory and compute terms combine: "max" (a GPU overlaps them: the roofline) or "sum"
    # (a CPU does not: the additive cost `StepCost` fits on the built-in engine)
    combine: str = "max"

    def step_s(self, batch: int, ctx: float, prefill: float = 0.0, longest: float = 0.0) -> float:
        """One decode step of `batch` requests holding `ctx` context tokens in all, the longest `longest`."""
        memory = self.weights_s + self.kv_token_s * ctx
        compute = self.compute_token_s * batch
        both = memory + compute if self.combine == "sum" else max(memory, compute)
        padded = self.padded_key_s * batch * longest
        return self.overhead_s + both + padded + self.prefill_token_s * prefill

    @classmethod
    def from_hardware(
        cls,
        params_b: float,
        gpu: str = "h100",
        gpus_per_engine: int = 1,
        bytes_per_param: float = 2.0,
        kv_bytes_per_token: float = 131072.0,
        mbu: float = 0.6,
        mfu: float = 0.4,
        overhead_s: float = 0.005,
        max_batch: int = 256,
        memory_gb: float = 80.0,
        memory_util: float = 0.9,
        active_params_b: float | None = None,
    ) -> EngineCost:
        """Coefficients for a model of `params_b` billion parameters (`active_params_b` for a mixture of
        experts) on `gpus_per_engine` GPUs of kind `gpu`: memory time at `mbu` of the bandwidth, compute at
        `mfu` of the FLOP/s, KV capacity what is left of `memory_util` x memory after the weights."""
        if gpu not in GPUS:
            raise ValueError(f"unknown gpu {gpu!r}; known: {', '.join(GPUS)}")
        spec = GPUS[gpu]
        bandwidth = spec["bandwidth_gbs"] * 1e9 * mbu * gpus_per_engine
        flops = spec["tflops"] * 1e12 * mfu * gpus_per_engine
        active = active_params_b if active_params_b is not None else params_b
        weight_bytes = params_b * 1e9 * bytes_per_param
        free = memory_gb * 1e9 * memory_util * gpus_per_engine - weight_bytes
        if free <= 0:
            raise ValueError(
                f"a {params_b}B model ({weight_bytes / 1e9:.0f} GB) does not fit {gpus_per_engine} x {memory_gb} GB"
            )
        return cls(
            overhead_s=overhead_s,
            weights_s=active * 1e9 * bytes_per_param / bandwidth,
            kv_token_s=kv_bytes_per_token / bandwidth,
            compute_token_s=2 * active * 1e9 / flops,
            prefill_token_s=2 * active * 1e9 / flops,
            max_batch=max_batch,
            kv_capacity_tokens=int(free / kv_bytes_per_token),
        )


@dataclass
class LearnerCost:
    tokens_per_s_per_gpu: float = 2000.0  # training tokens (prompt + response) per second per device
    fixed_s: float = 0.0  # per update: optimizer step, logging, the non-scaling part
    # passes besides the update (recomputed old log-probs, a reference model), as a fraction of its time
    recompute_frac: float = 0.0

    def train_s(self, tokens: float, gpus: int) -> float:
        return self.fixed_s + tokens * (1.0 + self.recompute_frac) / (
            self.tokens_per_s_per_gpu * max(gpus, 1)
        )


@dataclass
class SyncCost:
    seconds: float | None = None  # a measured weight-sync time; else latency + bytes / bandwidth
    latency_s: float = 0.0  # fixed seconds of a weight sync, before the bytes move
    bandwidth_gbs: float = 25.0  # effective trainer-to-engine bandwidth

    def sync_s(self, weight_bytes: float) -> float:
        if self.seconds is not None:
            return self.seconds
        return self.latency_s + weight_bytes / (self.bandwidth_gbs * 1e9)
