"""Code in the sandbox as rewards and as a tool: unit-test scores, the `python` tool, a code task."""

from __future__ import annotations

import asyncio

import pytest
from sandbox_support import needs_sandbox, within

from schedrl.envs import make_env, make_task
from schedrl.envs.tools import make_tool
from schedrl.sandbox import Limits, SandboxPool
from schedrl.sandbox.sandbox import BASE_DIR
from schedrl.sandbox.tools import python
from schedrl.sandbox.unit_tests import SandboxError, run_tests

pytestmark = [pytest.mark.sandbox, needs_sandbox]


def test_unit_test_scores_all_or_nothing_and_partial():
    tests = ["f(1) == 1", "f(2) == 3", "f(0) == 0", "f('x') == 1"]  # the last raises: a failed test
    assert run_tests("def f(x):\n    return x", tests) == 0.0
    assert run_tests("def f(x):\n    return x", tests, partial=True) == pytest.approx(0.5)
    assert run_tests("def f(x):\n    return x if x != 2 else 3", tests[:3]) == 1.0
    assert run_tests("def f(x) return x", tests) == 0.0  # does not parse: a wrong answer, no error


def test_a_solution_past_its_limits_scores_0_never_hangs_and_only_a_sandbox_failure_raises():
    pool = SandboxPool(size=1, limits=Limits(wall_s=1, memory_mb=64))
    hang = "import time\ntime.sleep(30)\ndef f(x):\n    return x"
    assert within(4, run_tests, hang, ["f(1) == 1"], pool=pool) == 0.0  # a wrong answer, not an error
    assert run_tests("import os\nos._exit(0)", ["f(1) == 1"], pool=pool) == 0.0
    assert run_tests("x = bytearray(1 << 30)\ndef f(x):\n    return x", ["f(1) == 1"], pool=pool) == 0.0
    assert run_tests("def f(x):\n    return x", ["f(1) == 1"], pool=pool) == 1.0
    (box,) = list(pool._free.queue)
    box.filter = BASE_DIR / "no-such-filter.bpf"  # the run's setup fails before the program starts
    with pytest.raises(SandboxError, match="could not start the run: .*no-such-filter.bpf"):
        run_tests("def f(x):\n    return x", ["f(1) == 1"], pool=pool)


def test_the_python_tool_runs_in_the_sandbox_and_reports_errors_as_output():
    assert asyncio.run(python("import os\nprint(6 * 7, os.getuid() != 0)")) == "42 True\n"
    assert asyncio.run(python("print(1 / 0)")) == "error: ZeroDivisionError: division by zero"
    schema = make_tool(python).schema
    assert schema["function"]["parameters"]["properties"]["code"]["type"] == "string"


def test_the_python_tool_in_a_tool_episode():
    source = make_task("calc", min_digits=2, max_digits=2)
    env = make_env("tools", source, tools=["schedrl.sandbox.tools:python"])
    task = source.sample("train", 1, seed=0)[0]

    async def play():
        await env.reset(task, 0)
        return await env.step("<<python print(12*34)>>")

    out = asyncio.run(play())
    assert out.info["tools"] == ["ok"] and "408" in out.observation.text


def test_linear_code_task_is_scored_by_its_hidden_tests():
    source = make_task("linear_code", max_coef=5)
    task = next(t for t in source.sample("train", 200, seed=3) if t.answer.startswith("3*x+"))
    b = int(task.answer.split("+")[1])
    assert task.prompt == f"f(x)=3x+{b} def f(x): return " and len(task.metadata["tests"]) == 6
    assert source.reward(task, task.answer) == 1.0 and source.reward(task, f"x*3+{b}\nmore") == 1.0
    assert source.reward(task, "3*x") == float(b == 0)
    partial = make_task("linear_code", max_coef=5, partial=True)
    # 3x against 3x+b: right only at the probes where b is irrelevant (none, for b > 0) ...
    assert partial.reward(task, "3*x") == float(b == 0)
    # ... while 3x+b except at x=0 passes 5 of the 6 probes
    assert partial.reward(task, f"3*x+{b} if x != 0 else -1") == pytest.approx(5 / 6)
    train, held_out = source.sample("train", 50, seed=0), source.sample("eval", 20, seed=0)
    assert not {t.prompt for t in train} & {t.prompt for t in held_out}
