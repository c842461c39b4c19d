"""Score code against unit tests, in the sandbox: all-or-nothing or the fraction passed.

    score = run_tests("def f(x):\n    return 3*x+1", ["f(0) == 1", "abs(f(2) - 7) < 1e-9"], partial=True)

A grader the program cannot talk to (`checks.py`): each test is split into probes (``f(2)``) and a
verdict the host reaches (``abs(<value> - 7) < 1e-9``). Only the solution and the probes enter the
sandbox; a harness there runs the solution, evaluates each probe and writes its value (JSON, with
tuples, sets, dicts, bytes and complex numbers tagged) to a file the host reads back as plain data,
and the host judges. Printing a pass line, patching builtins or the harness, or reading the files
of the run cannot pass a test: the only way is to report the right values, and the right values are
never in the sandbox. Out of memory is the kernel's verdict.

Whatever the program does scores: a solution that fails to parse, raises, exits, hangs past its
limits, runs out of memory or writes a report the host cannot read scores 0 (a wrong answer, not an
error that could stop training). `SandboxError` is raised only when the sandbox could not start the
run, which the run's `RewardScorer` counts as a reward error (and stops above its error rate).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from schedrl.sandbox.checks import ProbeError, compile_checks, decode, judge
from schedrl.sandbox.limits import Limits
from schedrl.sandbox.pool import SandboxPool

_POOL: SandboxPool | None = None
RESULTS = "probes.out.json"
REPORT_BYTES = 4 << 20  # a longer report is no report: the host never parses more
SOLUTION_CHARS = 1 << 20
HARNESS = f"""\
import json, numbers
with open("probes.json") as f:
    probes = json.load(f)
def encode(v, depth=0):
    if depth > 64:
        raise ValueError("nested too deep")
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, list):
        return [encode(x, depth + 1) for x in v]
    if isinstance(v, tuple):
        return {{"tuple": [encode(x, depth + 1) for x in v]}}
    if isinstance(v, frozenset):
        return {{"frozenset": [encode(x, depth + 1) for x in v]}}
    if isinstance(v, set):
        return {{"set": [encode(x, depth + 1) for x in v]}}
    if isinstance(v, dict):
        return {{"dict": [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in v.items()]}}
    if isinstance(v, (bytes, bytearray)):
        return {{"bytes": bytes(v).hex()}}
    if isinstance(v, complex):
        return {{"complex": [v.real, v.imag]}}
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        return float(v)
    raise TypeError("not plain data: " + type(v).__name__)
scope = {{"__name__": "__main__", "__builtins__": __builtins__}}
failed = None
try:
    with open("solution.py") as f:
        exec(compile(f.read(), "solution.py", "exec"), scope)
except BaseException as e:
    failed = type(e).__name__
out = []
for probe in probes:
    if failed is not None:
        out.append(["error", failed])
        continue
    try:
        out.append(["value", encode(eval(probe, scope))])
    except BaseException as e:
        out.append(["error", type(e).__name__])
with open({RESULTS!r}, "w") as f:
    json.dump(out, f)
"""


class SandboxError(RuntimeError):
    """The sandbox could not start the run (nothing the program did)."""


def default_pool() -> SandboxPool:
    """One pool per process (4 slots), made on first use."""
    global _POOL
    if _POOL is None:
        _POOL = SandboxPool(size=4, limits=Limits(wall_s=5, cpu_s=3, memory_mb=256))
    return _POOL


def read_report(data: bytes | None, count: int) -> list:
    """The probes' values from the harness's file; [] when it is absent or not a report of `count`."""
    if data is None or len(data) > REPORT_BYTES:
        return []
    try:
        records = json.loads(data)
    except (ValueError, RecursionError):
        return []
    if not isinstance(records, list) or len(records) != count:
        return []
    values = []
    for rec in records:
        if not (isinstance(rec, list) and len(rec) == 2 and rec[0] in ("value", "error")):
            return []
        if rec[0] == "error":
            values.append(ProbeError(str(rec[1])[:80]))
        else:
            values.append(decode(rec[1]))
    return values


def run_tests(
    solution: str, tests: Sequence[str], partial: bool = False, pool: SandboxPool | None = None
) -> float:
    """1.0 when every test passes (or the fraction passed, `partial`); `SandboxError` when the sandbox
    could not start the run."""
    if not tests:
        raise ValueError("run_tests: no tests given")
    checks, probes = compile_checks(tests)
    if len(solution) > SOLUTION_CHARS:
        return 0.0  # no program that long is an answer, and it would not fit the run's disk
    pool = pool or default_pool()
    result = pool.run_sync(
        code=HARNESS,
        files={"solution.py": solution, "probes.json": json.dumps(probes)},
        collect=[RESULTS],
    )
    if not result.started:
        raise SandboxError(f"the sandbox could not start the run: {result.stderr[-300:]}")
    values = read_report(result.files.get(RESULTS), len(probes))
    if not values:  # timed out, out of memory, ended before reporting, or a report that is not one
        return 0.0
    passed = sum(judge(c, values) for c in checks)
    return passed / len(checks) if partial else float(passed == len(checks))
