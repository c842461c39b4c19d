"""The engine's admission learned by PPO against FCFS, LPT and Past-Future, on the cost model and the real engine.

Held-out workloads of `schedrl/Admission-v0` (64 `longtail` requests each, seeds disjoint from training):
prompt lengths, true output lengths, and predictions off by a log-normal factor (sigma 0.5). Every
policy gets the same predictions.

- **Model.** The simulated engine of `schedrl/Admission-v0`, priced by a `StepCost` fit on this
  machine's built-in engine (`measure_steps` over a calibration workload): the makespan of each policy.
- **Engine.** The built-in engine (`HFEngine`, the tiny model, `max_concurrency` = the environment's
  places) runs the same workloads: each request is its prompt (token ids drawn from the vocabulary)
  and decodes exactly its true length (`ignore_eos`, `max_new_tokens`). The policy sees the
  predictions through a predictor that returns them. Wall seconds per workload, the median of
  `--repeats` runs, the policies' order rotated between runs.

`--workload multiturn` (`MultiTurnJobs`): 24 episodes of 2-4 turns (about 72 turns), each turn a `longtail` answer,
a tool answering 5-50 ms after each turn, the next turn's prompt the whole history. A later turn joins
the queue only when its tool answers; on the engine the driver sleeps when nothing runs, and the
makespan is wall time, idle included.

Policies: FCFS; LPT and SPT by predicted length (`LengthOrdered`); Past-Future (memory-aware FCFS)
at `--kv-frac` of FCFS's peak KV tokens; the learned policy (`LearnedAdmission`, greedy); and, as
references, LPT by the true lengths and the bound max(longest, total / places) steps.

    python bench/admission_rl.py                         # the committed bench/policies/admission_attention.pt
    python bench/admission_rl.py --workload multiturn    # multi-turn episodes: later turns wait on a tool
    python bench/admission_rl.py --policy runs/Admission-...   # a run directory (its latest checkpoint)
    python bench/admission_rl.py --export runs/Admission-...   # write the committed file from a run

The last line printed is one JSON object with `learned_vs_best_heuristic_model` and
`learned_vs_best_heuristic_engine`: the best heuristic's mean makespan over the learned policy's
(> 1: the learned policy is faster), the best heuristic being the one of FCFS, LPT, SPT and
Past-Future with the shortest mean makespan in that mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from schedrl.classic.attention import load_entity_policy, save_entity_policy
from schedrl.engine import EngineConfig, HFEngine
from schedrl.envs.scheduling.admission_env import (
    AdmissionEnv,
    Job,
    LongtailJobs,
    MultiTurnJobs,
    StepCost,
    measure_steps,
)
from schedrl.models import build_char_tokenizer, build_tiny_model
from schedrl.rollout import LengthOrdered, LengthPredictor, PastFutureAdmission
from schedrl.rollout.learned import LearnedAdmission
from schedrl.types import Request, SamplingParams

POLICY = Path(__file__).parent / "policies" / "admission_attention.pt"
HELD_OUT_SEED = 9_000_000
HEURISTICS = ("fcfs", "lpt", "spt", "past_future")


class GivenLengths(LengthPredictor):
    """The workload's predictions (the true lengths off by the environment's noise), by request id."""

    name = "given"

    def __init__(self, predicted: dict[str, float]) -> None:
        super().__init__()
        self.predicted = predicted

    def predict(self, request: Request) -> float:
        return self.predicted[request.id]


def requests_of(jobs: list[Job], vocab: int, seed: int) -> tuple[list[Request], dict[str, float]]:
    rng = np.random.default_rng(seed)
    reqs, pred = [], {}
    for k, j in enumerate(jobs):
        rid = f"w{seed}-{k}"
        prompt = tuple(int(t) for t in rng.integers(4, vocab, j.prompt))
        params = SamplingParams(max_new_tokens=j.length, temperature=0.0, ignore_eos=True)
        reqs.append(Request(rid, prompt, params))
        pred[rid] = j.predicted
    return reqs, pred


def drive(engine, jobs: list[Job], reqs: list[Request]) -> tuple[float, list]:
    """Run a workload on the engine in wall time: a later turn is added when its tool answers (its
    `wait_s` after the turn it follows ends). Returns the makespan and each step's work and seconds."""
    after: dict[str, list[int]] = {}
    for k, j in enumerate(jobs):
        if j.follows >= 0:
            after.setdefault(reqs[j.follows].id, []).append(k)
    pending = [(0.0, k) for k, j in enumerate(jobs) if j.follows < 0]  # a heap of (arrival s, job)
    records, t0 = [], time.perf_counter()
    while pending or engine.has_unfinished():
        now = time.perf_counter() - t0
        while pending and pending[0][0] <= now:
            engine.add(reqs[heapq.heappop(pending)[1]])
        if not engine.has_unfinished():
            time.sleep(max(0.0, pending[0][0] - now))
            continue
        start = time.perf_counter()
        finished = engine.step()
        records.append((engine.last_step, time.perf_counter() - start))
        end = time.perf_counter() - t0
        for smp in finished:
            for k in after.get(smp.request_id, ()):
                heapq.heappush(pending, (end + jobs[k].wait_s, k))
    return time.perf_counter() - t0, records


def num(v: float) -> float | None:
    """A figure for the JSON line: rounded, None where it does not apply (NaN)."""
    return None if math.isnan(v) else round(v, 4)


def run_workload(engine, jobs: list[Job], reqs: list[Request], multi: bool) -> tuple[float, list]:
    """The workload's makespan on the engine and its step records: single-turn, the sum of step seconds
    (all requests queued at once); multi-turn, the wall time of `drive`."""
    if multi:
        return drive(engine, jobs, reqs)
    records = measure_steps(engine, reqs)
    return sum(t for _, t in records), records


def simulate_policy(jobs: list[Job], slots: int, cost: StepCost, policy) -> float:
    """The simulated makespan of `jobs` under `policy`: a heuristic name or the learned network."""
    env = AdmissionEnv(lambda rng: list(jobs), slots, cost, max_waiting=64, normalize=False)
    obs, info = env.reset(seed=0)
    done = env.finished
    while not done:
        if isinstance(policy, str):
            a = env.teacher_action(policy)
        else:
            with torch.no_grad():
                t = torch.from_numpy(obs)[None]
                a = int(policy.act(t, torch.from_numpy(info["action_mask"])[None], deterministic=True)[0])
        obs, _, done, _, info = env.step(a)
    return env.clock


def oracle_jobs(jobs: list[Job]) -> list[Job]:
    return [dataclasses.replace(j, predicted=float(j.length)) for j in jobs]


def bound_seconds(jobs: list[Job], slots: int, cost: StepCost) -> float:
    steps = max(max(j.length for j in jobs), -(-sum(j.length for j in jobs) // slots))
    # decode rows, prefilled tokens and keys attended do not depend on the order: every schedule pays them
    rows = sum(j.length for j in jobs) - len(jobs)
    keys = sum(j.length * j.prompt + j.length * (j.length + 1) // 2 for j in jobs)
    prefill = sum(j.prompt for j in jobs)
    return cost.base * steps + cost.per_row * rows + cost.per_prefill * prefill + cost.per_context * keys


def engine_admission(name: str, pred: dict[str, float], args, kv_budget: int):
    given = GivenLengths(pred)
    if name == "fcfs":
        return None
    if name in ("lpt", "spt"):
        return LengthOrdered(name, given)
    if name == "past_future":
        return PastFutureAdmission(PastFutureAdmission.Args(kv_budget_tokens=kv_budget))
    if name == "learned":
        return LearnedAdmission(args.policy, given, slots=args.slots)
    raise ValueError(name)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--policy", type=Path, default=POLICY, help="a policy file or an admission_ppo run directory"
    )
    ap.add_argument(
        "--export", type=Path, default=None, help="save this run's policy as bench/policies/..., exit"
    )
    ap.add_argument("--workload", choices=("longtail", "multiturn"), default="longtail")
    ap.add_argument("--workloads", type=int, default=16)
    ap.add_argument(
        "--episodes", type=int, default=24, help="multiturn: episodes per workload (2-4 turns each)"
    )
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--sigma", type=float, default=0.5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--kv-frac", type=float, default=0.8, help="Past-Future's budget, of FCFS's peak KV tokens"
    )
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    if args.export is not None:
        policy, info = load_entity_policy(args.export)
        save_entity_policy(POLICY, policy, {"recipe": "examples/admission_ppo.yaml", **info})
        print(f"saved {POLICY} ({POLICY.stat().st_size / 1024:.0f} KiB) from {args.export}")
        return
    policy, info = load_entity_policy(args.policy)
    print(f"policy: {info}")
    tok = build_char_tokenizer()
    model = build_tiny_model(tok).eval()
    vocab = len(tok)
    multi = args.workload == "multiturn"
    workload = (
        MultiTurnJobs(args.episodes, sigma=args.sigma) if multi else LongtailJobs(args.requests, args.sigma)
    )

    def engine(admission=None) -> HFEngine:
        return HFEngine(model, tok, EngineConfig(max_concurrency=args.slots), admission=admission)

    # ---- calibration: the step cost of this machine's engine ---------------------------------------
    calib = [
        LongtailJobs(args.requests, args.sigma)(np.random.default_rng(HELD_OUT_SEED - 1 - k))
        for k in range(8)
    ]
    reqs = [r for k, jobs in enumerate(calib) for r in requests_of(jobs, vocab, HELD_OUT_SEED - 1 - k)[0]]
    measure_steps(engine(), reqs[: args.requests])  # warm-up
    records = measure_steps(engine(), reqs)
    cost = StepCost.fit(records)
    secs = np.array([t for _, t in records])
    fitted = np.array([cost.seconds(s) for s, _ in records])
    r2 = 1 - ((secs - fitted) ** 2).sum() / ((secs - secs.mean()) ** 2).sum()
    print(f"step cost fit over {len(records)} engine steps: {cost} (R^2 {r2:.2f})")

    names = [*HEURISTICS, "learned"]
    model_s: dict[str, list[float]] = {n: [] for n in [*names, "lpt_oracle", "bound"]}
    engine_s: dict[str, list[float]] = {n: [] for n in [*names, "learned_net"]}
    engine_steps: dict[str, list[int]] = {n: [] for n in names}
    kv_peak: dict[str, list[int]] = {n: [] for n in names}
    start = time.perf_counter()
    for w in range(args.workloads):
        seed = HELD_OUT_SEED + w
        jobs = workload(np.random.default_rng(seed))
        for n in ("fcfs", "lpt", "spt"):
            model_s[n].append(simulate_policy(jobs, args.slots, cost, n))
        model_s["past_future"].append(model_s["fcfs"][-1])  # filled in below from the engine's gate
        model_s["learned"].append(simulate_policy(jobs, args.slots, cost, policy))
        model_s["lpt_oracle"].append(simulate_policy(oracle_jobs(jobs), args.slots, cost, "lpt"))
        model_s["bound"].append(float("nan") if multi else bound_seconds(jobs, args.slots, cost))
        reqs, pred = requests_of(jobs, vocab, seed)
        # FCFS's peak KV tokens sets Past-Future's budget
        fcfs_records = run_workload(engine(), jobs, reqs, multi)[1]
        budget = int(args.kv_frac * max(s.context_tokens for s, _ in fcfs_records))
        runs: dict[str, list[float]] = {n: [] for n in names}
        choosing: list[list[float]] = [[] for _ in range(args.repeats)]
        for rep in range(args.repeats):
            for n in names[rep % len(names) :] + names[: rep % len(names)]:
                admission = engine_admission(n, pred, args, budget)
                makespan, records = run_workload(engine(admission), jobs, reqs, multi)
                runs[n].append(makespan)
                if n == "learned":
                    choosing[rep].append(admission.seconds)
                if rep == 0:
                    engine_steps[n].append(len(records))
                    kv_peak[n].append(max(s.context_tokens for s, _ in records))
                    if n == "past_future":  # the cost model, priced on the steps the gate produced
                        # (multi-turn: not comparable, the steps leave out the engine's idle waits)
                        model_s[n][-1] = float("nan") if multi else sum(cost.seconds(s) for s, _ in records)
        for n in names:
            engine_s[n].append(statistics.median(runs[n]))
        # the learned policy's steps without its own decision time (what a policy off the critical path costs)
        net = [t - c[0] for t, c in zip(runs["learned"], choosing, strict=True)]
        engine_s["learned_net"].append(statistics.median(net))
        print(
            f"workload {w}: engine s "
            + ", ".join(f"{n} {engine_s[n][-1]:.3f}" for n in names)
            + f"  ({time.perf_counter() - start:.0f} s)"
        )

    def speedup(table: dict[str, list[float]], n: str) -> float:
        return statistics.fmean(f / x for f, x in zip(table["fcfs"], table[n], strict=True))

    def mean(table, n) -> float:
        return statistics.fmean(table[n])

    size = f"{args.episodes} multi-turn episodes" if multi else f"{args.requests} requests"
    print(f"\n{args.workloads} held-out workloads, {size}, {args.slots} places, sigma {args.sigma}")
    print(f"{'policy':<14}{'model speedup':>15}{'engine speedup':>16}{'engine steps':>14}{'peak KV':>9}")
    for n in names:
        print(
            f"{n:<14}{speedup(model_s, n):>15.3f}{speedup(engine_s, n):>16.3f}"
            f"{statistics.fmean(engine_steps[n]):>14.1f}{statistics.fmean(kv_peak[n]):>9.0f}"
        )
    for n in ("lpt_oracle",) if multi else ("lpt_oracle", "bound"):
        print(f"{n:<14}{speedup(model_s, n):>15.3f}")
    print(
        f"{'learned_net':<14}{'':>15}{speedup(engine_s, 'learned_net'):>16.3f}   (its decision time taken out)"
    )
    best_model = min(
        [h for h in HEURISTICS if not (multi and h == "past_future")], key=lambda n: mean(model_s, n)
    )
    best_engine = min(HEURISTICS, key=lambda n: mean(engine_s, n))
    err = {
        n: statistics.fmean(abs(m - e) / e for m, e in zip(model_s[n], engine_s[n], strict=True))
        for n in names
    }
    summary = {
        "learned_vs_best_heuristic_model": round(mean(model_s, best_model) / mean(model_s, "learned"), 4),
        "learned_vs_best_heuristic_engine": round(mean(engine_s, best_engine) / mean(engine_s, "learned"), 4),
        "learned_net_vs_best_heuristic_engine": round(
            mean(engine_s, best_engine) / mean(engine_s, "learned_net"), 4
        ),
        "best_heuristic_model": best_model,
        "best_heuristic_engine": best_engine,
        "speedup_over_fcfs_model": {
            n: num(speedup(model_s, n)) for n in [*names, "lpt_oracle", *(() if multi else ("bound",))]
        },
        "speedup_over_fcfs_engine": {n: round(speedup(engine_s, n), 4) for n in [*names, "learned_net"]},
        "model_rel_error": {n: num(v) for n, v in err.items()},
        "step_cost": {**cost.__dict__, "r2": round(float(r2), 3)},
        "workloads": args.workloads,
        "workload": args.workload,
        "policy": str(args.policy),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
