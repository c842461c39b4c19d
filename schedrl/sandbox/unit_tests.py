"""Score code against unit tests, in the sandbox: all-or-nothing or the fraction passed.

    score = run_tests("def f(x):\n    return 3*x+1", ["f(0) == 1", "f(2) == 7"], partial=True)

The program is the solution followed by one guarded check per test; it prints how many passed. A
solution that crashes, hangs past its limits or prints nothing scores through `SandboxError`, which
the run's `RewardScorer` counts as a reward error (0, and the run stops above its error rate):
a hung test never hangs the step.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from schedrl.sandbox.pool import SandboxPool
from schedrl.sandbox.sandbox import Limits

_POOL: SandboxPool | None = None
MARK = "__schedrl_tests__"


class SandboxError(RuntimeError):
    """The sandboxed program timed out, ran out of memory, or did not report its tests."""


def default_pool() -> SandboxPool:
    """One pool per process (4 slots), made on first use."""
    global _POOL
    if _POOL is None:
        _POOL = SandboxPool(size=4, limits=Limits(wall_s=5, cpu_s=3, memory_mb=256))
    return _POOL


def test_program(solution: str, tests: Sequence[str]) -> str:
    checks = json.dumps(list(tests))
    return (
        f"{solution}\n\n"
        "def __schedrl_run(checks):\n"
        "    passed = 0\n"
        "    for check in checks:\n"
        "        try:\n"
        "            passed += bool(eval(check))\n"
        "        except Exception:\n"
        "            pass\n"
        f"    print({MARK!r}, passed, len(checks))\n"
        f"__schedrl_run({checks})\n"
    )


def run_tests(
    solution: str, tests: Sequence[str], partial: bool = False, pool: SandboxPool | None = None
) -> float:
    """1.0 when every test passes (or the fraction passed, `partial`); raises `SandboxError` when the
    program does not get to report (a syntax error before the checks scores 0 without raising)."""
    if not tests:
        raise ValueError("run_tests: no tests given")
    result = (pool or default_pool()).run_sync(code=test_program(solution, tests))
    if result.timed_out or result.oom:
        raise SandboxError(f"tests {'timed out' if result.timed_out else 'ran out of memory'}")
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(MARK):
            passed, total = map(int, line.split()[1:3])
            return passed / total if partial else float(passed == total)
    if "SyntaxError" in result.stderr or "IndentationError" in result.stderr:
        return 0.0  # the model's code does not parse: a wrong answer, not a failure of the sandbox
    raise SandboxError(f"the tests did not report (exit {result.exit_code}): {result.stderr[-300:]}")
