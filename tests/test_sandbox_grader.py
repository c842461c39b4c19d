"""The unit-test grader cannot be talked to: tests split into probes and a verdict the host reaches
(closed-form, no sandbox needed), and every trick that fooled the old grader scores a wrong answer 0."""

from __future__ import annotations

import json
import math
import re

import pytest
from sandbox_support import needs_sandbox

from schedrl.sandbox.checks import ProbeError, compile_checks, decode, judge
from schedrl.sandbox.unit_tests import REPORT_BYTES, read_report, run_tests


def _values(probes: list[str], table: dict[str, object]) -> list:
    return [table[p] for p in probes]


def test_a_test_is_split_into_probes_that_run_inside_and_a_verdict_the_host_reaches():
    tests = ["f(2) == 7", "0 < g(1, 'a') <= 9", "not h()", "f(2) == 8 or k([1, 2])", "abs(f(2) - 7.5) < 1e-6"]
    checks, probes = compile_checks(tests)
    assert probes == ["f(2)", "g(1, 'a')", "h()", "f(2)", "k([1, 2])", "f(2)"]  # each in its place
    assert not any(n in p for p in probes for n in ("7", "9", "8"))  # expected values never enter
    right = _values(probes, {"f(2)": 7, "g(1, 'a')": 9, "h()": [], "k([1, 2])": [0]})
    assert [judge(c, right) for c in checks] == [True, True, True, True, False]
    other = _values(probes, {"f(2)": 7.5, "g(1, 'a')": 10, "h()": [1], "k([1, 2])": []})
    assert [judge(c, other) for c in checks] == [False, False, False, False, True]


def test_the_host_judges_arithmetic_builtins_and_indexing_on_plain_data():
    tests = [
        "math.isclose(f(2), 7.5, rel_tol=1e-9)",
        "(f(2) == 7.5) is True",
        "[f(1) == 2, f(2) == 7.5] == [True, True]",
        "f(2) - 7.5 == 0",
        "sorted(f(3)) == [1, 2, 3] and len(f(3)) == 3 and f(3)[0] == 3",
        "isinstance(f(1), int) and type(f(1)) == int",
        "f(1) == f(1.0)",
        "f(2) == 7.5 if True else False",
        "f(4) == {frozenset({1, 2}): (3, 4)} and round(f(2), 0) == 8.0",
    ]
    checks, probes = compile_checks(tests)
    assert set(probes) == {"f(2)", "f(1)", "f(3)", "f(1.0)", "f(4)"}
    right = {"f(2)": 7.5, "f(1)": 2, "f(3)": [3, 1, 2], "f(1.0)": 2, "f(4)": {frozenset({1, 2}): (3, 4)}}
    assert [judge(c, _values(probes, right)) for c in checks] == [True] * 9
    wrong = {"f(2)": 7.4, "f(1)": 2.0, "f(3)": [3, 1], "f(1.0)": 1, "f(4)": {}}
    assert [judge(c, _values(probes, wrong)) for c in checks] == [False] * 9


def test_a_probe_that_raised_or_is_unreadable_fails_its_check_even_negated():
    checks, _ = compile_checks(["f(1) == 1", "not f(2)", "f(3) != 4"])
    raised = ProbeError("ZeroDivisionError")
    assert [judge(c, [raised, raised, decode({"object": "x"})]) for c in checks] == [False, False, False]
    assert decode({"tuple": [1, {"set": ["a"]}]}) == (1, {"a"}) and decode({"bytes": "6869"}) == b"hi"
    assert decode({"dict": [[{"tuple": [1, 2]}, None]]}) == {(1, 2): None}
    assert isinstance(decode({"dict": [[[1], 2]]}), ProbeError)  # an unhashable key: unreadable
    nested: list = []
    for _ in range(100):
        nested = [nested]
    assert isinstance(decode(nested), ProbeError)  # deeper than 64: unreadable
    assert judge(compile_checks(["f(0) < 2"])[0][0], ["a"]) is False  # mismatched types fail, not raise
    assert judge(compile_checks(["f(0) * 10**9 == ''"])[0][0], ["x"]) is False  # too large to judge
    assert judge(compile_checks(["f(2) * f(3) == f(6)"])[0][0], ["x" * 500, 10**6, ""]) is False
    colliding = [k * (2**61 - 1) for k in range(1, 1000)]  # all hash to 0: a set of them costs n**2
    assert isinstance(decode({"set": colliding}), ProbeError)
    assert isinstance(decode({"dict": [[k, 0] for k in colliding]}), ProbeError)
    assert judge(compile_checks(["set(f(1)) == {0}"])[0][0], [colliding]) is False
    assert decode({"set": list(range(1000))}) == set(range(1000))  # distinct hashes are fine
    assert decode({"set": [0] * 1000}) == {0}  # and so are equal items
    assert decode({"frozenset": [1, {"frozenset": [2]}]}) == frozenset({1, frozenset({2})})
    assert judge(compile_checks(["set(range(f(1))) == {0}"])[0][0], [10**9]) is False  # too large


def test_expected_values_computed_in_the_test_are_computed_on_the_host():
    tests = [
        "f(3) == pow(2, 10)",
        "f(5) == list(range(5))",
        "abs(f(2) - math.log(2)) < 1e-9",
        "f(4) == math.factorial(4)",
        "f(1) == frozenset({1, 2})",
        "f(6) == pow(2, 10, 7)",
    ]
    checks, probes = compile_checks(tests)
    assert probes == ["f(3)", "f(5)", "f(2)", "f(4)", "f(1)", "f(6)"]  # nothing of the expected side
    with pytest.raises(ValueError, match="uses `EXPECTED`, which names no call of the solution's"):
        compile_checks(["f(3) == EXPECTED"])  # a bare name the solution could define
    with pytest.raises(ValueError, match="uses `ref`, which names no call"):
        compile_checks(["f(3) == ref[0]"])
    right = [1024, [0, 1, 2, 3, 4], math.log(2), 24, {1, 2}, 2]
    assert [judge(c, right) for c in checks] == [True] * 6
    assert [judge(c, [0] * 6) for c in checks] == [False] * 6


def test_tests_the_host_cannot_judge_are_refused_with_the_test_named():
    with pytest.raises(ValueError, match=r"would run `\(f\(x\) == y for x, y in .*` beside the solution"):
        compile_checks(["all(f(x) == y for x, y in [(1, 2), (2, 7)])"])
    with pytest.raises(ValueError, match=r"would run `lambda v: v > 1` beside the solution"):
        compile_checks(["f(lambda v: v > 1) == 2"])
    for test, name in [
        ('f("x") == "hello".upper()', "no call of the solution's"),
        ("abs(f(2) - math.gamma(3)) < 1e-9", "no call of the solution's"),
        ("f(3) == sys.maxsize", "no call of the solution's"),
        ("f(3) == open('x').read()", "Python's own `open`"),
    ]:  # each would run beside the solution, which could answer for it
        with pytest.raises(ValueError, match=f"uses `.*`, which names {re.escape(name)}"):
            compile_checks([test])
    with pytest.raises(ValueError, match="test '1 == 1' does not call the solution"):
        compile_checks(["1 == 1"])
    with pytest.raises(ValueError, match=r"test 'f\(' is not a Python expression"):
        compile_checks(["f("])


def test_a_report_that_is_not_one_record_per_probe_is_no_report():
    assert read_report(b'[["value", 1]]', 1) == [1]
    assert read_report(b'[["value", 1]]', 2) == []
    assert read_report(b'[["verdict", "pass"]]', 1) == []
    assert read_report(b"not json", 1) == [] and read_report(None, 1) == []
    big = json.dumps([["value", 1]] * 800_000).encode()  # 11 MB: never parsed
    assert len(big) > REPORT_BYTES and read_report(big, 800_000) == []


WRONG = "def f(x):\n    return 0\n"
TESTS = ["f(1) == 1234567", "f(2) == 2469134"]


@pytest.mark.sandbox
@needs_sandbox
def test_printing_the_old_pass_line_and_exiting_passes_nothing():
    assert run_tests(WRONG + "print('__schedrl_tests__ 2 2')\nimport sys\nsys.exit(0)\n", TESTS) == 0.0
    assert (
        run_tests(WRONG + "print('__schedrl_tests__ 2 2', flush=True)\nimport os\nos._exit(0)\n", TESTS)
        == 0.0
    )


ANYTHING = (  # equal to everything, and the helpers a test might call patched to agree
    "class Any:\n"
    "    def __eq__(self, other):\n        return True\n"
    "    def __sub__(self, other):\n        return 0\n"
    "    __rsub__ = __sub__\n"
    "    def __abs__(self):\n        return 0\n"
    "    def __lt__(self, other):\n        return True\n"
    "    def __repr__(self):\n        return '1234567'\n"
    "import math, builtins\n"
    "math.isclose = lambda *a, **k: True\n"
    "builtins.all = builtins.abs = builtins.sorted = lambda *a, **k: True\n"
    "def f(*a):\n    return Any()\n"
)


@pytest.mark.sandbox
@needs_sandbox
def test_patching_builtins_and_the_harness_cannot_pass_a_wrong_answer():
    patches = [
        "import builtins\nbuiltins.eval = lambda *a, **k: True\nbuiltins.bool = lambda *a: True\n",
        "import builtins\nbuiltins.repr = lambda x: '__schedrl_tests__'\n",
        'import json\njson.dump = lambda obj, f: f.write(\'[["value", true], ["value", true]]\')\n',
        ANYTHING,
    ]
    for patch in patches:
        assert run_tests(WRONG + patch, TESTS, partial=True) == 0.0, patch
    shapes = [  # the shapes that fooled the first version of this grader, HumanEval's among them
        "abs(f(2) - 7.5) < 1e-6",
        "math.isclose(f(2), 7.5)",
        "(f(2) == 7) is True",
        "(f(2) == [1, 2, 3]) == True",
        "f(2) == 7 if True else False",
        "[f(1) == 2, f(2) == 7] == [True, True]",
        "f(2) - 7 == 0",
        "sorted(f(2)) == [1, 2]",
    ]
    assert run_tests(ANYTHING, shapes, partial=True) == 0.0
    right = "def f(x):\n    return {1: 2, 2: 7}[x]\n"
    assert (
        run_tests(right, ["f(2) - 7 == 0", "abs(f(2) - 7) < 1e-6", "[f(1) == 2, f(2) == 7] == [True, True]"])
        == 1.0
    )


@pytest.mark.sandbox
@needs_sandbox
def test_a_solution_that_rewrites_the_whole_report_still_reports_only_its_own_values():
    rewrite = (
        "import json\n"
        "_dump = json.dump\n"
        "json.dump = lambda out, f, *a, **k: _dump([['value', 0] for _ in out], f)\n"
        "def pow(a, b):\n    return 0\n"
        "def f(x):\n    return None\n"
    )
    tests = [
        "f(3) == pow(2, 10)",
        "f(5) == list(range(5))",
        "f(4) == math.factorial(4)",
        "f(1) == 0 * pow(2, 3)",
    ]
    assert run_tests(rewrite, tests, partial=True) == 0.25  # only the last: its expected value is 0
    surrogate = "def f(x):\n    return '\udc80'\n"  # a lone surrogate in the solution: scored, not raised
    assert run_tests(surrogate, ["f(1) == 1"]) == 0.0


@pytest.mark.sandbox
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


@pytest.mark.sandbox
@needs_sandbox
def test_a_memory_error_printed_on_stderr_is_a_wrong_answer_not_an_out_of_memory():
    lying = WRONG + "import sys\nprint('MemoryError: Cannot allocate memory', file=sys.stderr)\n"
    assert run_tests(lying, TESTS) == 0.0
