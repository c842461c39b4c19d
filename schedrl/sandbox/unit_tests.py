"""Score code against unit tests, in the sandbox: all-or-nothing or the fraction passed.

    score = run_tests("def f(x):\n    return 3*x+1", ["f(0) == 1", "f(2) == 7"], partial=True)

A grader the program cannot talk to (`checks.py`): each test is split into probes (``f(2)``) and a
verdict the host reaches (``== 7``). Only the solution and the probes enter the sandbox; a harness
there runs the solution, evaluates each probe and writes the `repr` of each value to a file the host
reads back as plain data, and the host compares. Printing a pass line, patching builtins or the
harness, or reading the files of the run cannot pass a test: the only way is to report the right
value, and the right values are never in the sandbox. Out of memory is the kernel's verdict.

A solution that fails to parse or raises scores 0 (its probes fail). A run that times out, runs out
of memory, or ends without reporting (`os._exit`) raises `SandboxError`, which the run's
`RewardScorer` counts as a reward error (0, and the run stops above its error rate): a hung test
never hangs the step.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from schedrl.sandbox.checks import ProbeError, compile_checks, judge, read_value
from schedrl.sandbox.limits import Limits
from schedrl.sandbox.pool import SandboxPool

_POOL: SandboxPool | None = None
RESULTS = "probes.out.json"
REPORT_BYTES = 4 << 20  # a longer report is no report: the host never parses more
VALUE_CHARS = 1 << 20  # a longer repr is unreadable
HARNESS = f"""\
import json
with open("probes.json") as f:
    probes = json.load(f)
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
        out.append(["value", repr(eval(probe, scope))])
    except BaseException as e:
        out.append(["error", type(e).__name__])
with open({RESULTS!r}, "w") as f:
    json.dump(out, f)
"""


class SandboxError(RuntimeError):
    """The sandboxed program timed out, ran out of memory, or did not report its probes."""


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
        if not (
            isinstance(rec, list)
            and len(rec) == 2
            and rec[0] in ("value", "error")
            and isinstance(rec[1], str)
        ):
            return []
        if rec[0] == "error" or len(rec[1]) > VALUE_CHARS:
            values.append(ProbeError(rec[1][:80]))
        else:
            values.append(read_value(rec[1]))
    return values


def run_tests(
    solution: str, tests: Sequence[str], partial: bool = False, pool: SandboxPool | None = None
) -> float:
    """1.0 when every test passes (or the fraction passed, `partial`); raises `SandboxError` when the
    run does not get to report."""
    if not tests:
        raise ValueError("run_tests: no tests given")
    checks, probes = compile_checks(tests)
    pool = pool or default_pool()
    result = pool.run_sync(
        code=HARNESS,
        files={"solution.py": solution, "probes.json": json.dumps(probes)},
        collect=[RESULTS],
    )
    if result.timed_out or result.oom:
        raise SandboxError(f"tests {'timed out' if result.timed_out else 'ran out of memory'}")
    values = read_report(result.files.get(RESULTS), len(probes))
    if not values:
        raise SandboxError(f"the tests did not report (exit {result.exit_code}): {result.stderr[-300:]}")
    passed = sum(judge(c, values) for c in checks)
    return passed / len(checks) if partial else float(passed == len(checks))
