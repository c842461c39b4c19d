"""Sandboxed runs per second, serial and pooled, and the sandbox's overhead over a bare subprocess.

Each run is `print(1)` in a fresh Python (`python3 -I`), so the figures are the cost of the
confinement itself (namespaces, a tmpfs per mount point, uid switch, rlimits, a working
directory made and removed) on top of an interpreter start.

MCP: calls per second to `schedrl/envs/tools/mcp_calc_server.py` over one persistent stdio session (how
schedrl calls a server) against a new session per call (start the server, initialize, call, close:
verl's `MCPBaseTool` pattern). Needs `pip install 'schedrl[mcp]'`.

    python bench/sandbox.py                 # 40 runs each way, ~30 s on 2 cores (needs root)
    python bench/sandbox.py --runs 100 --pool 4

The last line is one JSON object with `sandbox_runs_per_s` (pooled), `sandbox_runs_per_s_serial`,
`bare_runs_per_s`, `sandbox_overhead_ms`, `mcp_calls_per_s_persistent`, `mcp_calls_per_s_per_call` and
`mcp_persistent_vs_per_call`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--pool", type=int, default=4)
    ap.add_argument("--mcp-calls", type=int, default=200, help="calls over the persistent session")
    ap.add_argument("--mcp-sessions", type=int, default=10, help="calls with a session each")
    args = ap.parse_args()
    box = Sandbox(slot=30)
    python = box.python

    def bare(n: int) -> None:
        for _ in range(n):
            subprocess.run([python, "-I", "-c", "print(1)"], capture_output=True, check=True)

    def serial(n: int) -> None:
        for _ in range(n):
            assert box.run(code="print(1)").stdout == "1\n"

    pool = SandboxPool(size=args.pool)

    def pooled(n: int) -> None:
        with ThreadPoolExecutor(args.pool) as ex:
            assert all(r.stdout == "1\n" for r in ex.map(lambda _: pool.run_sync(code="print(1)"), range(n)))

    bare(3)  # warm the page cache
    serial(3)
    t_bare, t_serial, t_pool = timed(bare, args.runs), timed(serial, args.runs), timed(pooled, args.runs)
    rows = [
        ("bare subprocess", t_bare),
        ("sandbox, serial", t_serial),
        (f"sandbox, pool of {args.pool}", t_pool),
    ]
    print(f"{'way':<22}{'runs/s':>9}{'ms/run':>9}")
    for name, t in rows:
        print(f"{name:<22}{args.runs / t:>9.1f}{1000 * t / args.runs:>9.1f}")
    summary = {
        "runs": args.runs,
        "bare_runs_per_s": round(args.runs / t_bare, 2),
        "sandbox_runs_per_s_serial": round(args.runs / t_serial, 2),
        "sandbox_runs_per_s": round(args.runs / t_pool, 2),
        "sandbox_overhead_ms": round(1000 * (t_serial - t_bare) / args.runs, 2),
    }
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
