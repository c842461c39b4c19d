"""Sandboxed runs per second, serial and pooled, and the sandbox's overhead over a bare subprocess.

Each run is `print(1)` in a fresh Python (`python3 -I`), so the figures are the cost of the
confinement itself (namespaces, an allow-listed root, a cgroup and a tmpfs made and removed, the
seccomp filter, a session keyring, the uid switch and rlimits) on top of an interpreter start.

`--baseline DIR` measures another checkout's sandbox (an earlier commit, in a git worktree) side by
side: rounds alternate between the two in fresh processes, and `pool_vs_baseline` is the ratio of
the median pooled rates.

MCP: calls per second to `schedrl/envs/tools/mcp_calc_server.py` over one persistent stdio session (how
schedrl calls a server) against a new session per call (start the server, initialize, call, close:
verl's `MCPBaseTool` pattern). Needs `pip install 'schedrl[mcp]'`.

    python bench/sandbox.py                 # 40 runs each way, ~30 s on 2 cores (needs root)
    python bench/sandbox.py --runs 100 --pool 4
    git worktree add /tmp/before HEAD~1 && python bench/sandbox.py --baseline /tmp/before --rounds 3

The last line is one JSON object with `sandbox_runs_per_s` (pooled), `sandbox_runs_per_s_serial`,
`bare_runs_per_s`, `sandbox_overhead_ms`, `mcp_calls_per_s_persistent`, `mcp_calls_per_s_per_call` and
`mcp_persistent_vs_per_call` (with `--baseline`: `baseline_runs_per_s`, `baseline_runs_per_s_serial`,
`pool_vs_baseline`, `serial_vs_baseline`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from schedrl.sandbox import Sandbox, SandboxPool


def timed(fn, runs: int) -> float:
    start = time.perf_counter()
    fn(runs)
    return time.perf_counter() - start


SERVER_ARGS = ["-m", "schedrl.envs.tools.mcp_calc_server"]


async def mcp_rates(persistent_calls: int, per_call_calls: int) -> tuple[float, float]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=sys.executable, args=SERVER_ARGS)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.call_tool("calc", {"expression": "1+1"})  # warm
        start = time.perf_counter()
        for i in range(persistent_calls):
            result = await session.call_tool("calc", {"expression": f"{i}*7"})
            assert result.content[0].text == str(i * 7)
        persistent = persistent_calls / (time.perf_counter() - start)
    start = time.perf_counter()
    for i in range(per_call_calls):
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool("calc", {"expression": f"{i}*7"})
            assert result.content[0].text == str(i * 7)
    per_call = per_call_calls / (time.perf_counter() - start)
    return persistent, per_call


def sandbox_rates(runs: int, pool_size: int) -> dict[str, float]:
    """Serial and pooled runs per second of the sandbox importable here."""
    box = Sandbox(slot=30)

    def serial(n: int) -> None:
        for _ in range(n):
            assert box.run(code="print(1)").stdout == "1\n"

    pool = SandboxPool(size=pool_size)

    def pooled(n: int) -> None:
        with ThreadPoolExecutor(pool_size) as ex:
            assert all(r.stdout == "1\n" for r in ex.map(lambda _: pool.run_sync(code="print(1)"), range(n)))

    serial(3)
    t_serial, t_pool = timed(serial, runs), timed(pooled, runs)
    box.close()
    return {"serial": runs / t_serial, "pool": runs / t_pool, "python": box.python}


def rates_in(tree: Path, runs: int, pool_size: int) -> dict[str, float]:
    """`sandbox_rates` in a fresh process that imports schedrl from `tree`."""
    code = (
        f"import json, sys; sys.path.insert(0, {str(tree)!r}); sys.path.insert(1, {str(Path(__file__).parent)!r})\n"
        "from sandbox import sandbox_rates\n"
        f"print(json.dumps(sandbox_rates({runs}, {pool_size})))"
    )
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--pool", type=int, default=4)
    ap.add_argument("--mcp-calls", type=int, default=200, help="calls over the persistent session")
    ap.add_argument("--mcp-sessions", type=int, default=10, help="calls with a session each")
    ap.add_argument("--baseline", type=Path, help="another checkout whose sandbox to measure side by side")
    ap.add_argument("--rounds", type=int, default=3, help="with --baseline: alternating rounds each")
    args = ap.parse_args()
    here = Path(__file__).resolve().parents[1]
    python = Sandbox(slot=31).python

    def bare(n: int) -> None:
        for _ in range(n):
            subprocess.run([python, "-I", "-c", "print(1)"], capture_output=True, check=True)

    bare(3)  # warm the page cache
    t_bare = timed(bare, args.runs)
    ours, theirs = [], []
    for _ in range(args.rounds if args.baseline else 1):
        ours.append(rates_in(here, args.runs, args.pool))
        if args.baseline:
            theirs.append(rates_in(args.baseline.resolve(), args.runs, args.pool))
    serial = statistics.median(r["serial"] for r in ours)
    pooled = statistics.median(r["pool"] for r in ours)
    rows = [
        ("bare subprocess", args.runs / t_bare),
        ("sandbox, serial", serial),
        (f"sandbox, pool of {args.pool}", pooled),
    ]
    summary = {
        "runs": args.runs,
        "bare_runs_per_s": round(args.runs / t_bare, 2),
        "sandbox_runs_per_s_serial": round(serial, 2),
        "sandbox_runs_per_s": round(pooled, 2),
        "sandbox_overhead_ms": round(1000 * (1 / serial - t_bare / args.runs), 2),
    }
    if args.baseline:
        b_serial = statistics.median(r["serial"] for r in theirs)
        b_pooled = statistics.median(r["pool"] for r in theirs)
        rows += [("baseline, serial", b_serial), (f"baseline, pool of {args.pool}", b_pooled)]
        summary |= {
            "rounds": args.rounds,
            "baseline_runs_per_s_serial": round(b_serial, 2),
            "baseline_runs_per_s": round(b_pooled, 2),
            "serial_vs_baseline": round(serial / b_serial, 3),
            "pool_vs_baseline": round(pooled / b_pooled, 3),
        }
    print(f"{'way':<22}{'runs/s':>9}{'ms/run':>9}")
    for name, rate in rows:
        print(f"{name:<22}{rate:>9.1f}{1000 / rate:>9.1f}")
    try:
        persistent, per_call = asyncio.run(mcp_rates(args.mcp_calls, args.mcp_sessions))
        print(f"MCP calls/s: persistent session {persistent:.1f}, a session per call {per_call:.2f}")
        summary |= {
            "mcp_calls_per_s_persistent": round(persistent, 2),
            "mcp_calls_per_s_per_call": round(per_call, 2),
            "mcp_persistent_vs_per_call": round(persistent / per_call, 1),
        }
    except ImportError:
        print("MCP: the SDK is not installed (pip install 'schedrl[mcp]')")
        summary["mcp_persistent_vs_per_call"] = None
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
