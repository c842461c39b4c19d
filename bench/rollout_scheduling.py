"""Request scheduling inside the rollout on the `longtail` mix: every policy against FCFS.

The policy is the tiny model after a supervised warm-up on the mix, so output lengths follow
the tasks (1-3 tokens for additions, 16-60 for long sorts/reversals, a few runaways to the
96-token cap). Each step rolls out `--prompts` tasks x `--group` samples. Epoch 0 runs the
steps once with FCFS: its samples are the history of the history predictor and the ranker,
the drafts of speculative reuse and the training data of the pruning head. The policy then
moves (`--update-steps` supervised steps at `--update-lr`, a stand-in for an epoch of RL
updates; the drift is reported as the mean per-token TV between the two policies on epoch 0's
samples). Epoch 1 rolls the same tasks out again with new seeds, every system on the same
requests, rotating which system goes first:

  fcfs             the engine's FCFS admission (what every peer does)
  lpt_sibling      longest-predicted-first, sibling (Seer) prediction with one probe per group
  lpt_history      longest-predicted-first, per-task mean length from epoch 0
  lpt_ranker       longest-predicted-first, the learned ranker (trained on epoch 0, then online)
  spt_sibling      shortest-predicted-first, sibling prediction
  lpt_oracle       longest-first by the true lengths (a reference ceiling, not a predictor)
  past_future      memory-aware FCFS at a KV budget of --kv-frac x FCFS's peak KV tokens
  spec             speculative reuse: epoch 0's samples as drafts, verified against the new policy
  prune            online pruning of each group of --group to --keep samples (50/50 mix), FCFS
  whole2/divided2  two engines of half the concurrency: whole groups round-robin vs chunks of 2
                   samples balanced by predicted load (makespan = the slower engine)

All systems but spec and prune generate the same tokens (same seeds; admission order does not
change a request's tokens). Makespan is reported in wall seconds and in engine forward steps.

    python bench/rollout_scheduling.py     # ~8 min on 2 cores; 1 torch thread pinned to one core

The last line printed is one JSON object with `lpt_vs_fcfs`, `spec_reuse_speedup` and `kendall_tau`.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time

import torch

from schedrl.config import SFTConfig
from schedrl.engine import EngineConfig, HFEngine
from schedrl.envs import make_task
from schedrl.models import PRESETS, build_char_tokenizer, build_tiny_model, default_device, preset
from schedrl.models.loading import move_to
from schedrl.rollout import (
    DraftStore,
    HistoryPredictor,
    LengthOrdered,
    LengthPredictor,
    PastFutureAdmission,
    PruneConfig,
    RankerPredictor,
    SiblingPredictor,
    SpecStats,
    SuccessHead,
    divide,
    group_requests,
    kendall_tau,
    pruned_rollout,
    verify_drafts,
    whole_groups,
)
from schedrl.rollout.speculative import _draft_logits, _sampling_probs
from schedrl.seeding import derive_seed
from schedrl.training.sft import sft_warmup
from schedrl.types import Request, Sample, SamplingParams


class OracleLengths(LengthPredictor):
    """The true output length of each request (from an untimed FCFS pass with the same seeds): the
    ceiling of any length predictor, as a reference for LPT. Not a deployable predictor."""

    name = "oracle"

    def __init__(self) -> None:
        super().__init__()
        self.lengths: dict[str, int] = {}

    def predict(self, request: Request) -> float:
        return float(self.lengths[request.id])


def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


def run_plain(engine, reqs, on_step=None) -> dict:
    steps, t0 = engine.num_steps, time.perf_counter()
    out = engine.generate(reqs, on_step)
    secs = time.perf_counter() - t0
    lat = [s.timings.finished - s.timings.arrival for s in out]
    return {"samples": out, "secs": secs, "lat": lat, "steps": engine.num_steps - steps}


def run_spec(engine, model, draft_model, store, reqs, seed) -> dict:
    """Verify every request's draft (one forward of the current policy), then let the engine continue the rest."""
    steps, t0 = engine.num_steps, time.perf_counter()
    items, stats = verify_drafts(
        model,
        reqs,
        [store.get(r) for r in reqs],
        eos_ids=engine.eos_ids,
        tokenizer=engine.tokenizer,
        draft_model=draft_model,
        version=1,
        seed=seed,
    )
    t_verify = time.perf_counter() - t0
    done = {s.request_id: s for s in engine.generate([x for x in items if isinstance(x, Request)])}
    out = [x if isinstance(x, Sample) else done[x.id] for x in items]
    lat = [t_verify if isinstance(x, Sample) else done[x.id].timings.finished - t0 for x in items]
    return {
        "samples": out,
        "secs": time.perf_counter() - t0,
        "lat": lat,
        "steps": engine.num_steps - steps,
        "spec": stats,
        "verify_s": t_verify,
    }


def run_prune(engine, reqs, head, reward, cfg) -> dict:
    steps, t0 = engine.num_steps, time.perf_counter()
    out = pruned_rollout(engine, reqs, head, reward, cfg)
    lat = [s.timings.finished - s.timings.arrival for s in out if s.finish_reason != "pruned"]
    return {"samples": out, "secs": time.perf_counter() - t0, "lat": lat, "steps": engine.num_steps - steps}


def run_two(engines, parts) -> dict:
    """Two engines, run one after the other here; as separate workers the step ends with the slower."""
    runs = [run_plain(e, p) for e, p in zip(engines, parts, strict=True)]
    return {
        "samples": [s for r in runs for s in r["samples"]],
        "secs": max(r["secs"] for r in runs),
        "lat": [x for r in runs for x in r["lat"]],
        "steps": max(r["steps"] for r in runs),
    }


def policy_drift(v0, v1, samples) -> float:
    """Mean per-token TV(p_v0, p_v1) at the samples' positions (temperature 1): 1 - the ideal acceptance."""
    prompts, drafts = [s.prompt_ids for s in samples], [s.token_ids for s in samples]
    a, b = _draft_logits(v0, prompts, drafts), _draft_logits(v1, prompts, drafts)
    tv = [0.5 * (x.softmax(-1) - y.softmax(-1)).abs().sum(-1) for x, y in zip(a, b, strict=True)]
    return float(torch.cat(tv).mean())


def distribution_check(v0, v1, tok, prompt_text, n=2000) -> dict:
    """Spec reuse of v0 drafts under v1 on one prompt: TV of the first two tokens vs v1's exact marginals,
    against 1.5x the TV that n exact draws show by chance (plus 0.005)."""
    prompt = tuple(tok(prompt_text).input_ids)
    params = SamplingParams(max_new_tokens=2, temperature=1.0, ignore_eos=True)
    with_seed = lambda i: SamplingParams(**{**vars(params), "seed": i})  # noqa: E731
    drafts = HFEngine(v0, tok, EngineConfig(max_concurrency=256)).generate(
        [Request(f"d{i}", prompt, with_seed(i)) for i in range(n)]
    )
    engine = HFEngine(v1, tok, EngineConfig(max_concurrency=256))
    reqs = [Request(f"c{i}", prompt, with_seed(10**6 + i)) for i in range(n)]
    items, stats = verify_drafts(
        v1, reqs, drafts, eos_ids=engine.eos_ids, tokenizer=tok, draft_model=v0, seed=1
    )
    done = {s.request_id: s for s in engine.generate([x for x in items if isinstance(x, Request)])}
    tokens = torch.tensor([(x if isinstance(x, Sample) else done[x.id]).token_ids for x in items])
    vocab = v1.config.vocab_size
    with torch.no_grad():
        p1 = _sampling_probs(v1(torch.tensor([prompt])).logits[0, -1:].float(), params)[0]
        p2 = p1 @ _sampling_probs(
            v1(torch.tensor([[*prompt, t] for t in range(vocab)])).logits[:, -1].float(), params
        )
    out, ok = {"prompt": prompt_text, "draws": n, "acceptance_rate": round(stats.acceptance_rate, 3)}, True
    for pos, p in ((0, p1), (1, p2)):
        tv = 0.5 * (torch.bincount(tokens[:, pos], minlength=vocab) / n - p).abs().sum().item()
        bound = 1.5 * float(0.5 * (2 * p * (1 - p) / (torch.pi * n)).sqrt().sum()) + 0.005
        out[f"tv_token{pos + 1}"], out[f"bound_token{pos + 1}"] = round(tv, 4), round(bound, 4)
        ok &= tv < bound
    out["passed"] = bool(ok)
    return out


def group_stats(samples) -> tuple[float, float, int]:
    """Mean reward of the training samples and the share of groups with mixed outcomes (non-zero advantage)."""
    groups: dict[str, list[float]] = {}
    for s in samples:
        if s.finish_reason != "pruned":
            groups.setdefault(s.group_id, []).append(s.reward)
    rewards = [r for g in groups.values() for r in g]
    mixed = sum(len({r > 0.5 for r in g}) == 2 for g in groups.values()) / len(groups)
    return round(statistics.mean(rewards), 4), round(mixed, 3), len(rewards)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=32, help="tasks per step")
    ap.add_argument("--group", type=int, default=8, help="samples per task")
    ap.add_argument("--steps", type=int, default=6, help="steps per epoch (distinct task draws)")
    ap.add_argument("--rounds", type=int, default=3, help="passes over the epoch-1 steps")
    ap.add_argument("--concurrency", type=int, default=32, help="engine slots")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--sft-steps", type=int, default=150)
    ap.add_argument("--update-steps", type=int, default=4, help="supervised steps between the epochs")
    ap.add_argument("--update-lr", type=float, default=2e-5)
    ap.add_argument("--keep", type=int, default=4, help="pruning: samples kept per group")
    ap.add_argument("--kv-frac", type=float, default=0.6, help="past_future budget / FCFS peak KV tokens")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--model",
        choices=tuple(PRESETS),
        default="tiny",
        help="the built-in model's size: tiny (~0.45M parameters), small (~25M) or 0.5b (GPU)",
    )
    ap.add_argument("--device", default="auto", help="auto: CUDA when present, else CPU")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.threads == 1 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})  # one core: no migrations mid-run
    t_start = time.perf_counter()
    tok, source = build_char_tokenizer(), make_task("longtail")
    v0 = build_tiny_model(tok, preset(args.model))
    move_to(v0, default_device() if args.device == "auto" else args.device)
    sft_warmup(v0, tok, source, SFTConfig(steps=args.sft_steps, batch_size=32, lr=1e-3), args.seed)
    v0.eval()
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
    tasks = [
        source.sample("train", args.prompts, derive_seed(args.seed, "bench", k)) for k in range(args.steps)
    ]
    by_id = {t.id: t for ts in tasks for t in ts}
    reward = lambda s: source.reward(by_id[s.task_id], s.text)  # noqa: E731

    def step_reqs(epoch, k):
        return group_requests(tasks[k], tok, params, args.group, seed=args.seed, step=k, tag=f"e{epoch}")

    # ---- epoch 0: FCFS on the old policy -> history, ranker data, drafts, the pruning head's data ----
    meter = LengthOrdered("fcfs")  # FCFS through the policy machinery, which counts the KV tokens held
    e0 = HFEngine(v0, tok, EngineConfig(max_concurrency=args.concurrency), admission=meter)
    fcfs_peak = [0]
    on_step = lambda _: fcfs_peak.__setitem__(0, max(fcfs_peak[0], meter.state.kv_tokens))  # noqa: E731
    flat0 = [s for k in range(args.steps) for s in e0.generate(step_reqs(0, k), on_step)]
    store = DraftStore()
    store.put(flat0)
    head = SuccessHead()
    prune_cfg = PruneConfig(keep=args.keep, success_frac=0.5, check_tokens=4, mode="drop")
    for k in range(args.steps):  # trains the success head (untimed)
        pruned_rollout(
            HFEngine(v0, tok, EngineConfig(max_concurrency=args.concurrency)),
            step_reqs(0, k),
            head,
            reward,
            prune_cfg,
        )
    v1 = copy.deepcopy(v0)
    sft_warmup(
        v1, tok, source, SFTConfig(steps=args.update_steps, batch_size=32, lr=args.update_lr), args.seed + 1
    )
    v1.eval()
    drift = policy_drift(v0, v1, flat0)

    # ---- epoch 1: every system on the same requests --------------------------------------------------
    def engine(admission=None, concurrency=args.concurrency):
        return HFEngine(v1, tok, EngineConfig(max_concurrency=concurrency), admission=admission, version=1)

    def seeded(pred):
        for s in flat0:
            pred.on_finish(s)
        return pred

    ranker = RankerPredictor(RankerPredictor.Args(seed=args.seed))
    ranker.fit([s.prompt_ids for s in flat0], [s.num_tokens for s in flat0])
    ordered = {
        "lpt_sibling": LengthOrdered("lpt", SiblingPredictor()),
        "lpt_history": LengthOrdered("lpt", seeded(HistoryPredictor())),
        "lpt_ranker": LengthOrdered("lpt", ranker),
        "spt_sibling": LengthOrdered("spt", SiblingPredictor()),
        "lpt_oracle": LengthOrdered("lpt", OracleLengths()),
    }
    oracle = ordered["lpt_oracle"].predictor
    truth = engine()
    for k in range(args.steps):  # untimed: the realised lengths of epoch 1 for the oracle
        oracle.lengths.update((s.request_id, s.num_tokens) for s in truth.generate(step_reqs(1, k)))
    memory = PastFutureAdmission(
        PastFutureAdmission.Args(kv_budget_tokens=int(args.kv_frac * fcfs_peak[0]), quantile=0.99)
    )
    for s in flat0:
        memory.history.add(s.num_tokens)
    mem_peak = [0]
    mem_step = lambda _: mem_peak.__setitem__(0, max(mem_peak[0], memory.state.kv_tokens))  # noqa: E731
    split_by = seeded(HistoryPredictor()).predict
    eng = {
        "fcfs": engine(),
        **{k: engine(p) for k, p in ordered.items()},
        "past_future": engine(memory),
        "spec": engine(),
        "prune": engine(),
    }
    halves = {
        name: [engine(concurrency=args.concurrency // 2) for _ in range(2)] for name in ("whole2", "divided2")
    }
    systems = {
        "fcfs": lambda k, r: run_plain(eng["fcfs"], r),
        **{name: (lambda k, r, e=eng[name]: run_plain(e, r)) for name in ordered},
        "past_future": lambda k, r: run_plain(eng["past_future"], r, mem_step),
        "spec": lambda k, r: run_spec(eng["spec"], v1, v0, store, r, derive_seed(args.seed, "spec", k)),
        "prune": lambda k, r: run_prune(eng["prune"], r, head, reward, prune_cfg),
        "whole2": lambda k, r: run_two(halves["whole2"], whole_groups(r, 2)),
        "divided2": lambda k, r: run_two(halves["divided2"], divide(r, 2, split_by, chunk_size=2)),
    }
    rec: dict[str, list[dict]] = {name: [] for name in systems}
    for rnd in range(args.rounds):
        for k in range(args.steps):
            names = list(systems)
            shift = (rnd * args.steps + k) % len(names)
            for name in names[shift:] + names[:shift]:  # rotate which system goes first
                reqs = step_reqs(1, k)
                row = systems[name](k, reqs) | {"step": k, "round": rnd}
                if name in ordered:
                    pred = ordered[name].predicted
                    row["tau"] = kendall_tau(
                        [pred[s.request_id] for s in row["samples"]], [s.num_tokens for s in row["samples"]]
                    )
                for sp in (ordered[name].predictor,) if name in ordered else ():
                    if isinstance(sp, SiblingPredictor):
                        sp.forget([r.group_id for r in reqs])
                rec[name].append(row)
            print(
                f"round {rnd} step {k}: "
                + "  ".join(f"{n} {rec[n][-1]['secs']:.2f}s/{rec[n][-1]['steps']}" for n in systems),
                flush=True,
            )
    dist = distribution_check(v0, v1, tok, tasks[0][0].prompt)
    extra = {
        "drift": drift,
        "kv_budget": memory.budget,
        "fcfs_peak_kv": fcfs_peak[0],
        "mem_peak": mem_peak[0],
        "dist": dist,
        "reward": reward,
        "wall_s": time.perf_counter() - t_start,
    }
    print(json.dumps(summarise(args, rec, extra)))


def summarise(args, rec: dict[str, list[dict]], x: dict) -> dict:
    base = {(r["step"], r["round"]): r for r in rec["fcfs"]}

    def ratio(name, key):
        """Median over (step, round) of FCFS's makespan over the system's, in the same round: time or steps.

        A step the system finished without an engine step (spec reuse accepting every draft) has no ratio;
        None when no step has one."""
        ratios = [base[(r["step"], r["round"])][key] / r[key] for r in rec[name] if r[key] > 0]
        return round(statistics.median(ratios), 3) if ratios else None

    table = {}
    for name, rows in rec.items():
        table[name] = {
            "makespan_s": round(statistics.median(r["secs"] for r in rows), 3),
            "makespan_steps": statistics.median(r["steps"] for r in rows),
            "tok_per_s": round(
                statistics.median(sum(s.num_tokens for s in r["samples"]) / r["secs"] for r in rows)
            ),
            "p99_latency_s": round(statistics.median(p99(r["lat"]) for r in rows), 3),
            "speedup_vs_fcfs_time": ratio(name, "secs"),
            "speedup_vs_fcfs_steps": ratio(name, "steps"),
        }
        if "tau" in rows[0]:
            table[name]["kendall_tau"] = round(statistics.median(r["tau"] for r in rows), 3)
    spec = SpecStats()
    for r in rec["spec"]:
        spec.add(r["spec"])
    reward = x["reward"]
    first = lambda name: [s for r in rec[name] if r["round"] == 0 for s in r["samples"]]  # noqa: E731
    full = [s.with_reward(reward(s)) for s in first("fcfs")]
    pruned = first("prune")
    return {
        "requests_per_step": args.prompts * args.group,
        "prompts": args.prompts,
        "group": args.group,
        "concurrency": args.concurrency,
        "steps": args.steps,
        "rounds": args.rounds,
        "threads": args.threads,
        "lpt_vs_fcfs": table["lpt_sibling"]["speedup_vs_fcfs_time"],
        "lpt_vs_fcfs_steps": table["lpt_sibling"]["speedup_vs_fcfs_steps"],
        "spec_reuse_speedup": table["spec"]["speedup_vs_fcfs_time"],
        "lpt_oracle_vs_fcfs": table["lpt_oracle"]["speedup_vs_fcfs_time"],
        "lpt_oracle_vs_fcfs_steps": table["lpt_oracle"]["speedup_vs_fcfs_steps"],
        "kendall_tau": {
            k.split("_")[1]: table[k]["kendall_tau"] for k in ("lpt_sibling", "lpt_history", "lpt_ranker")
        },
        "systems": table,
        "spec": {
            "acceptance_rate": round(spec.acceptance_rate, 3),
            "accepted_tokens": spec.accepted,
            "draft_tokens": spec.draft_tokens,
            "rejections": spec.rejected,
            "drafts": spec.drafts,
            "finished_in_verification": spec.completed,
            "verify_s_median": round(statistics.median(r["verify_s"] for r in rec["spec"]), 3),
            "time_saved_frac": round(1 - 1 / table["spec"]["speedup_vs_fcfs_time"], 3),
            "policy_drift_token_tv": round(x["drift"], 4),
            "distribution_check": x["dist"],
        },
        "pruning": {
            "keep": args.keep,
            "of": args.group,
            "time_saved_frac": round(1 - 1 / table["prune"]["speedup_vs_fcfs_time"], 3),
            "all": group_stats(full),
            "first_keep_unpruned": group_stats([s for s in full if s.sample_index < args.keep]),
            "pruned": group_stats(pruned),
            "stats_are": "(mean reward, share of mixed groups, samples)",
        },
        "divided_vs_whole_groups": {
            "time": ratio("divided2", "secs") / ratio("whole2", "secs"),
            "steps": ratio("divided2", "steps") / ratio("whole2", "steps"),
        },
        "past_future": {
            "kv_budget_tokens": x["kv_budget"],
            "fcfs_peak_kv_tokens": x["fcfs_peak_kv"],
            "peak_kv_tokens": x["mem_peak"],
            "within_budget": x["mem_peak"] <= x["kv_budget"],
        },
        "wall_s": round(x["wall_s"], 1),
    }


if __name__ == "__main__":
    main()
