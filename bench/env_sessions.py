"""Per-episode environment sessions: a warm pool against a cold start per episode.

Each episode holds an MCP server of its own (`session: episode`): the notes server
(`schedrl.envs.tools.mcp_notes_server`), started inside the sandbox (`sandbox: true`: its own uid, no
network, rlimits) unless `--no-sandbox`. An episode resets its `tools` environment (which takes its
session), makes `--calls` tool calls (write a note, read it back) and closes (which gives the session
back). `--concurrency` episodes run at once, on one event loop, as the episode runner runs them.

- cold: `pool: 0`, every episode starts its server and destroys it at close (isolation the expensive way);
- warm: `pool: --pool`, `recycle: reset`: sessions are kept, and an episode's session is cleared by the
  server's `reset` tool before the next episode takes it.

Each way first runs one untimed batch of `--concurrency` episodes (in a run the pool fills once, then
serves every episode; the cost of that fill is `session_start_s_mean` per session), then times
`--episodes`. The two run side by side, alternating, `--rounds` times in this process; the figures are
medians; the pool's hit rate counts the untimed batch too. The
last line is one JSON object with `cold_s_per_episode`, `warm_s_per_episode`,
`warm_vs_cold_per_episode` (cold time / warm time), the warm pool's `hit_rate`, and the mean cost of a
session's start and of a recycle.

    python bench/env_sessions.py                 # 24 episodes each way, 3 rounds, ~1 min on 2 cores
    python bench/env_sessions.py --no-sandbox --episodes 48 --concurrency 8 --pool 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

from schedrl.envs import make_task
from schedrl.envs.sessions import close_pools, pool_metrics
from schedrl.envs.tool_env import tool_env

NOTES = ["-m", "schedrl.envs.tools.mcp_notes_server"]


def server(pool: int, sandbox: bool) -> dict:
    spec = {"command": sys.executable, "args": NOTES, "session": "episode", "pool": pool}
    if pool:
        spec["recycle"] = "reset"
    if sandbox:
        spec["sandbox"] = True
    return spec


async def run_episodes(spec: dict, episodes: int, concurrency: int, calls: int) -> tuple[float, dict]:
    """Seconds per episode (wall time / episodes) and the pool's metrics."""
    source = make_task("calc", min_digits=2, max_digits=2)
    tasks = source.sample("train", max(episodes, concurrency), seed=0)
    gate = asyncio.Semaphore(concurrency)

    async def episode(i: int) -> None:
        async with gate:
            env = tool_env(source, mcp=[spec])
            await env.reset(tasks[i], i)
            tools = env.tools.tools
            for c in range(calls):
                if c % 2 == 0:
                    await tools["write"].fn(key=f"k{c}", value=str(i))
                else:
                    got = await tools["read"].fn(key=f"k{c - 1}")
                    assert got == str(i), f"episode {i} read {got!r}: another episode's note"
            await env.close()

    # a first batch, untimed for both: in a run the pool fills once and serves thousands of episodes
    await asyncio.gather(*(episode(i) for i in range(concurrency)))
    start = time.perf_counter()
    await asyncio.gather(*(episode(i) for i in range(episodes)))
    elapsed = time.perf_counter() - start
    metrics = pool_metrics()
    await close_pools()
    return elapsed / episodes, metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--pool", type=int, default=4)
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-sandbox", action="store_true")
    args = ap.parse_args()
    sandbox = not args.no_sandbox
    if sandbox:
        from schedrl.sandbox.sandbox import unavailable_reason

        if reason := unavailable_reason():
            sys.exit(f"the sandbox is unavailable ({reason}); run with --no-sandbox")
    cold, warm, warm_metrics = [], [], []
    for r in range(args.rounds):
        for name in ("cold", "warm") if r % 2 == 0 else ("warm", "cold"):
            spec = server(args.pool if name == "warm" else 0, sandbox)
            per, metrics = asyncio.run(run_episodes(spec, args.episodes, args.concurrency, args.calls))
            (warm if name == "warm" else cold).append(per)
            if name == "warm":
                warm_metrics.append(metrics)
            print(
                f"round {r} {name}: {per * 1000:.1f} ms/episode, hit rate "
                f"{metrics['session/hit_rate']:.2f}, start {metrics['session/start_s_mean'] * 1000:.0f} ms",
                flush=True,
            )
    c, w = statistics.median(cold), statistics.median(warm)
    summary = {
        "episodes": args.episodes,
        "concurrency": args.concurrency,
        "pool": args.pool,
        "sandbox": sandbox,
        "cold_s_per_episode": round(c, 4),
        "warm_s_per_episode": round(w, 4),
        "warm_vs_cold_per_episode": round(c / w, 2),
        "hit_rate": round(statistics.median(m["session/hit_rate"] for m in warm_metrics), 3),
        "session_start_s_mean": round(statistics.median(m["session/start_s_mean"] for m in warm_metrics), 4),
        "recycle_s_mean": round(statistics.median(m["session/recycle_s_mean"] for m in warm_metrics), 4),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
