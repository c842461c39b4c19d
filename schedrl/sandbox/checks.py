"""Unit tests split into what runs in the sandbox (probes) and what the host judges (the verdict).

A test such as ``f(2) == 7`` becomes the probe ``f(2)``, evaluated next to the solution, and a host
side ``<probe 0> == 7``. Expected values never enter the sandbox, and no comparison or truth test
happens there: the solution can only change the values its probes produce, so a test passes only if
the value it reports is the right one. What the host evaluates is literals, comparisons, `and`, `or`
and `not` over the reported values; it never calls anything the solution made.

A test is an expression: a comparison with a literal on one side (chains such as ``0 < f(x) < 9``
too), a bare probe (true when its value is truthy), or `and`/`or`/`not` of those. A comparison of
two probes (``f(1) == f(2)``) is refused: both sides are computed beside the solution, which could
make them agree.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
SPECIAL_FLOATS = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


@dataclass(frozen=True)
class _Probe:
    index: int


@dataclass(frozen=True)
class Check:
    """One test: its source, and its host-side tree with each probe replaced by `_Probe(i)`."""

    source: str
    tree: Any


def _literal(node: ast.expr) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def compile_checks(tests: Sequence[str]) -> tuple[list[Check], list[str]]:
    """The checks and the probes (expression sources, shared across tests by index)."""
    probes: list[str] = []

    def probe(node: ast.expr) -> _Probe:
        probes.append(ast.unparse(node))
        return _Probe(len(probes) - 1)

    def split(node: ast.expr, test: str) -> Any:
        if isinstance(node, ast.BoolOp):
            return (type(node.op), [split(v, test) for v in node.values])
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return (ast.Not, split(node.operand, test))
        if isinstance(node, ast.Compare):
            operands = []
            for operand in [node.left, *node.comparators]:
                is_literal, value = _literal(operand)
                operands.append(("literal", value) if is_literal else probe(operand))
            count = sum(isinstance(o, _Probe) for o in operands)
            if count == 0:
                raise ValueError(f"run_tests: test {test!r} does not call the solution")
            if count > 1:
                raise ValueError(
                    f"run_tests: test {test!r} must compare one expression of the solution with literals "
                    "(two would both run beside the solution, which could make them agree)"
                )
            return (ast.Compare, [type(op) for op in node.ops], operands)
        is_literal, _ = _literal(node)
        if is_literal:
            raise ValueError(f"run_tests: test {test!r} does not call the solution")
        return probe(node)

    checks = []
    for test in tests:
        if not isinstance(test, str):
            raise ValueError(f"run_tests: a test is an expression string, got {test!r}")
        try:
            tree = ast.parse(test, mode="eval").body
        except SyntaxError as err:
            raise ValueError(f"run_tests: test {test!r} is not a Python expression: {err.msg}") from err
        checks.append(Check(test, split(tree, test)))
    return checks, probes


def read_value(text: str) -> Any:
    """A probe's reported `repr`, read back as plain data (never code)."""
    if text in SPECIAL_FLOATS:
        return SPECIAL_FLOATS[text]
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return UNREADABLE


def judge(check: Check, values: Sequence[Any]) -> bool:
    """The check's verdict on the probes' values (plain data, or a `ProbeError`). A check with a probe
    that raised or reported something unreadable fails, as a test that raises does."""

    def probes(node: Any) -> list[int]:
        if isinstance(node, _Probe):
            return [node.index]
        if node[0] is ast.Compare:
            return [o.index for o in node[2] if isinstance(o, _Probe)]
        if node[0] is ast.Not:
            return probes(node[1])
        return [i for n in node[1] for i in probes(n)]

    def truth(node: Any) -> bool:
        if isinstance(node, _Probe):
            return bool(values[node.index])
        kind = node[0]
        if kind is ast.And:
            return all(truth(n) for n in node[1])
        if kind is ast.Or:
            return any(truth(n) for n in node[1])
        if kind is ast.Not:
            return not truth(node[1])
        _, ops, operands = node
        vals = [values[o.index] if isinstance(o, _Probe) else o[1] for o in operands]
        try:
            return all(bool(COMPARE[op](a, b)) for op, a, b in zip(ops, vals, vals[1:], strict=False))
        except Exception:  # plain data of mismatched types (1 < "a")
            return False

    if any(isinstance(values[i], ProbeError) for i in probes(check.tree)):
        return False
    return truth(check.tree)


@dataclass(frozen=True)
class ProbeError:
    """A probe raised (its exception's type name), the solution did before the probes ran, or the
    reported value is not a literal the host can read."""

    name: str


UNREADABLE = ProbeError("unreadable")
