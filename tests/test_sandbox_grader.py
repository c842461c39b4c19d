"""The unit-test grader cannot be talked to: tests split into probes and a verdict the host reaches
(closed-form, no sandbox needed), and every trick that fooled the old grader scores a wrong answer 0."""

from __future__ import annotations

import json

import pytest

from schedrl.sandbox.checks import ProbeError, compile_checks, judge, read_value
from schedrl.sandbox.unit_tests import REPORT_BYTES, VALUE_CHARS, SandboxError, read_report, run_tests
from tests.sandbox_support import needs_sandbox


def test_a_test_is_split_into_probes_that_run_inside_and_literals_that_stay_out():
    checks, probes = compile_checks(["f(2) == 7", "0 < g(1, 'a') <= 9", "not h()", "f(1) == 2 or k([1, 2])"])
    assert probes == ["f(2)", "g(1, 'a')", "h()", "f(1)", "k([1, 2])"]
    assert not any("7" in p or "9" in p for p in probes)  # expected values never enter the sandbox
    values = [7, 9, [], 3, [0]]
    assert [judge(c, values) for c in checks] == [True, True, True, True]
    values = [7.0, 10, [1], 3, []]
    assert [judge(c, values) for c in checks] == [True, False, False, False]


def test_a_probe_that_raised_or_is_unreadable_fails_its_check_even_negated():
    checks, _ = compile_checks(["f(1) == 1", "not f(2)", "f(3) != 4"])
    raised = ProbeError("ZeroDivisionError")
    assert [judge(c, [raised, raised, read_value("<object at 0x1>")]) for c in checks] == [
        False,
        False,
        False,
    ]
    assert read_value("inf") == float("inf") and read_value("{1, (2, 'a')}") == {1, (2, "a")}
    assert isinstance(read_value("__import__('os').system('true')"), ProbeError)  # only literals are read
    assert judge(compile_checks(["f(0) < 2"])[0][0], ["a"]) is False  # mismatched types fail, not raise


def test_tests_the_host_cannot_judge_are_refused_with_the_test_named():
    with pytest.raises(ValueError, match=r"test 'f\(1\) == f\(2\)' must compare one expression"):
        compile_checks(["f(1) == f(2)"])
    with pytest.raises(ValueError, match="test '1 == 1' does not call the solution"):
        compile_checks(["1 == 1"])
    with pytest.raises(ValueError, match=r"test 'f\(' is not a Python expression"):
        compile_checks(["f("])


def test_a_report_that_is_not_one_record_per_probe_is_no_report():
    assert read_report(b'[["value", "1"]]', 1) == [1]
    assert read_report(b'[["value", "1"]]', 2) == []
    assert read_report(b'[["verdict", "pass"]]', 1) == []
    assert read_report(b"not json", 1) == [] and read_report(None, 1) == []
    big = json.dumps([["value", "1"]] * 500_000).encode()  # 8 MB: never parsed
    assert len(big) > REPORT_BYTES and read_report(big, 500_000) == []
    (value,) = read_report(json.dumps([["value", "[" + "1, " * VALUE_CHARS + "]"]]).encode(), 1)
    assert isinstance(value, ProbeError)  # too long to read back: a failed probe


WRONG = "def f(x):\n    return 0\n"
TESTS = ["f(1) == 1234567", "f(2) == 2469134"]


@needs_sandbox
def test_printing_the_old_pass_line_and_exiting_passes_nothing():
    assert run_tests(WRONG + "print('__schedrl_tests__ 2 2')\nimport sys\nsys.exit(0)\n", TESTS) == 0.0
    with pytest.raises(SandboxError, match="did not report"):
        run_tests(WRONG + "print('__schedrl_tests__ 2 2', flush=True)\nimport os\nos._exit(0)\n", TESTS)


@needs_sandbox
def test_patching_builtins_and_the_harness_cannot_pass_a_wrong_answer():
    patches = [
        "import builtins\nbuiltins.eval = lambda *a, **k: True\nbuiltins.bool = lambda *a: True\n",
        "import builtins\nbuiltins.repr = lambda x: '__schedrl_tests__'\n",
        'import json\njson.dump = lambda obj, f: f.write(\'[["value", "True"], ["value", "True"]]\')\n',
        "class Always:\n    def __eq__(self, other):\n        return True\n    def __repr__(self):\n        return 'True'\n"
        "def f(x):\n    return Always()\n",
    ]
    for patch in patches:
        assert run_tests(WRONG + patch, TESTS, partial=True) == 0.0, patch


@needs_sandbox
def test_the_expected_values_are_nowhere_the_solution_can_read():
    snoop = (
        "import os, re\n"
        "found = set()\n"
        "for root, dirs, files in os.walk('/', onerror=lambda e: None):\n"
        "    if root.startswith(('/proc', '/usr', '/sys', '/dev')):\n"
        "        dirs[:] = []\n"
        "        continue\n"
        "    for name in files:\n"
        "        try:\n"
        "            found |= set(re.findall(r'\\d{7}', open(os.path.join(root, name), errors='ignore').read(1 << 20)))\n"
        "        except OSError:\n"
        "            pass\n"
        "ANSWERS = sorted(int(n) for n in found)\n"
        "def f(x):\n"
        "    return ANSWERS[x - 1] if len(ANSWERS) >= x else 0\n"
    )
    assert run_tests(snoop, TESTS, partial=True) == 0.0
    assert run_tests("def f(x):\n    return 1234567 * x\n", TESTS) == 1.0  # the right answer still passes


@needs_sandbox
def test_a_memory_error_printed_on_stderr_is_a_wrong_answer_not_an_out_of_memory():
    lying = WRONG + "import sys\nprint('MemoryError: Cannot allocate memory', file=sys.stderr)\n"
    assert run_tests(lying, TESTS) == 0.0
