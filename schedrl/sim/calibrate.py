"""Calibration from real runs: a scenario whose costs are fit to one run directory's metrics and timeline.

From the run's `config.yaml`: the workload (prompts per step, group size, the response cap), the
engine's concurrency and the schedule. From `metrics.jsonl`, per RL step after the first two (the
warm-up): the generated tokens G, the longest response L, the generation and training seconds.

- Engine (from a synchronous run, where `gen_s` is one step's generation): every request of a step
  fits in the running batch, so generation takes L decode steps over G rows in all; the built-in
  engine pads each decode step's attention to the longest running request, which in a step whose
  requests all start together attends K = sum over samples of l (l - 1) / 2 + 2 l keys (l its
  length; the simulated prompt is one token), from the logged `len_sq_mean`. `gen_s = base x L +
  per_row x G + padded x K` is fit by non-negative least squares; the scenario's engine is
  `overhead_s = base`, `compute_token_s = per_row`, `padded_key_s = padded`, `combine: sum` (a CPU
  overlaps nothing). The padded term is what carries the cost over to schedules that keep the batch
  full of requests of every age (partial rollouts: each step attends as far as its oldest request).
  A run that predates `len_sq_mean` gets the first two terms.
- Learner: `train_s = fixed + (G + N) / tokens_per_s` by the same fit, on one device (N samples of
  one prompt token each: prompt costs sit in the fitted terms).
- Interference (optional, from an asynchronous run on the same host): its engine's busy seconds per
  generated token and its learner's per trained token, over the synchronous run's; workers that share
  cores run that much slower (`cluster.engine_interference`, `cluster.learner_interference`).
- Lengths: the per-step quantiles the run logs (p10, p50, p90, max) averaged, joined into a
  400-point sketch whose segments curve so that its mean is the logged mean, with the longest
  response placed where a simulated step draws it as long as the run's did; drawn through a
  Gaussian copula with the run's `len_group_icc` (or, without it, once per group, each sample that
  draw x exp(N(0, 0.3))).
- Weight sync: the mean `weight-sync` span of the timeline (0 where there is none).

A run that lacks what a fit needs is an error naming the run and the missing file or key.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from schedrl.config import migrate_saved
from schedrl.sim.lengths import LengthDist
from schedrl.timeline import TIMELINE_FILE, read_spans
from schedrl.training.run_dir import read_metrics

WARMUP_ROWS = 2
NEEDED = (
    "gen_tokens",
    "gen_s",
    "train_s",
    "step_s",
    "len_p10",
    "len_p50",
    "len_p90",
    "len_max",
    "completion_len_mean",
)


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    keep = np.ones(x.shape[1], dtype=bool)
    coef = np.zeros(x.shape[1])
    for _ in range(x.shape[1]):
        coef = np.zeros(x.shape[1])
        coef[keep] = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
        if (coef >= 0).all():
            break
        keep &= coef > 0
    return np.maximum(coef, 0.0)


def read_run(
    run_dir: str | Path, needed: tuple[str, ...] = NEEDED, warmup: int = WARMUP_ROWS
) -> tuple[dict, list[dict], list]:
    """(config, training rows after `warmup`, timeline spans) of a run; errors name what is missing."""
    root = Path(run_dir)
    for name in ("config.yaml", "metrics.jsonl", TIMELINE_FILE):
        if not (root / name).is_file():
            raise ValueError(f"run {str(root)!r} has no {name}: calibration needs a schedrl run directory")
    cfg = yaml.safe_load((root / "config.yaml").read_text())
    if isinstance(cfg, dict) and "task" in cfg:
        cfg = migrate_saved(cfg)  # a run saved before the schedule had a section of its own
    if "task" not in cfg or "pipeline" not in cfg:
        raise ValueError(f"run {str(root)!r}: config.yaml is not a language-model run's (no task/pipeline)")
    rows = [r for r in read_metrics(root / "metrics.jsonl") if "gen_tokens" in r]
    if len(rows) <= WARMUP_ROWS + 2:
        raise ValueError(
            f"run {str(root)!r}: {len(rows)} training steps in metrics.jsonl; calibration needs 5 or more"
        )
    missing = [k for k in needed if k not in rows[-1]]
    if missing:
        raise ValueError(f"run {str(root)!r}: metrics.jsonl lacks {', '.join(missing)}")
    return cfg, rows[warmup:], read_spans(root / TIMELINE_FILE)


def schedule_of(cfg: dict) -> tuple[dict, dict]:
    """(schedule section, cluster section) of a run's pipeline config."""
    p, sch = cfg["pipeline"], cfg.get("schedule", {})
    if p["mode"] == "sync":
        return {}, {"gpus": 1, "placement": "colocated"}
    k = sch.get("max_staleness", 0)
    if k == "auto":
        k = sch.get("staleness_args", {}).get("k_max", 4)
    schedule = {"max_staleness": int(k)}
    fields = ("consumption", "consumption_args", "weight_sync", "stale", "divide_groups", "migrate")
    schedule |= {f: sch[f] for f in fields if f in sch}
    engines = int(p["num_engines"])
    return schedule, {"gpus": engines + 1, "placement": "disaggregated", "rollout_gpus": engines}


def length_model(rows: list[dict], cap: int, groups: int = 1, group_size: int = 1) -> dict:
    """The run's lengths: its logged quantiles' sketch, correlated within a group as the run's own
    `len_group_icc` says (a copula with rho = sqrt(icc)); a run without it: a group draw x
    exp(N(0, 0.3)), an assumed spread. The sketch's tail is fit so that a step of `groups` x
    `group_size` samples drawn from it has the run's mean longest response (`tail_knot`)."""
    icc = [r["len_group_icc"] for r in rows if "len_group_icc" in r]
    if icc:
        rho = math.sqrt(min(1.0, max(0.0, statistics.fmean(icc))))
        spread: dict[str, Any] = {"rho": round(rho, 4)}
    else:
        spread = {"per_group": True, "sigma": 0.3}
    u = tail_knot(
        rows, lambda v: LengthDist("empirical", values=tuple(v), cap=cap, **spread), groups, group_size
    )
    return {"kind": "empirical", "values": length_sketch(rows, top_u=u), **spread, "cap": cap}


def tail_knot(rows: list[dict], dist, groups: int, group_size: int, steps: int = 200) -> float:
    """Where the sketch puts the run's mean longest response (`len_max`), in (0.9, 1]. At 1 the
    longest response is the sketch's largest value, which a step of correlated samples rarely draws
    (on `longtail` its simulated longest came out 29 tokens against the logged 39); lower, the
    sketch rises on from there to the longest response any step logged. Bisection on the mean
    longest response of `steps` simulated steps (one seed, so the fit is deterministic)."""
    target = statistics.fmean(r["len_max"] for r in rows)

    def longest(u: float) -> float:
        x = dist(length_sketch(rows, top_u=u)).sample(np.random.default_rng(0), steps * groups, group_size)
        return float(x.reshape(steps, -1).max(axis=1).mean())

    if longest(1.0) >= target:
        return 1.0
    lo, hi = 0.9, 1.0  # a lower knot: more of the sketch above it, a longer longest response
    for _ in range(24):
        mid = (lo + hi) / 2
        if longest(mid) < target:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


def length_sketch(rows: list[dict], points: int = 400, top_u: float = 1.0) -> list[int]:
    """A `points`-value sketch through the logged quantiles (1 at 0, p10, p50, p90, the mean longest
    response at `top_u` and, below 1, the longest any step logged at 1), each segment curved as
    t ** gamma with one gamma, found by bisection, that gives the logged mean."""
    q = [statistics.fmean(r[k] for r in rows) for k in ("len_p10", "len_p50", "len_p90", "len_max")]
    mean = statistics.fmean(r["completion_len_mean"] for r in rows)
    knots = [(0.0, 1.0), (0.1, q[0]), (0.5, q[1]), (0.9, q[2]), (top_u, q[3])]
    if top_u < 1.0:
        knots.append((1.0, max(r["len_max"] for r in rows)))
    knots_u = np.array([k[0] for k in knots])
    knots_x = np.maximum.accumulate(np.array([k[1] for k in knots], dtype=float))
    u = (np.arange(points) + 0.5) / points
    seg = np.clip(np.searchsorted(knots_u, u, side="right") - 1, 0, len(knots_u) - 2)
    t = (u - knots_u[seg]) / (knots_u[seg + 1] - knots_u[seg])
    lo, hi = knots_x[seg], knots_x[seg + 1]

    def sketch(gamma: float) -> np.ndarray:
        return lo + (hi - lo) * t**gamma

    a, b = -6.0, 6.0  # log gamma: a larger gamma keeps each segment near its lower quantile longer
    for _ in range(60):
        mid = (a + b) / 2
        if sketch(float(np.exp(mid))).mean() > mean:
            a = mid
        else:
            b = mid
    return [max(1, int(round(x))) for x in sketch(float(np.exp((a + b) / 2)))]


def padded_keys(row: dict) -> float:
    """Keys a synchronous step's decode steps attend, padded to the longest running request: at decode
    step t every request still running attends t + 2 keys (a one-token prompt, t tokens, its new one),
    so a sample of length l contributes l (l - 1) / 2 + 2 l; summed from the step's mean length and
    mean squared length."""
    mean = row["completion_len_mean"]
    n = row["gen_tokens"] / mean if mean > 0 else 0.0
    return n * (row["len_sq_mean"] - mean) / 2.0 + 2.0 * row["gen_tokens"]


def calibrate(run_dir: str | Path, steps: int = 30) -> dict[str, Any]:
    """A scenario mapping with the costs of `run_dir` (a synchronous run) and that run's schedule."""
    cfg, rows, spans = read_run(run_dir)
    if cfg["pipeline"]["mode"] != "sync":
        raise ValueError(
            f"run {str(run_dir)!r} is asynchronous: the engine's cost is fit from a synchronous run, where "
            "gen_s is one step's generation alone"
        )
    s, e = cfg["sampling"], cfg["engine"]
    n = s["prompts_per_step"] * s["group_size"]
    if n > e["max_concurrency"]:
        raise ValueError(
            f"run {str(run_dir)!r}: {n} requests a step exceed engine.max_concurrency ({e['max_concurrency']}); "
            "the engine fit assumes one step's requests all run at once"
        )
    g = np.array([r["gen_tokens"] for r in rows], dtype=float)
    lmax = np.array([r["len_max"] for r in rows], dtype=float)
    terms = [lmax, g]
    if all("len_sq_mean" in r for r in rows):
        terms.append(np.array([padded_keys(r) for r in rows]))
    base, per_row, *padded = _nonneg_lstsq(np.stack(terms, 1), np.array([r["gen_s"] for r in rows]))
    trained = g + n  # the scenario's samples carry one prompt token each
    fixed, per_token = _nonneg_lstsq(
        np.stack([np.ones_like(g), trained], 1), np.array([r["train_s"] for r in rows])
    )
    syncs = [sp.duration for sp in spans if sp.kind == "weight-sync"]
    schedule, cluster = schedule_of(cfg)
    return {
        "name": Path(run_dir).name,
        "source": f"calibrated on {run_dir}",
        "steps": steps,
        "warmup_steps": 2,
        "seed": int(cfg.get("seed", 0)),
        "workload": {
            "prompts_per_step": s["prompts_per_step"],
            "group_size": s["group_size"],
            "prompt_tokens": 1,  # prompt costs are inside the fitted per-step and fixed terms
            "lengths": length_model(rows, s["max_new_tokens"], s["prompts_per_step"], s["group_size"]),
            "predictor_sigma": 0.0,
        },
        "cluster": {**cluster, "memory_gb": 1000.0},
        "engine": {
            "overhead_s": float(base),
            "compute_token_s": float(per_row),
            "weights_s": 0.0,
            "kv_token_s": 0.0,
            "prefill_token_s": 0.0,
            "padded_key_s": float(padded[0]) if padded else 0.0,
            "max_batch": e["max_concurrency"],
            "combine": "sum",
        },
        "learner": {
            "tokens_per_s_per_gpu": float(1.0 / per_token) if per_token > 0 else 1e12,
            "fixed_s": float(fixed),
        },
        "sync": {"seconds": statistics.fmean(syncs) if syncs else 0.0},
        "schedule": schedule,
        "measured": {"step_s": statistics.fmean(r["step_s"] for r in rows)},
    }


def variant_of(run_dir: str | Path) -> dict[str, Any]:
    """The schedule and measured step time of another run, as a variant of a calibrated scenario."""
    cfg, rows, _ = read_run(run_dir, needed=("step_s",))
    schedule, cluster = schedule_of(cfg)
    sets = {f"schedule.{k}": v for k, v in schedule.items()}
    sets.update({f"cluster.{k}": v for k, v in cluster.items()})
    if cluster["placement"] == "colocated":
        sets["cluster.rollout_gpus"] = 0
    return {"set": sets, "measured": {"step_s": statistics.fmean(r["step_s"] for r in rows)}}


def interference(sync_run: str | Path, async_run: str | Path) -> tuple[float, float]:
    """(engine, learner) slowdown of `async_run`'s workers against `sync_run`'s, per token."""
    _, sync_rows, _ = read_run(sync_run)
    cfg, rows, spans = read_run(async_run, needed=("gen_tokens", "train_s"), warmup=0)
    if cfg["pipeline"]["mode"] == "sync":
        raise ValueError(
            f"run {str(async_run)!r} is synchronous: interference is measured on an asynchronous run"
        )
    busy = sum(
        sp.duration for sp in spans if sp.worker.startswith("engine") and sp.kind in ("decode", "prefill")
    )
    if busy <= 0:
        raise ValueError(f"run {str(async_run)!r}: its timeline has no engine decode or prefill spans")
    # the async timeline covers every step, so its engine is compared per token over every row
    engine_async = busy / sum(r["gen_tokens"] for r in rows)
    engine_sync = sum(r["gen_s"] for r in sync_rows) / sum(r["gen_tokens"] for r in sync_rows)
    warm = rows[WARMUP_ROWS:]
    learner_async = sum(r["train_s"] for r in warm) / sum(r["gen_tokens"] for r in warm)
    learner_sync = sum(r["train_s"] for r in sync_rows) / sum(r["gen_tokens"] for r in sync_rows)
    return engine_async / engine_sync, learner_async / learner_sync
