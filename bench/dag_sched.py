"""A PPO policy for heterogeneous DAG scheduling against HEFT and a random list scheduler.

Held-out random task graphs (the HEFT paper's generator, seeds disjoint from any training reset) of
several sizes, 3 unrelated processors. Per graph: HEFT's makespan; the policy's, greedy and as the
best of the greedy one and `--samples` sampled schedules; and a random list scheduler's (the mean of 8). Reported per
size and overall: the mean makespan ratio against HEFT (< 1: shorter schedules than HEFT).

    python bench/dag_sched.py --run runs/dag-...          # the latest checkpoint of a dag_ppo run
    python bench/dag_sched.py                              # the committed bench/policies/dag_attention.pt
    python bench/dag_sched.py --export runs/dag-...        # write that file from a run

The last line printed is one JSON object with `policy_vs_heft_makespan` (greedy, mean over graphs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from schedrl.classic.attention import load_entity_policy, save_entity_policy
from schedrl.envs.scheduling.dag import check_schedule, heft, random_dag, random_list
from schedrl.envs.scheduling.dag_env import DAGSchedEnv, FixedDAG

POLICY = Path(__file__).parent / "policies" / "dag_attention.pt"
HELD_OUT_SEED = 7_000_000


def run_policy(policy, inst, samples: int, seed: int, max_ready: int) -> float:
    """The best makespan over `samples` runs (greedy when 1), the runs batched into one forward per step."""
    envs = [DAGSchedEnv(FixedDAG(inst), inst.num_procs, max_ready) for _ in range(samples)]
    obs, masks = zip(*(e.reset(seed=seed + k) for k, e in enumerate(envs)), strict=True)
    obs, masks = list(obs), [m["action_mask"] for m in masks]
    live = list(range(samples))
    torch.manual_seed(seed)
    while live:
        o = torch.from_numpy(np.stack([obs[k] for k in live]))
        m = torch.from_numpy(np.stack([masks[k] for k in live]))
        actions = policy.act(o, m, deterministic=samples == 1)[0].tolist()
        still = []
        for k, a in zip(live, actions, strict=True):
            obs[k], _, done, _, info = envs[k].step(a)
            masks[k] = info["action_mask"]
            if not done:
                still.append(k)
        live = still
    for e in envs:
        check_schedule(inst, e.schedule)
    return min(e.span for e in envs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", type=Path, default=None, help="a dag_ppo run directory (its latest checkpoint)")
    ap.add_argument("--policy", type=Path, default=POLICY)
    ap.add_argument("--export", type=Path, default=None, help="save this run's policy as --policy, then exit")
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 20, 30, 50])
    ap.add_argument("--graphs", type=int, default=50, help="held-out graphs per size")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--procs", type=int, default=3)
    ap.add_argument("--max-ready", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.export is not None:
        policy, info = load_entity_policy(args.export)
        save_entity_policy(args.policy, policy, {"recipe": "examples/dag_ppo.yaml", **info})
        print(f"saved {args.policy} ({args.policy.stat().st_size / 1024:.0f} KiB) from {args.export}")
        return
    policy, info = load_entity_policy(args.run if args.run is not None else args.policy)
    print(f"policy: {info}")
    rows: dict[int, dict[str, list[float]]] = {}
    start = time.perf_counter()
    for n in args.sizes:
        r = rows[n] = {"greedy": [], "sampled": [], "random": []}
        for g in range(args.graphs):
            rng = np.random.default_rng(HELD_OUT_SEED + 1000 * n + g)
            inst = random_dag(rng, n, args.procs)
            h = heft(inst)
            check_schedule(inst, h)
            greedy = run_policy(policy, inst, 1, g, args.max_ready)
            r["greedy"].append(greedy / h.makespan)
            # the best of the greedy schedule and `samples` sampled ones
            r["sampled"].append(
                min(greedy, run_policy(policy, inst, args.samples, g, args.max_ready)) / h.makespan
            )
            r["random"].append(
                statistics.mean(random_list(inst, rng).makespan for _ in range(8)) / h.makespan
            )
        print(
            f"{n:3d} tasks  policy/HEFT greedy {statistics.mean(r['greedy']):.3f}  best of {args.samples} "
            f"{statistics.mean(r['sampled']):.3f}  random/HEFT {statistics.mean(r['random']):.3f}  "
            f"policy <= HEFT on {sum(x <= 1 + 1e-9 for x in r['greedy'])}/{args.graphs}",
            flush=True,
        )
    every = {k: [x for r in rows.values() for x in r[k]] for k in ("greedy", "sampled", "random")}
    result = {
        "sizes": args.sizes,
        "graphs_per_size": args.graphs,
        "per_size": {n: {k: round(statistics.mean(v), 4) for k, v in r.items()} for n, r in rows.items()},
        "policy_vs_heft_makespan": round(statistics.mean(every["greedy"]), 4),
        "policy_sampled_vs_heft_makespan": round(statistics.mean(every["sampled"]), 4),
        "random_vs_heft_makespan": round(statistics.mean(every["random"]), 4),
        "seconds": round(time.perf_counter() - start, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
