"""Tool waits: what a trajectory holds while its tool runs, four ways, on the built-in engine.

Workload: `--episodes` multi-turn trajectories, each `--turns` model turns of `--turn-tokens`
tokens; after every turn but the last a tool answers with `--tool-tokens` tokens after a
lognormal latency (median `--median-s` = 0.1 s, p99 `--p99-s` = 2 s), drawn per (episode, turn)
from the episode's seed, so every way of running it meets the same latencies. Two workloads: a
short history (`--short-prompt` tokens of prompt) and a long one (`--long-prompt`), where every
re-prefill of the history costs. The engine has `--slots` slots; its model is the offline tiny
model (random weights: the tokens do not matter here, their cost does) with a 2,048-token context.

    lockstep       batches of `--slots` trajectories; each turn of a batch starts once the slowest
                   tool of the batch has answered (TRL's tool loop)
    release        the slot is freed during a wait and the next turn prefills the whole history
                   (verl, SkyRL, slime, AReaL: a new request per turn)
    pin            the slot keeps its keys and values for a time to live from the predicted wait;
                   the next turn prefills only the tool's answer; evicted under admission pressure
    pin+priority   pin, and a returning trajectory is admitted ahead of fresh ones (by progress)
    priority       release, with returning trajectories first

Clock. `--clock virtual` (the default) runs the real engine (real tokens, caches, parking and
admission) but charges each engine step by a linear cost model of its work (decode rows, prefill
tokens, attended keys) fitted by least squares to this machine's engine in a calibration run,
and an answer arrives when the virtual time passes its latency; the result is deterministic.
`--clock wall` sleeps the latencies and times the engine for real, then runs the same policies on
the virtual clock and checks the fit on the wall-clock runs' own steps: `fit_error` is the fit's
error on those steps (sum |predicted - measured| / sum measured), and the virtual clock's ratios
are printed beside the wall clock's, so a verdict that depends on the fit shows as a disagreement.

    python bench/tool_waits.py                   # both workloads, virtual clock, ~2 min on 2 cores
    python bench/tool_waits.py --clock wall      # wall clock, then the virtual check (~5 min)
    python bench/tool_waits.py --model small --clock wall --episodes 64   # the 25M model (~25 min)

Figures: trajectories/s (episodes over the makespan), p50/p99 episode latency (from its reset to
its end), prefill tokens computed, tokens reused from parked slots, evictions, and the peak of
keys and values held (tokens, and MB at this model's size). The last line is one JSON object with
`overlap_vs_lockstep` (release / lockstep), `best_policy_vs_release` (on the long workload), and on
the wall clock `fit_error` and the virtual clock's own ratios (`virtual`, `virtual_agrees`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import random
import time
from dataclasses import replace

import torch

from schedrl.engine import EngineConfig, HFEngine, Priority, StepStats
from schedrl.envs.base import Task
from schedrl.envs.environment import Observation, StepResult
from schedrl.models import PRESETS, build_char_tokenizer, build_tiny_model, default_device, preset
from schedrl.models.loading import move_to
from schedrl.rollout.clock import VirtualClock, WallClock, linear_step_cost
from schedrl.rollout.episodes import EpisodeRunner
from schedrl.rollout.tool_wait import ToolWaitPolicy, make_tool_wait
from schedrl.seeding import derive_seed
from schedrl.types import Request, SamplingParams

POLICIES = ("lockstep", "release", "pin", "pin+priority", "priority")
TARGET = 1.3  # best policy / release on the long-history workload


class SimulatedTool:
    """A tool loop with known latencies: answers `tool_tokens` characters after each turn but the last."""

    stop_strings = ()

    def __init__(self, turns: int, tool_tokens: int, median_s: float, sigma: float, virtual: bool) -> None:
        self.turns, self.tool_tokens, self.median_s, self.sigma = turns, tool_tokens, median_s, sigma
        self.virtual, self.seed, self.n = virtual, 0, 0

    async def reset(self, task: Task, seed: int) -> Observation:
        self.seed, self.n = seed, 0
        return Observation(task.prompt, "template")

    def latency(self) -> float:
        rng = random.Random(derive_seed(self.seed, "tool", self.n))
        return self.median_s * math.exp(self.sigma * rng.gauss(0.0, 1.0))

    async def step(self, action: str) -> StepResult:
        self.n += 1
        if self.n >= self.turns:
            return StepResult(None, 1.0, done=True)
        latency = self.latency()
        if not self.virtual:
            await asyncio.sleep(latency)
        text = "".join(
            random.Random(self.seed + self.n).choice("0123456789") for _ in range(self.tool_tokens)
        )
        return StepResult(
            Observation(text, "tool"), None, False, info={"tools": ["ok"], "latency_s": latency}
        )

    async def close(self) -> None:
        return None


def make_policy(name: str) -> ToolWaitPolicy:
    """The registered policy `name`; "pin+priority" is `pin` with returns ordered by progress."""
    if name == "pin+priority":
        return make_tool_wait("pin", priority="progress")
    return make_tool_wait(name, **({"by": "progress"} if name == "priority" else {}))


def episodes(tokenizer, n: int, prompt_tokens: int, budget: int) -> tuple[list[Request], dict[str, Task]]:
    tasks, reqs = {}, []
    for i in range(n):
        rng = random.Random(i)
        prompt = "".join(rng.choice("abcdefghij0123456789+-*") for _ in range(prompt_tokens - 1)) + "="
        t = Task(f"traj{i}", prompt, "", "tools")
        tasks[t.id] = t
        params = SamplingParams(budget, temperature=1.0, ignore_eos=True, seed=derive_seed(0, "episode", i))
        reqs.append(Request(f"e{i}", tuple(tokenizer(prompt).input_ids), params, task_id=t.id))
    return reqs, tasks


class TimedEngine(HFEngine):
    """The built-in engine, recording each step's work and its wall-clock seconds."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.timed: list[tuple[StepStats, float]] = []

    def step(self):
        t = time.perf_counter()
        out = super().step()
        self.timed.append((self.last_step, time.perf_counter() - t))
        return out


def run_policy(model, tokenizer, args, name: str, prompt_tokens: int, clock, steps=None) -> dict:
    """One policy on one workload; `steps` (a list) collects the engine's timed steps."""
    policy = make_policy(name)
    admission = Priority() if policy.orders_returns else None  # FCFS would ignore the priorities
    park = args.park_slots if args.park_slots is not None else 2 * args.slots
    parks = park if policy.parks else 0
    config = EngineConfig(
        max_concurrency=args.slots, max_batched_tokens=8192, max_model_len=2048, park_slots=parks
    )
    engine = TimedEngine(
        model, tokenizer, config, admission=admission, clock=clock if clock.virtual else time.perf_counter
    )
    sigma = math.log(args.p99_s / args.median_s) / 2.326

    def new_env():
        return SimulatedTool(args.turns, args.tool_tokens, args.median_s, sigma, clock.virtual)

    runner = EpisodeRunner(
        engine,
        tokenizer,
        new_env,
        max_turns=args.turns,
        max_observation_tokens=args.tool_tokens + 8,
        max_turn_tokens=args.turn_tokens,
        tool_wait=policy,
        clock=clock,
    )
    reqs, tasks = episodes(tokenizer, args.episodes, prompt_tokens, args.turns * args.turn_tokens)
    batches = (
        [reqs[i : i + args.slots] for i in range(0, len(reqs), args.slots)] if policy.lockstep else [reqs]
    )
    latencies, peak, stats = (
        [],
        0.0,
        {"prefill_tokens": 0.0, "kv_reused_tokens": 0.0, "kv_evicted": 0.0, "kv_expired": 0.0},
    )
    start = clock.now()
    try:
        for batch in batches:
            samples = runner.run(batch, tasks)
            assert all(len(s.token_ids) > 0 for s in samples)
            latencies += runner.last_latencies
            peak = max(peak, runner.last_stats["peak_cached_tokens"])
            for k in stats:
                stats[k] += runner.last_stats[k]
    finally:
        runner.close()
        if steps is not None:
            steps += engine.timed
    makespan = clock.now() - start
    mc = model.config
    kv_bytes_per_token = (
        2 * mc.num_hidden_layers * mc.num_key_value_heads * (mc.hidden_size // mc.num_attention_heads) * 4
    )
    latencies.sort()
    return {
        "policy": name,
        "makespan_s": makespan,
        "traj_per_s": len(reqs) / makespan,
        "p50_s": latencies[len(latencies) // 2],
        "p99_s": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "peak_kv_tokens": peak,
        "peak_kv_mb": peak * kv_bytes_per_token / 2**20,
        **stats,
    }


def print_table(rows: list[dict], workload: str, prompt: int, args, kind: str) -> None:
    print(
        f"\n{workload} history ({prompt}-token prompt), {args.episodes} episodes x {args.turns} turns, "
        f"{args.slots} slots, {args.model} model, {kind} clock"
    )
    print(
        f"{'policy':<14}{'traj/s':>9}{'vs release':>11}{'p50 s':>8}{'p99 s':>8}{'prefill tok':>12}"
        f"{'reused tok':>11}{'evicted':>8}{'expired':>8}{'peak KV tok':>12}{'MB':>7}"
    )
    rel = next((r for r in rows if r["policy"] == "release"), None)
    for r in rows:
        ratio = r["traj_per_s"] / rel["traj_per_s"] if rel else float("nan")
        print(
            f"{r['policy']:<14}{r['traj_per_s']:>9.2f}{ratio:>11.2f}{r['p50_s']:>8.2f}{r['p99_s']:>8.2f}"
            f"{r['prefill_tokens']:>12,.0f}{r['kv_reused_tokens']:>11,.0f}{r['kv_evicted']:>8,.0f}"
            f"{r['kv_expired']:>8,.0f}{r['peak_kv_tokens']:>12,.0f}{r['peak_kv_mb']:>7.1f}"
        )


def calibrate(model, tokenizer, args) -> tuple[list[float], float]:
    """Fit seconds = a + b*decode_rows + c*prefill_tokens + d*context_tokens to real engine steps."""
    rows: list[tuple[StepStats, float]] = []

    class Timed(HFEngine):
        def step(self):
            t = time.perf_counter()
            out = super().step()
            rows.append((self.last_step, time.perf_counter() - t))
            return out

    config = EngineConfig(max_concurrency=args.slots, max_batched_tokens=8192, max_model_len=2048)
    engine = Timed(model, tokenizer, config)
    rng = random.Random(1)
    for rep in range(3):  # mixes of prompt lengths and batch sizes, as the runs will see
        reqs = []
        for i in range(args.slots):
            n = rng.choice((args.short_prompt, args.long_prompt, args.long_prompt // 2, 24))
            reqs.append(
                Request(
                    f"c{rep}-{i}",
                    tuple(rng.randrange(5, 30) for _ in range(n)),
                    SamplingParams(rng.choice((4, 16, 32)), ignore_eos=True, seed=i),
                )
            )
        for j in range(0, len(reqs), 4):  # staggered arrivals: prefill beside decode
            for r in reqs[j : j + 4]:
                engine.add(r)
            engine.step()
        while engine.has_unfinished():
            engine.step()
    rows = rows[8:]  # warm-up
    x = torch.tensor(
        [[1.0, s.decode_rows, s.prefill_tokens, s.context_tokens] for s, _ in rows], dtype=torch.float64
    )
    y = torch.tensor([t for _, t in rows], dtype=torch.float64)
    coef = torch.linalg.lstsq(x, y[:, None]).solution[:, 0].clamp(min=0.0)
    pred = x @ coef
    r2 = 1 - float(((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum())
    return coef.tolist(), r2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--clock",
        choices=("virtual", "wall"),
        default="virtual",
        help="wall: time for real, then check the virtual clock against it in the same run",
    )
    ap.add_argument("--episodes", type=int, default=128)
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument(
        "--park-slots",
        type=int,
        default=None,
        help="cache slots for parked trajectories (default: 2 x --slots)",
    )
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--turn-tokens", type=int, default=24)
    ap.add_argument("--tool-tokens", type=int, default=32)
    ap.add_argument("--short-prompt", type=int, default=64)
    ap.add_argument("--long-prompt", type=int, default=1024)
    ap.add_argument("--median-s", type=float, default=0.1)
    ap.add_argument("--p99-s", type=float, default=2.0)
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--model",
        choices=tuple(PRESETS),
        default="tiny",
        help="the built-in model's size: tiny (~0.45M parameters), small (~25M) or 0.5b (GPU)",
    )
    ap.add_argument("--device", default="auto", help="auto: CUDA when present, else CPU")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.threads == 1 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    tokenizer = build_char_tokenizer()
    tokenizer.model_max_length = 2048
    model = build_tiny_model(tokenizer, replace(preset(args.model), max_position_embeddings=2048))
    move_to(model, default_device() if args.device == "auto" else args.device)
    coef, r2 = calibrate(model, tokenizer, args)
    print(
        f"step cost fit (R^2 {r2:.3f}): {coef[0] * 1e3:.3f} ms + {coef[1] * 1e6:.1f} us/decode row + "
        f"{coef[2] * 1e6:.2f} us/prefill token + {coef[3] * 1e9:.1f} ns/attended key"
    )
    cost = linear_step_cost(*coef)
    clocks = ["wall", "virtual"] if args.clock == "wall" else ["virtual"]
    results: dict[str, dict[str, list[dict]]] = {c: {} for c in clocks}
    wall_steps: list[tuple[StepStats, float]] = []
    for kind in clocks:
        for workload, prompt in (("short", args.short_prompt), ("long", args.long_prompt)):
            rows = results[kind][workload] = []
            for name in args.policies:
                clock = VirtualClock(cost) if kind == "virtual" else WallClock()
                rows.append(
                    run_policy(
                        model, tokenizer, args, name, prompt, clock, wall_steps if kind == "wall" else None
                    )
                )
                gc.collect()  # an engine's cache is GBs at small: free it before the next one is built
            print_table(rows, workload, prompt, args, kind)

    def tps(kind: str, workload: str, name: str) -> float:
        return next((r["traj_per_s"] for r in results[kind][workload] if r["policy"] == name), float("nan"))

    def verdict(kind: str) -> dict:
        best = max(
            (p for p in args.policies if p not in ("lockstep", "release")),
            key=lambda p: tps(kind, "long", p),
            default=None,
        )
        return {
            "overlap_vs_lockstep": {
                w: round(tps(kind, w, "release") / tps(kind, w, "lockstep"), 3) for w in results[kind]
            },
            "best_policy": best,
            "best_policy_vs_release": round(tps(kind, "long", best) / tps(kind, "long", "release"), 3)
            if best
            else None,
            "best_policy_vs_release_short": round(tps(kind, "short", best) / tps(kind, "short", "release"), 3)
            if best
            else None,
        }

    summary = {"clock": args.clock, "model": args.model, **verdict(clocks[0])}
    if wall_steps:
        measured = sum(t for _, t in wall_steps)
        summary["fit_error"] = round(sum(abs(cost(s) - t) for s, t in wall_steps) / measured, 3)
        summary["fit_bias"] = round(sum(cost(s) for s, _ in wall_steps) / measured - 1, 3)
        virtual = verdict("virtual")
        summary["virtual"] = virtual
        # the verdict: whether the best policy meets the target (pin and pin+priority can tie exactly on
        # the virtual clock, so the best one's name is not part of it)
        summary["virtual_agrees"] = ((virtual["best_policy_vs_release"] or 0) >= TARGET) == (
            (summary["best_policy_vs_release"] or 0) >= TARGET
        )
        print(
            f"\nvirtual clock's fit on the wall-clock runs' {len(wall_steps)} steps: error {summary['fit_error']:.1%}, "
            f"bias {summary['fit_bias']:+.1%}; best vs release: wall {summary['best_policy_vs_release']}, "
            f"virtual {virtual['best_policy_vs_release']}"
        )
    summary |= {
        "step_cost": {
            "base_ms": coef[0] * 1e3,
            "row_us": coef[1] * 1e6,
            "prefill_token_us": coef[2] * 1e6,
            "key_ns": coef[3] * 1e9,
            "r2": r2,
        },
        "results": results,
    }
    print(json.dumps(summary, default=lambda x: round(x, 4) if isinstance(x, float) else x))


if __name__ == "__main__":
    main()
