"""Unit tests split into what runs in the sandbox (probes) and what the host judges (everything else).

A test such as ``abs(f(2) - 7.5) < 1e-6`` becomes the probe ``f(2)``, evaluated beside the solution,
and a host-side expression over the value it reports: ``abs(<probe 0> - 7.5) < 1e-6``. A probe is a
part of the test that calls or names something of the solution's; what the host evaluates is
literals, arithmetic, comparisons, `and`/`or`/`not`, conditionals, indexing, and a few pure builtins
(`len`, `sorted`, `abs`, `isinstance`, `math.isclose`, ...) over plain data. So expected values never
enter the sandbox and no comparison runs there: the solution can only change the values its probes
produce, and a test passes only if those values are right.

Refused, with the test named: a part the host does not evaluate that is not the solution's
(``"a".upper()``, ``math.gamma(3)``, ``sys.maxsize``: it would run beside the solution, which could
answer for it; compute the value in the test), a probe holding a comparison, a boolean operator, a
conditional, a comprehension or a lambda (``all(f(x) == y for x, y in cases)``: that comparison would
run beside the solution, which could make it true; write one test per case), and a test that calls
nothing of the solution's. A probe's arguments run beside the solution too: keep expected values out
of them.

References: the probe/verdict split is this project's; HumanEval's `check(candidate)` tests are the
shape it is checked on (``assert abs(candidate(x) - y) < 1e-6``).
"""

from __future__ import annotations

import ast
import builtins
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: lambda a, b: _bounded_mult(a, b),
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: lambda a, b: _bounded_mod(a, b),
    ast.Pow: lambda a, b: _bounded_pow(a, b),
}
UNARY: dict[type, Callable[[Any], Any]] = {
    ast.Not: operator.not_,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Invert: operator.invert,
}
COMPARE: dict[type, Callable[[Any, Any], Any]] = {
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
FUNCTIONS: dict[str, Callable[..., Any]] = {  # pure on plain data, bounded by what they are given
    n: getattr(builtins, n)
    for n in ("abs", "all", "any", "bool", "chr", "divmod", "float", "int", "isinstance", "len", "list")
    + ("max", "min", "ord", "repr", "sorted", "str", "tuple", "range")
}
FUNCTIONS |= {
    "set": lambda *a: set(_hashed(*a)),
    "frozenset": lambda *a: frozenset(_hashed(*a)),
    "dict": lambda *a: dict(_hashed(*a, pairs=True)),
    "pow": lambda a, b, mod=None: _bounded_pow(a, b) if mod is None else pow(a, b, mod),
    "sum": lambda items, start=0: sum(items, _number(start)),  # a list start would make it n**2
    "round": lambda x, ndigits=None: round(x, None if ndigits is None else max(-100, min(100, ndigits))),
    "type": lambda x: type(x),
}
MATH: dict[str, Callable[..., Any]] = {
    n: getattr(math, n)
    for n in ("isclose", "isnan", "isinf", "isfinite", "floor", "ceil", "sqrt", "fabs", "log", "log2")
    + ("log10", "exp", "hypot", "gcd", "trunc")
}
MATH |= {
    "factorial": lambda n: math.factorial(_small(n)),
    "comb": lambda n, k: math.comb(_small(n), k),
    "perm": lambda n, k=None: math.perm(_small(n), k),
}
MATH_CONSTANTS = {n: getattr(math, n) for n in ("inf", "nan", "pi", "e", "tau")}
TYPES = {
    n: getattr(builtins, n)
    for n in ["int", "float", "str", "bool", "list", "tuple", "dict", "set", "bytes", "complex", "type"]
}
KEYWORDS = {"sorted": {"reverse"}, "round": {"ndigits"}, "isclose": {"rel_tol", "abs_tol"}, "int": {"base"}}
INSIDE_ONLY = (ast.Compare, ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr, ast.ListComp, ast.SetComp)
INSIDE_ONLY += (ast.DictComp, ast.GeneratorExp, ast.Await, ast.Yield, ast.YieldFrom)
LARGEST = 10**6  # elements or digits an operation on the host may produce
SAME_HASH = 32  # items of one hash a set or dict built on the host may hold (equal hashes cost n**2)
MODULES = "math cmath sys os string re json itertools functools collections operator random statistics"
RESERVED = set(dir(builtins)) | set((MODULES + " decimal fractions numpy np").split())


def _bounded_mult(a: Any, b: Any) -> Any:
    sequences = str | bytes | list | tuple
    seq, n = (a, b) if isinstance(a, sequences) else (b, a) if isinstance(b, sequences) else (None, None)
    if isinstance(n, int) and seq is not None and len(seq) * n > LARGEST:
        raise ValueError("a repetition too large to judge")
    return operator.mul(a, b)


def _number(x: Any) -> Any:
    if not isinstance(x, int | float | complex):
        raise TypeError("sum's start is a number")
    return x


def _small(n: Any) -> Any:
    if isinstance(n, int) and n > 10_000:
        raise ValueError("too large to judge")
    return n


def _hashed(items: Any = (), pairs: bool = False) -> list:
    """`items` as a list, refused when many share one hash: a set or dict of n items of one hash takes
    n**2 steps to build (integers k * (2**61 - 1) all hash to 0), holding the host's GIL."""
    _check_size(items)
    items = list(items.items() if isinstance(items, dict) else items)
    _check_size(items)
    keyed = sorted(((hash(k[0] if pairs else k), i) for i, k in enumerate(items)), key=lambda hk: hk[0])
    start = 0
    while start < len(keyed):  # runs of one hash, found by sorting (hashing them is the n**2)
        end = start
        while end < len(keyed) and keyed[end][0] == keyed[start][0]:
            end += 1
        distinct: list = []  # equal items are cheap to a set; only distinct ones of one hash cost
        for _, i in keyed[start:end]:
            key = items[i][0] if pairs else items[i]
            if not any(key == d for d in distinct):
                distinct.append(key)
                if len(distinct) > SAME_HASH:
                    raise ValueError("too many items of one hash to judge")
        start = end
    return items


def _bounded_mod(a: Any, b: Any) -> Any:
    if isinstance(a, str | bytes):
        raise TypeError("string formatting is not judged")
    return a % b


def _bounded_pow(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int) and b > 0 and a.bit_length() * b > 32 * LARGEST:
        raise ValueError("a power too large to judge")
    return a**b


@dataclass(frozen=True)
class Check:
    """One test: its source, and its host-side tree in which each probe is `ast.Name("__probe_<i>")`."""

    source: str
    tree: ast.expr


@dataclass(frozen=True)
class ProbeError:
    """A probe raised (its exception's type name), the solution did before the probes ran, or the
    reported value is not plain data the host can read."""

    name: str


UNREADABLE = ProbeError("unreadable")


def compile_checks(tests: Sequence[str]) -> tuple[list[Check], list[str]]:
    """The checks and the probes (expression sources, numbered across all tests)."""
    probes: list[str] = []
    checks = []
    for test in tests:
        if not isinstance(test, str):
            raise ValueError(f"run_tests: a test is an expression string, got {test!r}")
        try:
            tree = ast.parse(test, mode="eval").body
        except SyntaxError as err:
            raise ValueError(f"run_tests: test {test!r} is not a Python expression: {err.msg}") from err
        tree = _Split(test, probes).visit(tree)
        if not any(isinstance(n, ast.Name) and n.id.startswith("__probe_") for n in ast.walk(tree)):
            raise ValueError(f"run_tests: test {test!r} does not call the solution")
        checks.append(Check(test, tree))
    return checks, probes


class _Split(ast.NodeTransformer):
    """Keeps what the host can evaluate and replaces each other part by a probe."""

    def __init__(self, test: str, probes: list[str]) -> None:
        self.test, self.probes = test, probes

    def visit(self, node: ast.AST) -> Any:
        if not isinstance(node, ast.expr):
            return self.generic_visit(node)
        if _host_node(node):
            if isinstance(node, ast.Name | ast.Attribute):  # a type, or a constant of math's
                return node
            if isinstance(node, ast.Call):  # the function is the host's: only its arguments are visited
                node.args = [self.visit(a) for a in node.args]
                for k in node.keywords:
                    k.value = self.visit(k.value)
                return node
            return self.generic_visit(node)
        for inner in ast.walk(node):
            if isinstance(inner, INSIDE_ONLY):
                raise ValueError(
                    f"run_tests: test {self.test!r} would run `{ast.unparse(inner)}` beside the solution, "
                    "which could make it true: compare outside the solution's calls, one test per case"
                )
        root = _root(node)
        if root is None or root in RESERVED:
            what = f"Python's own `{root}`" if root else "no call of the solution's"
            raise ValueError(
                f"run_tests: test {self.test!r} uses `{ast.unparse(node)}`, which names {what}: the host "
                "does not evaluate it and the solution could answer for it; compute that value in the test"
            )
        self.probes.append(ast.unparse(node))  # each in its place: a solution's calls may keep state
        return ast.copy_location(ast.Name(f"__probe_{len(self.probes) - 1}", ast.Load()), node)


def _root(node: ast.expr) -> str | None:
    """The name a probe calls first (`f` of `f(2)`, `Solution` of `Solution().run(1)[0]`); None when it
    does not start with a call of a name (`EXPECTED`, `ref[0]`: a name the solution could define)."""
    while isinstance(node, ast.Attribute | ast.Subscript) or (
        isinstance(node, ast.Call) and not isinstance(node.func, ast.Name)
    ):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None


def _host_node(node: ast.expr) -> bool:
    """Whether the host evaluates `node` itself (its children are visited on their own)."""
    if isinstance(node, ast.Dict):
        return None not in node.keys  # `{**x}` unpacks: not the host's
    if isinstance(node, ast.Constant | ast.List | ast.Tuple | ast.Set | ast.Slice):
        return not any(isinstance(e, ast.Starred) for e in getattr(node, "elts", ()))
    if isinstance(node, ast.UnaryOp | ast.BoolOp | ast.Compare | ast.IfExp | ast.Subscript):
        return True
    if isinstance(node, ast.BinOp):
        return type(node.op) in BINARY
    if isinstance(node, ast.Name):
        return node.id in TYPES
    if isinstance(node, ast.Attribute):
        return isinstance(node.value, ast.Name) and node.value.id == "math" and node.attr in MATH_CONSTANTS
    if isinstance(node, ast.Call):
        name = _function_name(node.func)
        allowed = KEYWORDS.get(name or "", set())
        return name is not None and all(k.arg in allowed for k in node.keywords)
    return False


def _function_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name) and func.id in FUNCTIONS:
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "math":
        return func.attr if func.attr in MATH else None
    return None


def judge(check: Check, values: Sequence[Any]) -> bool:
    """The check's verdict on the probes' values (plain data, or a `ProbeError`). A check with a probe
    that raised or reported something unreadable fails, as a test that raises does; so does one whose
    host-side evaluation raises (plain data of mismatched types, `1 < "a"`)."""
    used = [
        int(n.id.removeprefix("__probe_"))
        for n in ast.walk(check.tree)
        if isinstance(n, ast.Name) and n.id.startswith("__probe_")
    ]
    if any(isinstance(values[i], ProbeError) for i in used):
        return False
    try:
        return bool(_evaluate(check.tree, values))
    except (ArithmeticError, LookupError, TypeError, ValueError, RecursionError, MemoryError):
        return False  # plain data the test's operations do not apply to: a failed test


def _evaluate(node: ast.expr, values: Sequence[Any]) -> Any:
    def ev(n: ast.expr) -> Any:
        return _evaluate(n, values)

    if isinstance(node, ast.Name):
        return (
            values[int(node.id.removeprefix("__probe_"))]
            if node.id.startswith("__probe_")
            else TYPES[node.id]
        )
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List | ast.Tuple):
        return (list if isinstance(node, ast.List) else tuple)(ev(e) for e in node.elts)
    if isinstance(node, ast.Set):
        return set(_hashed([ev(e) for e in node.elts]))
    if isinstance(node, ast.Dict):
        pairs = [(ev(k), ev(v)) for k, v in zip(node.keys, node.values, strict=True)]  # type: ignore[arg-type]
        return dict(_hashed(pairs, pairs=True))
    if isinstance(node, ast.UnaryOp):
        return UNARY[type(node.op)](ev(node.operand))
    if isinstance(node, ast.BinOp):
        return BINARY[type(node.op)](ev(node.left), ev(node.right))
    if isinstance(node, ast.BoolOp):
        result = None
        for v in node.values:  # Python's short-circuit: `and` stops at a false value, `or` at a true one
            result = ev(v)
            if bool(result) == isinstance(node.op, ast.Or):
                return result
        return result
    if isinstance(node, ast.Compare):
        left = ev(node.left)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = ev(right_node)
            if not COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return ev(node.body) if ev(node.test) else ev(node.orelse)
    if isinstance(node, ast.Subscript):
        return ev(node.value)[ev(node.slice)]
    if isinstance(node, ast.Slice):
        return slice(*(ev(p) if p is not None else None for p in (node.lower, node.upper, node.step)))
    if isinstance(node, ast.Attribute):
        return MATH_CONSTANTS[node.attr]
    if isinstance(node, ast.Call):
        name = _function_name(node.func)
        function = MATH[name] if isinstance(node.func, ast.Attribute) else FUNCTIONS[name]  # type: ignore[index]
        args = [ev(a) for a in node.args]
        if name in ("list", "tuple", "sorted", "sum", "str", "max", "min", "all", "any") and args:
            _check_size(args[0])
        return function(*args, **{k.arg: ev(k.value) for k in node.keywords})  # type: ignore[misc]
    raise TypeError(f"not judged on the host: {ast.unparse(node)}")


def _check_size(value: Any) -> None:
    if isinstance(value, str | bytes | list | tuple | set | dict | range) and len(value) > LARGEST:
        raise ValueError("too large to judge")


def decode(value: Any, depth: int = 0) -> Any:
    """A probe's value as the harness encoded it (JSON, with tuples, sets, dicts, bytes and complex
    numbers tagged), back as plain data; `UNREADABLE` for anything else."""
    if depth > 64:
        return UNREADABLE
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        items = [decode(v, depth + 1) for v in value]
        return UNREADABLE if any(isinstance(v, ProbeError) for v in items) else items
    if not (isinstance(value, dict) and len(value) == 1):
        return UNREADABLE
    ((tag, body),) = value.items()
    if tag in ("tuple", "set", "frozenset", "dict", "complex") and not isinstance(body, list):
        return UNREADABLE
    try:
        if tag == "bytes":
            return bytes.fromhex(body) if isinstance(body, str) else UNREADABLE
        if tag == "complex":
            return complex(*body)
        items = [decode(v, depth + 1) for v in body]
        if any(isinstance(v, ProbeError) for v in items):
            return UNREADABLE
        if tag == "tuple":
            return tuple(items)
        if tag == "set":
            return set(_hashed(items))
        if tag == "frozenset":
            return frozenset(_hashed(items))
        if tag == "dict":
            return dict(_hashed([tuple(kv) for kv in items], pairs=True))
    except (TypeError, ValueError):
        pass
    return UNREADABLE
